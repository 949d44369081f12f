-- turnkeeper schema version 16: deleted sessions, projects and session metadata
-- (issue 18: session seed DeleteSession, retention, CreateProject …, SessionMetadata).

-- One row per deleted session: what remains of it, for analytics and as a
-- tombstone. Counts and times only, no content: not its cwd, header, title,
-- entries, requests, tool names or results. The id stays so that a deleted id is
-- never reused (sessions.create, an import or a fork refuse it): every store
-- object's caches of a session are keyed by its head, which a new session of the
-- same id could reach with other content.
CREATE TABLE deleted_sessions (
    session_id          VARCHAR PRIMARY KEY,
    reason              VARCHAR NOT NULL CHECK (reason IN ('delete', 'project', 'retention')),
    created_at          TIMESTAMPTZ NOT NULL,
    last_updated_at     TIMESTAMPTZ NOT NULL,
    deleted_at          TIMESTAMPTZ NOT NULL,
    entries             BIGINT NOT NULL,
    runs                BIGINT NOT NULL,
    run_events          BIGINT NOT NULL,
    tool_executions     BIGINT NOT NULL,
    delivery_operations BIGINT NOT NULL,
    lease_epoch         BIGINT
);

CREATE TABLE projects (
    id         VARCHAR PRIMARY KEY,
    name       VARCHAR NOT NULL,
    created_at TIMESTAMPTZ NOT NULL,
    updated_at TIMESTAMPTZ NOT NULL
);

-- A session's metadata (session seed SessionMetadata); a session without a row
-- has the defaults (no project, not pinned).
CREATE TABLE session_metadata (
    session_id VARCHAR PRIMARY KEY,
    project_id VARCHAR,
    pinned     BOOLEAN NOT NULL,
    updated_at TIMESTAMPTZ NOT NULL
);
