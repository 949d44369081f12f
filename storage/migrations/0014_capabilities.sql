-- turnkeeper schema version 14: a session's runtime capability state (session seed
-- SessionCapabilities) and its transitions (SessionCapabilityEvent), each event
-- numbered per session from a counter row (event_cursors: one per session and
-- stream of events) locked by the writing transaction, so a reader's cursor (seq)
-- follows commit order and never skips an event committed late.

CREATE TABLE session_capabilities (
    session_id    VARCHAR PRIMARY KEY,
    mode          VARCHAR NOT NULL,
    display_mode  VARCHAR NOT NULL,
    delegate_mode BOOLEAN NOT NULL,
    multi_agent   BOOLEAN NOT NULL,
    workflows     BOOLEAN NOT NULL,
    web_search    BOOLEAN NOT NULL,
    browser       BOOLEAN NOT NULL,
    a2a_master    BOOLEAN NOT NULL,
    updated_at    TIMESTAMPTZ NOT NULL
);

CREATE TABLE event_cursors (
    session_id VARCHAR NOT NULL,
    stream     VARCHAR NOT NULL,
    seq        BIGINT NOT NULL CHECK (seq >= 1),
    PRIMARY KEY (session_id, stream)
);

CREATE TABLE capability_events (
    id         VARCHAR PRIMARY KEY,
    session_id VARCHAR NOT NULL,
    seq        BIGINT NOT NULL CHECK (seq >= 1),
    run_id     VARCHAR NOT NULL,
    event_type VARCHAR NOT NULL,
    source     VARCHAR NOT NULL,
    actor      VARCHAR NOT NULL,
    capability VARCHAR NOT NULL,
    old_value  VARCHAR NOT NULL,
    new_value  VARCHAR NOT NULL,
    happened_at TIMESTAMPTZ NOT NULL,
    data       VARCHAR,
    UNIQUE (session_id, seq)
);
