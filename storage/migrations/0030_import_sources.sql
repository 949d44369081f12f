-- turnkeeper schema version 30 (issue 21, "big sessions in the CLI"): what each import
-- of a session file read, so that a re-import of the unchanged file is told apart without parsing it
-- (storage/ops/imports.py, turnkeeper.formats.pi.import_file). One row per session and
-- source file (its resolved path): the bytes it read, their sha256 (hex) and the
-- entries the file held. Written in the import's own transaction, deleted with the
-- session (storage/ops/deletes.py). A session's rows are found by session_id alone
-- (DuckDB scans an index only for one filter on one indexed column).

CREATE TABLE import_sources (
    session_id VARCHAR NOT NULL,
    source VARCHAR NOT NULL,
    bytes BIGINT NOT NULL,
    sha256 VARCHAR NOT NULL,
    entries BIGINT NOT NULL,
    PRIMARY KEY (session_id, source)
);
CREATE INDEX import_sources_by_session ON import_sources (session_id);
