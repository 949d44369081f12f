-- turnkeeper schema version 19 (issue 18, response archives; written as 0020 in the
-- plan, numbered 19 here until the other version 19 lands: the lead renumbers it at
-- merge): the durable records of a session's Responses API work (session seed
-- ResponseRun, ResponseTurn, ResponseItemArchive). Each row is keyed by the caller's
-- local ids within its session, so a save is an upsert and a retry after an unknown
-- commit writes the same row again; ``id`` is the row's number within its session
-- and table, taken from the session's event_cursors row of the stream
-- ('response_run', 'response_turn', 'response_item') when the row is first written,
-- so numbers follow commit order. JSON values are stored as text.

CREATE TABLE response_runs (
    session_id          VARCHAR NOT NULL,
    local_run_id        VARCHAR NOT NULL,
    id                  BIGINT NOT NULL CHECK (id >= 1),
    local_turn_id       VARCHAR NOT NULL,
    message_id          BIGINT,
    response_id         VARCHAR NOT NULL,
    provider            VARCHAR NOT NULL,
    api                 VARCHAR NOT NULL,
    state               VARCHAR NOT NULL,
    polling_url         VARCHAR NOT NULL,
    last_event_sequence BIGINT,
    cancel_requested    BOOLEAN NOT NULL,
    created_at          TIMESTAMPTZ NOT NULL,
    updated_at          TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (session_id, local_run_id)
);

CREATE TABLE response_turns (
    session_id           VARCHAR NOT NULL,
    local_turn_id        VARCHAR NOT NULL,
    id                   BIGINT NOT NULL CHECK (id >= 1),
    message_id           BIGINT,
    request_id           VARCHAR NOT NULL,
    response_id          VARCHAR NOT NULL,
    previous_response_id VARCHAR NOT NULL,
    conversation_id      VARCHAR NOT NULL,
    provider             VARCHAR NOT NULL,
    api                  VARCHAR NOT NULL,
    model                VARCHAR NOT NULL,
    state_mode           VARCHAR NOT NULL,
    status               VARCHAR NOT NULL,
    incomplete_reason    VARCHAR NOT NULL,
    request_summary      VARCHAR,
    response_summary     VARCHAR,
    created_at           TIMESTAMPTZ NOT NULL,
    completed_at         TIMESTAMPTZ,
    PRIMARY KEY (session_id, local_turn_id)
);

CREATE TABLE response_items (
    session_id    VARCHAR NOT NULL,
    local_turn_id VARCHAR NOT NULL,
    item_key      VARCHAR NOT NULL,
    id            BIGINT NOT NULL CHECK (id >= 1),
    response_id   VARCHAR NOT NULL,
    item_id       VARCHAR NOT NULL,
    output_index  BIGINT NOT NULL CHECK (output_index >= 0),
    item_type     VARCHAR NOT NULL,
    item_status   VARCHAR NOT NULL,
    sanitized     VARCHAR NOT NULL,
    created_at    TIMESTAMPTZ NOT NULL,
    updated_at    TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (session_id, local_turn_id, item_key)
);
