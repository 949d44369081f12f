-- PostgreSQL's additions to schema version 12 (run after storage/migrations/0012_postgres_lookup_indexes.sql).
-- An index led by each column a hot statement looks its rows up by through
-- storage/backend.py keyed(), where no key of the table starts with it.
--
-- A process of schema 11 may keep writing while this runs (a rolling upgrade), and
-- its writes take these tables in either order (a run's end: its tool records,
-- then its entries; with the turn's last entries, the other way), so locking them
-- one CREATE INDEX at a time could deadlock with it. All three are locked at
-- once first, waiting at most 500 ms (less than PostgreSQL's deadlock_timeout,
-- 1 s by default): a writer only waits, and when the migration gives up it is
-- rolled back and retried from the start. The builds then hold writes to the
-- three tables until the migration commits.

SET LOCAL lock_timeout = '500ms';
LOCK TABLE tool_executions, submissions, entries IN SHARE MODE;
SET LOCAL lock_timeout = DEFAULT;

CREATE INDEX entries_by_id ON entries (id);
CREATE INDEX submissions_by_key ON submissions (key_digest);
CREATE INDEX tool_executions_by_run ON tool_executions (run_id);
CREATE INDEX tool_executions_by_turn ON tool_executions (local_turn_id);
