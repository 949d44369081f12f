-- turnkeeper schema version 1: leases, thread records, sessions and entries.
-- States in CHECK constraints are the spec's stored states (a test compares them).

CREATE TABLE leases (
    target        VARCHAR PRIMARY KEY,
    owner         VARCHAR NOT NULL,
    token_digest  VARCHAR NOT NULL,
    epoch         BIGINT NOT NULL CHECK (epoch >= 1),
    purpose       VARCHAR NOT NULL,
    state         VARCHAR NOT NULL CHECK (state IN ('held', 'released')),
    acquired_at   TIMESTAMPTZ NOT NULL,
    renewed_at    TIMESTAMPTZ NOT NULL,
    expires_at    TIMESTAMPTZ NOT NULL,
    fenced_writes BIGINT NOT NULL DEFAULT 0
);

-- One row per applied lease transition (history is data).
CREATE TABLE lease_events (
    target         VARCHAR NOT NULL,
    epoch          BIGINT NOT NULL,
    owner          VARCHAR NOT NULL,
    purpose        VARCHAR NOT NULL,
    edge           VARCHAR NOT NULL,
    trigger        VARCHAR NOT NULL,
    source         VARCHAR NOT NULL,
    dest           VARCHAR NOT NULL,
    previous_owner VARCHAR,
    expires_at     TIMESTAMPTZ NOT NULL,
    occurred_at    TIMESTAMPTZ NOT NULL
);

-- One row per write refused by a fence (lease lost): the analytics of stale writers.
CREATE TABLE fence_events (
    target    VARCHAR NOT NULL,
    owner     VARCHAR NOT NULL,
    epoch     BIGINT NOT NULL,
    operation VARCHAR NOT NULL,
    occurred_at TIMESTAMPTZ NOT NULL
);

CREATE TABLE thread_records (
    id                        VARCHAR PRIMARY KEY,
    key                       VARCHAR NOT NULL,
    status                    VARCHAR NOT NULL CHECK (status IN ('active', 'archived')),
    driver_type               VARCHAR NOT NULL,
    agent                     VARCHAR NOT NULL,
    fingerprint               VARCHAR NOT NULL,
    compatibility_fingerprint VARCHAR NOT NULL,
    session_codec             VARCHAR NOT NULL,
    state                     VARCHAR NOT NULL,
    created_at                TIMESTAMPTZ NOT NULL,
    updated_at                TIMESTAMPTZ NOT NULL
);

-- At most one active record per key, held by the primary key.
CREATE TABLE active_thread_keys (
    key       VARCHAR PRIMARY KEY,
    record_id VARCHAR NOT NULL
);

CREATE TABLE thread_record_events (
    record_id VARCHAR NOT NULL,
    key       VARCHAR NOT NULL,
    edge      VARCHAR NOT NULL,
    trigger   VARCHAR NOT NULL,
    source    VARCHAR NOT NULL,
    dest      VARCHAR NOT NULL,
    occurred_at TIMESTAMPTZ NOT NULL
);

CREATE TABLE sessions (
    id          VARCHAR PRIMARY KEY,
    cwd         VARCHAR NOT NULL,
    created_at  TIMESTAMPTZ NOT NULL,
    updated_at  TIMESTAMPTZ NOT NULL,
    leaf_id     VARCHAR,
    title       VARCHAR,
    entry_count BIGINT NOT NULL,
    next_seq    BIGINT NOT NULL,
    header      VARCHAR NOT NULL
);

CREATE TABLE entries (
    session_id  VARCHAR NOT NULL,
    id          VARCHAR NOT NULL,
    parent_id   VARCHAR,
    kind        VARCHAR NOT NULL,
    seq         BIGINT NOT NULL,
    ts          TIMESTAMPTZ NOT NULL,
    payload     VARCHAR NOT NULL,
    lease_epoch BIGINT,
    written_at  TIMESTAMPTZ NOT NULL,  -- the store's clock at the write (ts is the entry's own)
    PRIMARY KEY (session_id, id),
    UNIQUE (session_id, seq)
);

-- Lines of imported files that could not be parsed: kept, outside the tree.
CREATE TABLE opaque_records (
    session_id VARCHAR NOT NULL,
    source     VARCHAR NOT NULL,
    line       BIGINT NOT NULL,
    raw        VARCHAR NOT NULL,
    reason     VARCHAR NOT NULL,
    PRIMARY KEY (session_id, line)
);
