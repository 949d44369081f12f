-- turnkeeper schema version 19 (issue 18, channel bindings; the lead renumbers it at
-- merge if needed): store.bindings (session seed BindSession, TransferBinding,
-- FindBinding, CreateBound, RotateBoundSession, SetChannelTools …).
--
-- channel_bindings holds each current binding: a channel identity (its primary key)
-- names one session, and a session (unique) has at most one channel. These keys are
-- the database's guard: a move (TransferBinding, RotateBoundSession) deletes the old
-- row and inserts the new one in one transaction, so no reader ever sees a channel
-- with two sessions, or with none in the middle of a move; two writers racing for one
-- channel meet on its key (PostgreSQL: the second waits for the first, then its
-- duplicate key is a lost race, retried, and it sees the winner; DuckDB: its write
-- lock orders them). The key is led by channel_id, the column a channel is looked
-- up by (storage/backend.py keyed()).
--
-- sessions.channel_type and channel_id repeat the session's binding on its row (the
-- seed's Header and SessionInfo fields, read with the session), written in the same
-- transaction as channel_bindings by store.bindings only; NULL for a local session.
-- No index on them: DuckDB builds no index on sessions in the transaction of version
-- 18's update of it, and nothing looks a session up by them.

ALTER TABLE sessions ADD COLUMN channel_type VARCHAR;
ALTER TABLE sessions ADD COLUMN channel_id VARCHAR;

CREATE TABLE channel_bindings (
    channel_id   VARCHAR NOT NULL,
    channel_type VARCHAR NOT NULL,
    session_id   VARCHAR NOT NULL UNIQUE,
    bound_at     TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (channel_id, channel_type)
);

-- A channel session's tool selection (session seed SetChannelTools, ListChannelTools,
-- GetChannelToolGeneration): the whole list as JSON (ChannelToolConfig objects in the
-- order given), replaced as a whole; generation counts the replacements (1, 2, 3 …).
CREATE TABLE channel_tools (
    session_id VARCHAR PRIMARY KEY,
    generation BIGINT NOT NULL,
    tools      VARCHAR NOT NULL,
    updated_at TIMESTAMPTZ NOT NULL
);
