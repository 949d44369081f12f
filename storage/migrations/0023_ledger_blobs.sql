-- turnkeeper schema version 22 (issue 19, the ledger's blob offload).
-- A ledger payload over the offload threshold is stored as a blob named by its sha256
-- (content-addressed), and the ledger holds a pointer record (kind 'blobptr') in its
-- place; both carry the record's idempotency id. This table is the default blob store
-- (storage/ops/ledger/blobs.py DatabaseBlobs), so an embedded user needs nothing else:
-- ``key`` is the blob's key (``[tenants/<tenant>/]sessions/<session id>/<sha256 hex>``),
-- ``session_id`` the session it belongs to (a session delete removes its blobs),
-- ``data`` the blob's bytes exactly (BYTEA: BLOB on DuckDB), ``size`` their length.
-- A blob written whose pointer append then failed is an orphan: ledger GC reclaims it.

CREATE TABLE ledger_blobs (
    key         VARCHAR PRIMARY KEY,
    session_id  VARCHAR NOT NULL,
    data        BYTEA NOT NULL,
    size        BIGINT NOT NULL CHECK (size >= 0),
    written_at  TIMESTAMPTZ NOT NULL
);
