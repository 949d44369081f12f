-- turnkeeper schema version 2: execution intents, runs, run events, submissions,
-- conversation turns. Run statuses are the spec's stored states (a test compares them).

CREATE TABLE execution_intents (
    id                  VARCHAR PRIMARY KEY,
    session_id          VARCHAR NOT NULL,
    source              VARCHAR NOT NULL,
    model               VARCHAR NOT NULL,
    mode                VARCHAR NOT NULL,
    work_dir            VARCHAR NOT NULL,
    request_fingerprint VARCHAR NOT NULL,
    request             VARCHAR NOT NULL,
    policy              VARCHAR NOT NULL,
    created_at          TIMESTAMPTZ NOT NULL
);

CREATE TABLE runs (
    id               VARCHAR PRIMARY KEY,
    session_id       VARCHAR NOT NULL,
    intent_id        VARCHAR NOT NULL,
    retry_of         VARCHAR,
    attempt          INTEGER NOT NULL CHECK (attempt >= 1),
    status           VARCHAR NOT NULL CHECK (status IN ('admitted', 'running', 'waiting',
                         'succeeded', 'failed', 'cancelled', 'interrupted', 'abandoned')),
    cancel_requested BOOLEAN NOT NULL,
    error            VARCHAR,
    lease_epoch      BIGINT,
    started_at       TIMESTAMPTZ NOT NULL,
    updated_at       TIMESTAMPTZ NOT NULL,
    finished_at      TIMESTAMPTZ,
    UNIQUE (intent_id, attempt)
);

-- At most one non-terminal run per session, held by the primary key.
CREATE TABLE active_runs (
    session_id VARCHAR PRIMARY KEY,
    run_id     VARCHAR NOT NULL
);

-- Run lifecycle events with a per-session sequence cursor (history is data).
CREATE TABLE run_events (
    session_id  VARCHAR NOT NULL,
    seq         BIGINT NOT NULL,
    id          VARCHAR NOT NULL UNIQUE,
    run_id      VARCHAR NOT NULL,
    edge        VARCHAR NOT NULL,
    trigger     VARCHAR NOT NULL,
    source      VARCHAR NOT NULL,
    dest        VARCHAR NOT NULL,
    data        VARCHAR NOT NULL,
    occurred_at TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (session_id, seq)
);

-- Admission idempotency: only a digest of the submission key is stored.
CREATE TABLE submissions (
    session_id          VARCHAR NOT NULL,
    key_digest          VARCHAR NOT NULL,
    request_fingerprint VARCHAR NOT NULL,
    intent_id           VARCHAR NOT NULL,
    run_id              VARCHAR NOT NULL,
    created_at          TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (session_id, key_digest)
);

-- Conversation turn boundaries (fork resolution and recovery; not replayed).
CREATE TABLE conversation_turns (
    id          VARCHAR PRIMARY KEY,
    session_id  VARCHAR NOT NULL,
    intent_id   VARCHAR NOT NULL,
    run_id      VARCHAR NOT NULL,
    attempt     INTEGER NOT NULL,
    status      VARCHAR NOT NULL,
    start_seq   BIGINT NOT NULL,
    end_seq     BIGINT,
    started_at  TIMESTAMPTZ NOT NULL,
    ended_at    TIMESTAMPTZ
);
