-- turnkeeper schema version 31 (issue 21, "a cold replay", part 1 of round 2): replay
-- snapshots stored compressed and found through a key of one column
-- (storage/ops/replay_snapshots.py, format 2).
--
-- Each part is one row under part_key = session_id || '/' || part: DuckDB reads a row
-- through an index only for one filter on one indexed column, and scanned the whole table's
-- blobs for a (session_id, part) filter (every session's snapshot, for each part read).
-- A part's body is a Zstandard frame of the msgpack array [entry ids, messages], so what the
-- database holds and caches of it is the compressed bytes, with a CRC-32 of its header and
-- body. Part 0 also carries the snapshot's model (JSON) and thinking level. The body column
-- is each dialect's addition: DuckDB stores it uncompressed (its own ZSTD of a frame saves
-- nothing, and made each part's read decompress the blocks it shares with other parts).
--
-- Snapshots are derived, never the source: the version 29 ones are dropped with their
-- table, and each session gets its snapshot anew at its next long replay.

DROP TABLE replay_snapshots;

CREATE TABLE replay_snapshots (
    part_key   VARCHAR PRIMARY KEY,
    session_id VARCHAR NOT NULL,
    part       BIGINT NOT NULL,
    parts      BIGINT NOT NULL,
    format     BIGINT NOT NULL,
    leaf_id    VARCHAR,
    next_seq   BIGINT NOT NULL,
    rooted     BOOLEAN NOT NULL,
    model      VARCHAR,
    thinking   VARCHAR NOT NULL,
    digest     VARCHAR NOT NULL
);
CREATE INDEX replay_snapshots_by_session ON replay_snapshots (session_id);
