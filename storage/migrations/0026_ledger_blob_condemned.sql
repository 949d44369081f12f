-- turnkeeper schema version 26 (issue 19, attack finding F6: ledger GC's condemned blobs).
-- Ledger GC marks each blob it is about to delete here, in a transaction fenced by its
-- lease epoch, then deletes the blobs' bodies (storage/ops/ledger/condemn.py). An append
-- whose blob pointer names a marked key is refused in its own fenced transaction and its
-- writer writes the blob again under a new name, so no acknowledged pointer names a blob
-- GC deletes, whichever of the two commits first. A mark is permanent (a tombstone: a
-- writer's put may precede GC's delete by any time), one row per blob GC reclaimed.
-- ``key`` is the blob's key (``blobs/t=<tenant>/s=<session id>/<sha256 hex>``, escaped;
-- a blob written before schema 24: ``[tenants/<tenant>/]sessions/<session id>/<sha256 hex>``),
-- ``gc_id`` the GC pass that first marked it, ``epoch`` the lease epoch that pass ran
-- under, ``condemned_at`` when. A session delete removes its session's marks.

CREATE TABLE ledger_blob_condemned (
    key           VARCHAR PRIMARY KEY,
    gc_id         VARCHAR NOT NULL,
    tenant        VARCHAR NOT NULL,
    session_id    VARCHAR NOT NULL,
    epoch         BIGINT NOT NULL,
    condemned_at  TIMESTAMPTZ NOT NULL
);
