-- turnkeeper schema version 7: session forks, one per fork request id.
-- The primary key is the sha256 digest of the request id (the id itself is not
-- stored, as with submission keys), so the schema holds "one fork per request
-- id" across all sessions. request_fingerprint is the sha256 of the request as
-- given (source session, kind, named boundary, chosen fork session id): the same
-- id with the same fingerprint returns this fork, another fingerprint conflicts.

CREATE TABLE session_forks (
    request_digest      VARCHAR PRIMARY KEY,
    request_fingerprint VARCHAR NOT NULL,
    source_session_id   VARCHAR NOT NULL,
    fork_session_id     VARCHAR NOT NULL UNIQUE,
    kind                VARCHAR NOT NULL CHECK (kind IN ('session', 'message')),
    boundary_turn_id    VARCHAR NOT NULL,
    boundary_entry_id   VARCHAR NOT NULL,
    boundary_seq        BIGINT NOT NULL CHECK (boundary_seq >= 1),
    leaf_id             VARCHAR NOT NULL,
    entries_copied      BIGINT NOT NULL CHECK (entries_copied >= 1),
    lease_epoch         BIGINT,
    created_at          TIMESTAMPTZ NOT NULL
);
