-- turnkeeper schema version 29 (issue 21, "a cold replay"): the replayed context of a
-- session's branch kept as stored values, so a fresh process or store object replays a
-- long session from one value (plus the entries after it) instead of decoding every
-- entry (storage/ops/replay_snapshots.py).
--
-- A snapshot is derived from the entries and never the source of truth: it names the
-- session row's (leaf_id, next_seq) it was taken at, and is used only where those say
-- it still holds (see the module). It is written by the replay that read the rows, in a
-- write of its own that locks the session row; a session's delete removes it.
-- Part p holds context messages p * 16384 onwards: each part is one JSON array of
-- messages and one of their entry ids (msgpack), with a CRC-32 of its header and both; part 0 also
-- carries the snapshot's model (JSON) and thinking level.
--
-- No backfill: a session gets its snapshot at its next long replay.

CREATE TABLE replay_snapshots (
    session_id VARCHAR NOT NULL,
    part       BIGINT NOT NULL,
    parts      BIGINT NOT NULL,
    leaf_id    VARCHAR,
    next_seq   BIGINT NOT NULL,
    rooted     BOOLEAN NOT NULL,
    model      VARCHAR,
    thinking   VARCHAR NOT NULL,
    messages   BYTEA NOT NULL,
    entry_ids  BYTEA NOT NULL,
    digest     VARCHAR NOT NULL,
    PRIMARY KEY (session_id, part)
);
