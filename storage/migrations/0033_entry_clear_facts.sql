-- turnkeeper schema version 33 (issue 23, "what stays clear"): what analytics reads of an
-- entry's payload, kept beside it in columns that encryption at rest never seals, so that
-- `turnkeeper report` reads no payload (spec/clear_facts.py):
--
--   role      a message's role (payload message.role)
--   provider  an assistant message's message.provider; a model_change entry's provider
--   model     an assistant message's message.model; a model_change entry's modelId
--             (model where modelId is absent or null)
--
-- Each is text or NULL: NULL where the field is absent, JSON null or not a JSON string, and
-- for every other kind of entry; at most 200 characters, a longer value cut to 199 followed
-- by U+2026. Every write gives them from the decoded payload (spec/clear_facts.py's
-- clear_facts); each dialect's addition to this version fills the rows already stored with
-- the same rule in its own SQL (model_tests/encryption/test_clear_facts.py holds the three equal).
-- On PostgreSQL the columns are added without a default (no table rewrite); the backfill
-- rewrites the message and model_change rows once, in the migration's transaction.
-- IF NOT EXISTS: the tests that hold a store at an older version while this turnkeeper
-- writes into it (model_tests/older_stores.py, written_by_now) add the columns its inserts name.

ALTER TABLE entries ADD COLUMN IF NOT EXISTS role VARCHAR;
ALTER TABLE entries ADD COLUMN IF NOT EXISTS provider VARCHAR;
ALTER TABLE entries ADD COLUMN IF NOT EXISTS model VARCHAR;
