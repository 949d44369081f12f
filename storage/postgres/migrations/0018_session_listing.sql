-- PostgreSQL's additions to schema version 18 (run after storage/migrations/0018_session_listing.sql).
-- An id prefix is looked up by the id's first 8 characters through an index of that
-- expression (storage/ops/open_ids.py HEAD): a process of schema 13 still writing
-- during a rolling upgrade creates sessions without id_head, which PostgreSQL
-- therefore never reads; no row is rewritten.

CREATE INDEX sessions_by_id_head ON sessions ((substr(id, 1, 8)));
