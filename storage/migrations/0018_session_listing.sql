-- turnkeeper schema version 18 (issue 18, resume and listing; the lead renumbers it
-- at merge, to 17): a session may be a sub-agent of another (store.sessions.new_sub_agent):
-- sub_agent_of names its parent, NULL for every other session (listings leave
-- sub-agents out unless asked, store.sessions.sub_agents reads them by parent), and
-- a session's listing by working directory reads it by cwd. Each has its own index
-- (DuckDB scans an index only for one filter on one indexed column).
-- The dialects add the id prefix lookup of store.sessions.open (see their files).

ALTER TABLE sessions ADD COLUMN sub_agent_of VARCHAR;
ALTER TABLE sessions ADD COLUMN id_head VARCHAR;
CREATE INDEX sessions_by_sub_agent_of ON sessions (sub_agent_of);
CREATE INDEX sessions_by_cwd ON sessions (cwd);
