-- turnkeeper schema version 15: guidance queued for a session's runtime (session
-- seed ESMGuidance: pending until consumed) and the lifecycle events of the input
-- resources a runtime materializes (InputResourceEvent), numbered per session from
-- the session's event_cursors row (stream 'resource'), in commit order.

CREATE TABLE esm_guidance (
    id                VARCHAR PRIMARY KEY,
    session_id        VARCHAR NOT NULL,
    objective_version VARCHAR NOT NULL,
    guidance          VARCHAR NOT NULL,
    status            VARCHAR NOT NULL CHECK (status IN ('pending', 'consumed')),
    created_at        TIMESTAMPTZ NOT NULL,
    consumed_at       TIMESTAMPTZ
);
CREATE INDEX esm_guidance_by_session ON esm_guidance (session_id);

CREATE TABLE input_resource_events (
    id          VARCHAR PRIMARY KEY,
    session_id  VARCHAR NOT NULL,
    seq         BIGINT NOT NULL CHECK (seq >= 1),
    resource_id VARCHAR NOT NULL,
    run_id      VARCHAR NOT NULL,
    event_type  VARCHAR NOT NULL,
    status      VARCHAR NOT NULL,
    happened_at TIMESTAMPTZ NOT NULL,
    data        VARCHAR,
    UNIQUE (session_id, seq)
);
