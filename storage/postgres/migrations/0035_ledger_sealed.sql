-- PostgreSQL: each blob pointer's key from its JSON payload (see the shared file). A
-- payload that is not UTF-8 or not JSON keeps NULL: each row is read in a block of its
-- own, whose failure is caught, so one damaged pointer does not stop the upgrade.
DO $$
DECLARE
    r RECORD;
BEGIN
    FOR r IN SELECT tenant, session_id, seq, payload FROM ledger_records
             WHERE kind = 'blobptr' LOOP
        BEGIN
            UPDATE ledger_records SET blob_key = convert_from(r.payload, 'UTF8')::json ->> 'key'
            WHERE tenant = r.tenant AND session_id = r.session_id AND seq = r.seq;
        EXCEPTION WHEN others THEN
            NULL;
        END;
    END LOOP;
END $$;
