-- DuckDB's additions to schema version 33 (run after storage/migrations/0033_entry_clear_facts.sql).
-- The clear facts of the entries already stored, from their payload JSON: a field counts
-- when json_type says it is a string (VARCHAR); length and left count code points, as
-- Python's len and slices do. Only JSON payloads are read (a stored JSON payload is an object,
-- '{…}'): a value sealed by encryption at rest, if any is stored by then, keeps NULL facts.

UPDATE entries SET role = f.role, provider = f.provider, model = f.model FROM (
    SELECT session_id AS sid, id AS eid,
           CASE WHEN json_type(r) = 'VARCHAR' THEN json_extract_string(r, '$') END AS role,
           CASE WHEN json_type(r) = 'VARCHAR' AND json_extract_string(r, '$') = 'assistant'
                 AND json_type(p) = 'VARCHAR' THEN json_extract_string(p, '$') END AS provider,
           CASE WHEN json_type(r) = 'VARCHAR' AND json_extract_string(r, '$') = 'assistant'
                 AND json_type(m) = 'VARCHAR' THEN json_extract_string(m, '$') END AS model
    FROM (SELECT session_id, id, msg -> 'role' AS r, msg -> 'provider' AS p, msg -> 'model' AS m
          FROM (SELECT session_id, id, CAST(payload AS JSON) -> 'message' AS msg
                FROM entries WHERE kind = 'message' AND payload LIKE '{%') e) e
    UNION ALL
    SELECT session_id, id, NULL,
           CASE WHEN json_type(p) = 'VARCHAR' THEN json_extract_string(p, '$') END,
           CASE WHEN json_type(m) = 'VARCHAR' THEN json_extract_string(m, '$') END
    FROM (SELECT session_id, id, j -> 'provider' AS p,
                 CASE WHEN (j -> 'modelId') IS NULL OR json_type(j -> 'modelId') = 'NULL'
                      THEN j -> 'model' ELSE j -> 'modelId' END AS m
          FROM (SELECT session_id, id, CAST(payload AS JSON) AS j
                FROM entries WHERE kind = 'model_change' AND payload LIKE '{%') c) c
) f WHERE entries.session_id = f.sid AND entries.id = f.eid;

UPDATE entries SET
    role = CASE WHEN length(role) > 200 THEN left(role, 199) || '…' ELSE role END,
    provider = CASE WHEN length(provider) > 200 THEN left(provider, 199) || '…' ELSE provider END,
    model = CASE WHEN length(model) > 200 THEN left(model, 199) || '…' ELSE model END
WHERE length(role) > 200 OR length(provider) > 200 OR length(model) > 200;
