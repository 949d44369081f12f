-- PostgreSQL's additions to schema version 8 (run after storage/migrations/0008_unleased_checks.sql).

-- The role store.query() reads as: SELECT on this schema's tables and nothing
-- else, so an analytics query cannot reach server files, other schemas or
-- programs even when the store's own user is a superuser. Created only where
-- the store's user may create roles; without it query() falls back to its
-- other defences (storage/postgres/query.py).
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'turnkeeper_reader') THEN
        CREATE ROLE turnkeeper_reader NOLOGIN;
    END IF;
    EXECUTE format('GRANT USAGE ON SCHEMA %I TO turnkeeper_reader', current_schema());
    EXECUTE format('GRANT SELECT ON ALL TABLES IN SCHEMA %I TO turnkeeper_reader',
                   current_schema());
    -- and every table a later migration creates
    EXECUTE format('ALTER DEFAULT PRIVILEGES IN SCHEMA %I GRANT SELECT ON TABLES '
                   'TO turnkeeper_reader', current_schema());
    EXECUTE format('GRANT turnkeeper_reader TO %I', current_user);
EXCEPTION WHEN insufficient_privilege THEN
    RAISE NOTICE 'turnkeeper_reader not created: %', SQLERRM;
END
$$;
