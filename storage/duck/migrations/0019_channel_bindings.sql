-- DuckDB's additions to schema version 19 (run after storage/migrations/0019_channel_bindings.sql).
-- DuckDB scans an index only for one filter on a column with an index of its own:
-- a channel is looked up by channel_id through this one (storage/backend.py keyed()).

CREATE INDEX channel_bindings_by_channel_id ON channel_bindings (channel_id);
