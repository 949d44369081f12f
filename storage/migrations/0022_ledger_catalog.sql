-- turnkeeper schema version 22 (issue 19, the ledger's catalog: sessionstore Catalog).
-- One derived summary per (tenant, session), folded from the session's ledger after
-- each append and rebuilt from it on demand (repair); never the source of truth.
-- ``meta`` is the SessionMeta as JSON text (not jsonb: a malformed or duplicated member
-- must reach the decoder, which refuses it, rather than be normalised by the engine).
-- ``revision`` is the compare-and-set token: every write is
-- ``UPDATE … WHERE revision = <the revision read>`` (or an insert that a concurrent
-- insert makes fail), so two updaters never overwrite each other's fold.

CREATE TABLE ledger_catalog (
    tenant      VARCHAR NOT NULL DEFAULT '',
    session_id  VARCHAR NOT NULL,
    revision    BIGINT NOT NULL CHECK (revision >= 1),
    meta        VARCHAR NOT NULL,
    updated_at  TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (tenant, session_id)
);
