-- PostgreSQL's additions to schema version 33 (run after storage/migrations/0033_entry_clear_facts.sql).
-- The clear facts of the entries already stored, from their payload JSON read as
-- Dialect.json reads it (each \u0000 escape given the text code of U+0000, which ::json
-- would refuse; see storage/postgres/text.py): a field counts when json_typeof says string,
-- and #>> '{}' gives its text, U+0000 already in the text code the columns store. Only JSON
-- payloads are read (a stored JSON payload is an object, '{…}'): a value sealed by
-- encryption at rest, if any is stored by then, keeps NULL facts.
-- A value is cut by characters of the text it stands for: in the stored code, U+E000 and
-- the character after it are one character (^(?:[^\uE000]|\uE000.){n} matches n of them).

UPDATE entries SET role = f.role, provider = f.provider, model = f.model FROM (
    SELECT session_id AS sid, id AS eid,
           CASE WHEN json_typeof(r) = 'string' THEN r #>> '{}' END AS role,
           CASE WHEN json_typeof(r) = 'string' AND r #>> '{}' = 'assistant'
                 AND json_typeof(p) = 'string' THEN p #>> '{}' END AS provider,
           CASE WHEN json_typeof(r) = 'string' AND r #>> '{}' = 'assistant'
                 AND json_typeof(m) = 'string' THEN m #>> '{}' END AS model
    FROM (SELECT session_id, id, msg -> 'role' AS r, msg -> 'provider' AS p, msg -> 'model' AS m
          FROM (SELECT session_id, id,
                       (CASE WHEN strpos(payload, E'\\u0000') = 0 THEN payload
                        ELSE regexp_replace(payload, E'(?<!\\\\)((?:\\\\\\\\)*)\\\\u0000',
                                            E'\\1' || chr(57344) || chr(57345), 'g')
                        END)::json -> 'message' AS msg
                FROM entries WHERE kind = 'message' AND payload LIKE '{%') e) e
    UNION ALL
    SELECT session_id, id, NULL,
           CASE WHEN json_typeof(p) = 'string' THEN p #>> '{}' END,
           CASE WHEN json_typeof(m) = 'string' THEN m #>> '{}' END
    FROM (SELECT session_id, id, j -> 'provider' AS p,
                 CASE WHEN (j ->> 'modelId') IS NULL THEN j -> 'model' ELSE j -> 'modelId' END AS m
          FROM (SELECT session_id, id,
                       (CASE WHEN strpos(payload, E'\\u0000') = 0 THEN payload
                        ELSE regexp_replace(payload, E'(?<!\\\\)((?:\\\\\\\\)*)\\\\u0000',
                                            E'\\1' || chr(57344) || chr(57345), 'g')
                        END)::json AS j
                FROM entries WHERE kind = 'model_change' AND payload LIKE '{%') c) c
) f WHERE entries.session_id = f.sid AND entries.id = f.eid;

UPDATE entries SET
    role = CASE WHEN role ~ '^(?:[^\uE000]|\uE000.){201}'
                THEN substring(role FROM '^(?:[^\uE000]|\uE000.){199}') || '…' ELSE role END,
    provider = CASE WHEN provider ~ '^(?:[^\uE000]|\uE000.){201}'
                    THEN substring(provider FROM '^(?:[^\uE000]|\uE000.){199}') || '…'
                    ELSE provider END,
    model = CASE WHEN model ~ '^(?:[^\uE000]|\uE000.){201}'
                 THEN substring(model FROM '^(?:[^\uE000]|\uE000.){199}') || '…' ELSE model END
WHERE role ~ '^(?:[^\uE000]|\uE000.){201}' OR provider ~ '^(?:[^\uE000]|\uE000.){201}'
   OR model ~ '^(?:[^\uE000]|\uE000.){201}';
