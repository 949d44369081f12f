-- turnkeeper schema version 3: orphan-run recovery records and their events.
-- States in the CHECK constraint are the spec's stored states (a test compares them).

CREATE TABLE run_recoveries (
    run_id               VARCHAR PRIMARY KEY,
    session_id           VARCHAR NOT NULL,
    state                VARCHAR NOT NULL CHECK (state IN ('recovering', 'completed', 'failed',
                             'dead_lettered', 'detached')),
    trigger_source       VARCHAR NOT NULL,
    reason               VARCHAR NOT NULL,
    attempt              INTEGER NOT NULL CHECK (attempt >= 1),
    lease_epoch          BIGINT NOT NULL,
    previous_lease_epoch BIGINT,
    last_error           VARCHAR,
    next_retry_at        TIMESTAMPTZ,
    started_at           TIMESTAMPTZ NOT NULL,
    updated_at           TIMESTAMPTZ NOT NULL,
    completed_at         TIMESTAMPTZ
);

CREATE TABLE recovery_events (
    run_id      VARCHAR NOT NULL,
    attempt     INTEGER NOT NULL,
    edge        VARCHAR NOT NULL,
    trigger     VARCHAR NOT NULL,
    source      VARCHAR NOT NULL,
    dest        VARCHAR NOT NULL,
    lease_epoch BIGINT NOT NULL,
    occurred_at TIMESTAMPTZ NOT NULL
);
