-- turnkeeper schema version 32 (issue 23, "encryption at rest", part 1): each session's
-- data key, wrapped by the key provider's master key, and the marker of an encrypted store
-- (storage/crypto/keyring.py).
--
-- session_keys: one row per data key version of a session; wrapped is
-- provider.wrap(data key, wrap_context(session_id, version)) and key_id names the master
-- key that wrapped it. A session's delete removes its rows in the delete's transaction
-- (crypto-shredding: its payloads, in any copy, can no longer be opened once every master
-- key that wrapped them is retired).
--
-- store_encryption: one row (id 1) once the store was first opened with encryption=, so a
-- later open without a provider refuses what it cannot do instead of writing clear
-- payloads into an encrypted store.
--
-- No backfill: a store without a provider stays as it was.

CREATE TABLE session_keys (
    session_id VARCHAR NOT NULL,
    version    BIGINT NOT NULL,
    key_id     VARCHAR NOT NULL,
    wrapped    BYTEA NOT NULL,
    created_at TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (session_id, version)
);

CREATE TABLE store_encryption (
    id         INTEGER PRIMARY KEY CHECK (id = 1),
    key_id     VARCHAR NOT NULL,
    enabled_at TIMESTAMPTZ NOT NULL
);
