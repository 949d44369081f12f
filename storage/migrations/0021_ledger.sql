-- turnkeeper schema version 21 (issue 19, the ledger: the sessionstore seed's journal).
-- A session's ledger is an append-only journal with a 1-based, gapless sequence per
-- (tenant, session): ledger_records holds the records, the primary key makes a second
-- record at a sequence impossible, and the unique idempotency key makes a second
-- record under one idempotency id impossible. ``payload`` is bytes, stored exactly
-- (BYTEA: BLOB on DuckDB): the ledger holds the caller's framing unchanged, so a
-- payload's sha256 (``payload_sha256``, hex, checked by replay) is over the very bytes
-- written, and a duplicate delivery is compared byte for byte; JSON text would be
-- re-encoded by the engines (PostgreSQL's jsonb reorders keys) and holds no raw bytes.
-- ``epoch`` is the lease epoch of the writer that appended the record; a writer's first
-- record is its fence record (kind 'fence'). ledger_tips holds, per ledger, its tip
-- (the last sequence, which replay must reach: a lost tail fails closed) and the epoch
-- of its newest fence; a writer's open compares and sets it, and every append moves it.
-- ``tenant`` is the tenant the store was opened for (sessionstore WithTenant; '' by
-- default): a reader for another tenant sees none of the records.

CREATE TABLE ledger_records (
    tenant          VARCHAR NOT NULL DEFAULT '',
    session_id      VARCHAR NOT NULL,
    seq             BIGINT NOT NULL CHECK (seq >= 1),
    kind            VARCHAR NOT NULL,
    idempotency_id  VARCHAR NOT NULL,
    payload         BYTEA NOT NULL,
    payload_sha256  VARCHAR NOT NULL,
    epoch           BIGINT NOT NULL CHECK (epoch >= 1),
    written_at      TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (tenant, session_id, seq),
    UNIQUE (tenant, session_id, idempotency_id)
);

CREATE TABLE ledger_tips (
    tenant      VARCHAR NOT NULL DEFAULT '',
    session_id  VARCHAR NOT NULL,
    seq         BIGINT NOT NULL CHECK (seq >= 1),
    epoch       BIGINT NOT NULL CHECK (epoch >= 1),
    PRIMARY KEY (tenant, session_id)
);
