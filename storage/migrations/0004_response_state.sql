-- turnkeeper schema version 4: response lineage per session, advanced by compare-and-swap.

CREATE TABLE response_states (
    session_id           VARCHAR PRIMARY KEY,
    state_mode           VARCHAR NOT NULL,
    previous_response_id VARCHAR NOT NULL,
    conversation_id      VARCHAR NOT NULL,
    provider             VARCHAR NOT NULL,
    api                  VARCHAR NOT NULL,
    model                VARCHAR NOT NULL,
    version              BIGINT NOT NULL CHECK (version >= 1),
    updated_at           TIMESTAMPTZ NOT NULL
);
