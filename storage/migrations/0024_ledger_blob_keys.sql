-- turnkeeper schema version 24 (issue 19, attack finding F4): a blob's tenant is a
-- column of its own. Version 23 filed a blob under the session id it parsed from its
-- key (``[tenants/<tenant>/]sessions/<id>/<sha256>``, the text after the key's first
-- ``sessions/``), so a blob of tenant ``user-sessions`` was filed under session
-- ``sessions/s1``: a delete of ``s1`` left it, a delete of ``sessions/s1`` took it.
-- Keys are now ``blobs/t=<tenant>/s=<session>/<sha256>``, each id escaped
-- (storage/ops/ledger/blobs.py blob_prefix), and the tenant and session id are stored
-- as they were given, decoded exactly from the key.
--
-- The blobs already stored keep their keys (their pointer records name them, and
-- those records are hashed: replay reads them as before). Their tenant and session id
-- are read again from the key: a key of the default tenant (``sessions/<id>/…``) held
-- the right session id already; for ``tenants/<tenant>/sessions/<id>/<sha256>`` the
-- tenant is the text before the first ``/sessions/`` after ``tenants/``, the session
-- the rest but the digest. That is exact unless a tenant itself holds ``/sessions/``
-- (such a key is ambiguous: two pairs made it).

ALTER TABLE ledger_blobs ADD COLUMN tenant VARCHAR NOT NULL DEFAULT '';

UPDATE ledger_blobs
SET tenant = substr(substr(key, 9), 1, strpos(substr(key, 9), '/sessions/') - 1),
    session_id = substr(
        substr(key, 9),
        strpos(substr(key, 9), '/sessions/') + 10,
        length(substr(key, 9)) - strpos(substr(key, 9), '/sessions/') - 9 - 65
    )
WHERE key LIKE 'tenants/%' AND strpos(substr(key, 9), '/sessions/') > 0;
