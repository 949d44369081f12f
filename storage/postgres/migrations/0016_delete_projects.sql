-- PostgreSQL's additions to schema version 16 (run after storage/migrations/0016_delete_projects.sql).

-- A project's sessions, read by store.projects.delete.
CREATE INDEX session_metadata_by_project ON session_metadata (project_id);
