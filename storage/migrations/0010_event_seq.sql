-- turnkeeper schema version 10: each session keeps the seq of its last run event
-- (its per-session event cursor), so that a new run event takes the next number
-- from that counter instead of searching the session's events for the largest
-- one, which on DuckDB reads every run event in the store (the cost grew with
-- the whole history: 9.5 ms per event statement at 4 million events).

ALTER TABLE sessions ADD COLUMN event_seq BIGINT NOT NULL DEFAULT 0;
UPDATE sessions SET event_seq = m.seq
FROM (SELECT session_id, max(seq) AS seq FROM run_events GROUP BY session_id) AS m
WHERE m.session_id = sessions.id;
