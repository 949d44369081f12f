-- turnkeeper schema version 17: usage and run progress (session seed RecordUsage,
-- RecordUsageFromProviderUsage, UpdateSessionRunUsage, UpdateSessionRunProgress,
-- UpdateSessionRunErrorInfo).
--
-- A run keeps its latest token/context usage, its non-terminal progress
-- projection and its structured error, each JSON text (NULL: never set), written
-- apart from its status so that a reconnecting client can read a partial or
-- recovered run. Rows stored before this version have none.

ALTER TABLE runs ADD COLUMN usage VARCHAR;
ALTER TABLE runs ADD COLUMN context_usage VARCHAR;
ALTER TABLE runs ADD COLUMN progress VARCHAR;
ALTER TABLE runs ADD COLUMN error_info VARCHAR;

-- One row per model request: its tokens (input without cache reads, output,
-- cache reads, cache writes, total), its cost in US dollars and its duration in
-- milliseconds; NULL where the figure is unknown. ``id`` is unique within the
-- session: a caller's usage id, a new UUIDv7, or ``entry:<entry id>`` for the
-- usage an imported assistant message carries (so a re-import records nothing
-- twice). ``source`` is 'record' (store.usage.record …) or 'import'.
CREATE TABLE usage_records (
    session_id         VARCHAR NOT NULL,
    id                 VARCHAR NOT NULL,
    run_id             VARCHAR,
    entry_id           VARCHAR,
    provider           VARCHAR NOT NULL,
    protocol           VARCHAR NOT NULL,
    model              VARCHAR NOT NULL,
    input_tokens       BIGINT,
    output_tokens      BIGINT,
    cache_read_tokens  BIGINT,
    cache_write_tokens BIGINT,
    total_tokens       BIGINT,
    cost_usd           DOUBLE PRECISION,
    duration_ms        BIGINT,
    source             VARCHAR NOT NULL,
    recorded_at        TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (session_id, id)
);

-- A retry is found by its usage id (storage/backend.py keyed): the primary key,
-- led by the session, serves neither PostgreSQL nor DuckDB for the id alone.
CREATE INDEX usage_records_by_id ON usage_records (id);
