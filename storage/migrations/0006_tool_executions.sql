-- turnkeeper schema version 6: tool-execution records (DESIGN machine 5).
-- One record per execution key (the local deduplication authority); only a digest
-- of the call's arguments is stored (the arguments live in the transcript).
-- States in the CHECK constraint are the spec's stored states (a test compares them).

CREATE TABLE tool_executions (
    execution_key     VARCHAR PRIMARY KEY,
    session_id        VARCHAR NOT NULL,
    run_id            VARCHAR,
    local_turn_id     VARCHAR NOT NULL,
    provider          VARCHAR NOT NULL,
    api               VARCHAR NOT NULL,
    response_id       VARCHAR NOT NULL,
    provider_call_id  VARCHAR NOT NULL,
    tool_kind         VARCHAR NOT NULL,
    tool_name         VARCHAR NOT NULL,
    args_digest       VARCHAR NOT NULL,
    side_effecting    BOOLEAN NOT NULL,
    state             VARCHAR NOT NULL CHECK (state IN ('running', 'completed', 'interrupted',
                          'retry_requested', 'abandoned')),
    result            VARCHAR,          -- JSON, set at completion
    is_error          BOOLEAN NOT NULL,
    provider_metadata VARCHAR NOT NULL, -- JSON
    reason            VARCHAR,          -- why it was interrupted or abandoned
    attempt           INTEGER NOT NULL CHECK (attempt >= 1),
    lease_epoch       BIGINT,
    created_at        TIMESTAMPTZ NOT NULL,
    updated_at        TIMESTAMPTZ NOT NULL,
    completed_at      TIMESTAMPTZ
);

-- One row per applied transition (history is data).
CREATE TABLE tool_execution_events (
    execution_key VARCHAR NOT NULL,
    session_id    VARCHAR NOT NULL,
    attempt       INTEGER NOT NULL,
    edge          VARCHAR NOT NULL,
    trigger       VARCHAR NOT NULL,
    source        VARCHAR NOT NULL,
    dest          VARCHAR NOT NULL,
    lease_epoch   BIGINT,
    occurred_at   TIMESTAMPTZ NOT NULL
);
