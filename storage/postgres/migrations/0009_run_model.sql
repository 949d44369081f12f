-- PostgreSQL's additions to schema version 9 (run after storage/migrations/0009_run_model.sql).

-- store.query() reads as a role of this schema's own: SELECT on this schema's tables
-- and nothing else. The one turnkeeper_reader of version 8 was granted on every
-- migrated schema, so a query on one store could read every other store on the
-- server; it loses its grants here. The role's name is derived from the database
-- and schema (storage/postgres/query.py computes the same name). Created only where
-- the store's user may create roles.
DO $$
DECLARE
    reader TEXT := 'turnkeeper_reader_' || left(md5(current_database() || '.' || current_schema()), 16);
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = reader) THEN
        EXECUTE format('CREATE ROLE %I NOLOGIN', reader);
    END IF;
    EXECUTE format('GRANT USAGE ON SCHEMA %I TO %I', current_schema(), reader);
    EXECUTE format('GRANT SELECT ON ALL TABLES IN SCHEMA %I TO %I', current_schema(), reader);
    EXECUTE format('ALTER DEFAULT PRIVILEGES IN SCHEMA %I GRANT SELECT ON TABLES TO %I',
                   current_schema(), reader);
    EXECUTE format('GRANT %I TO %I', reader, current_user);
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'turnkeeper_reader') THEN
        EXECUTE format('REVOKE SELECT ON ALL TABLES IN SCHEMA %I FROM turnkeeper_reader',
                       current_schema());
        EXECUTE format('ALTER DEFAULT PRIVILEGES IN SCHEMA %I REVOKE SELECT ON TABLES '
                       'FROM turnkeeper_reader', current_schema());
        EXECUTE format('REVOKE USAGE ON SCHEMA %I FROM turnkeeper_reader', current_schema());
    END IF;
EXCEPTION WHEN insufficient_privilege THEN
    RAISE NOTICE 'the schema''s reader role was not created: %', SQLERRM;
END
$$;
