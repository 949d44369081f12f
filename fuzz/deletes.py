"""The differential state machine for deletes and retention among every other writer.

Simulated workers take session leases and write sessions every way the store
offers (appends, runs admitted and finished, tool-execution claims, response
lineage, metadata, forks), while deletes (with and without the session's
lease), retention passes (under a lease of their own) and creates of new and
of deleted ids interleave with them, on an injected clock. Every outcome is
compared with a plain-Python model (the lease oracle of :mod:`.oracle` plus
each session's :class:`~.deletes_model.SessionModel`: transcript, runs and
counters), and after every step:

- the sessions stored are exactly the model's, and each replays as the model
  says (a delete or retention pass never changes a session it leaves);
- nothing of a deleted session remains in any table a delete removes from,
  and its ``deleted_sessions`` row does;
- each session's metadata, lineage version, tool records, active run and
  last-write time are the model's;

and after every delete and retention pass the audit is clean
(:func:`turnkeeper.storage.audit.run_audit`: every check passes).

``machine(opener)`` returns the machine class with its stores from
``opener``; the fence kill tests run the same class with one guard patched
out.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import Bundle, MultipleResults, initialize, multiple, rule

import turnkeeper
from turnkeeper import ResponseRun, ResponseState, SessionMetadata
from turnkeeper.storage.audit import run_audit
from turnkeeper.storage.backend import Tx
from turnkeeper.storage.ops import deletes

from .ambiguous import ambiguously, replayable
from .base import FuzzMachine, bound, checked
from .deletes_model import CHANNELS, OWNERS, REPLY, SESSIONS, SessionModel, attempt
from .opener import StoreOpener
from .oracle import Oracle

Lease = turnkeeper.Lease


class DeletesMachine(FuzzMachine):
    """Workers writing three sessions every way while deletes, retention
    passes and creates interleave (see the module docstring)."""

    leases = Bundle("leases")
    runs = Bundle("runs")

    def __init__(self) -> None:
        super().__init__()
        self.oracle = Oracle()
        self.sessions: dict[str, SessionModel] = {}
        self.deleted: set[str] = set()
        self.runs_of: dict[str, tuple[str, str]] = {}  # run id -> (session, status)
        self.bound: dict[str, str] = {}  # channel id (type "chat") -> its session
        self.n = 0

    @initialize()
    def create_sessions(self) -> None:
        """Each session begins with one completed turn (so that forks can succeed)."""
        for sid in SESSIONS:
            self.store.sessions.create(sid)
            ask = {"role": "user", "content": f"first {sid}"}
            run = self.store.runs.admit(sid, {"q": 0}, user_message=ask, start=True)
            self.store.runs.finish(run.id, "succeeded", assistant_message=REPLY)
            self.sessions[sid] = SessionModel(self.clock(), messages=[ask, REPLY], turn_end=2)

    def _next(self, prefix: str) -> str:
        self.n += 1
        return f"{prefix}{self.n}"

    def _held(self, sid: str) -> bool:
        return self.oracle.live(f"session:{sid}", self.clock()) is not None

    def _expect(self, sid: str, lease: Lease | None) -> str:
        """The session-write rule: missing, lost, busy, else ok."""
        if sid not in self.sessions:
            return "missing"
        if lease is not None and not self.oracle.valid(
            lease.target, lease.owner, lease.epoch, self.clock()
        ):
            return "lost"
        if lease is None and self._held(sid):
            return "busy"
        return "ok"

    @staticmethod
    def _own(sid: str, lease: Lease | None) -> Lease | None:
        return lease if lease is not None and lease.target == f"session:{sid}" else None

    # -- leases and time ---------------------------------------------------------

    @rule(
        target=leases,
        owner=st.sampled_from(OWNERS),
        session=st.sampled_from(SESSIONS),
        ttl=st.sampled_from((1.0, 3.0)),
    )
    def acquire(self, owner: str, session: str, ttl: float) -> Lease | MultipleResults[Lease]:
        """An execution lease (what admits and runs a turn). A runtime lease
        needs its session (a deleted one is gone for good), and a grant needs
        the session idle: an active run nobody holds is recovery's."""
        target, now = f"session:{session}", self.clock()
        live = self.oracle.live(target, now)
        got = attempt(self.store.leases.acquire, target, owner, ttl, purpose="execution")
        if session not in self.sessions:
            assert got[0] in ("no_session", "busy"), got
            return multiple()
        if live is None and self.sessions[session].active_run is not None:
            assert got == ("recovery",), got
            return multiple()
        expected = self.oracle.acquire(target, owner, ttl, "execution", now)
        assert (got[0] == "ok") == (expected[0] in ("granted", "reacquired")), (got, expected)
        return got[1] if got[0] == "ok" else multiple()

    @rule(lease=leases)
    def release(self, lease: Lease) -> None:
        self.oracle.release(lease.target, lease.owner, lease.epoch, self.clock())
        self.store.leases.release(lease)

    @rule(seconds=st.sampled_from((0.5, 1.0, 2.0)))
    def advance(self, seconds: float) -> None:
        self.clock.advance(seconds)

    # -- the other writers ---------------------------------------------------------

    @rule(session=st.sampled_from(SESSIONS), lease=st.none() | leases)
    def append(self, session: str, lease: Lease | None) -> None:
        lease = self._own(session, lease)
        expected = self._expect(session, lease)
        message = {"role": "user", "content": self._next("note ")}
        got = attempt(
            self.store.sessions.append, session, "message", {"message": message}, lease=lease
        )
        assert got[0] == expected, (got, expected)
        if expected == "ok":
            self.sessions[session].messages.append(message)
            self.sessions[session].updated = self.clock()

    @rule(target=runs, session=st.sampled_from(SESSIONS), lease=st.none() | leases)
    def admit(self, session: str, lease: Lease | None) -> str | MultipleResults[str]:
        lease = self._own(session, lease)
        expected = self._expect(session, lease)
        if expected == "ok" and self.sessions[session].active_run is not None:
            expected = "active"
        message = {"role": "user", "content": self._next("ask ")}
        got = attempt(
            self.store.runs.admit, session, {"q": 1}, user_message=message, lease=lease, start=True
        )
        assert got[0] == expected, (got, expected)
        if expected != "ok":
            return multiple()
        model = self.sessions[session]
        model.messages.append(message)
        run_id: str = got[1].id
        model.updated, model.active_run = self.clock(), run_id
        self.runs_of[run_id] = (session, "running")
        return run_id

    @rule(run=runs, succeeded=st.booleans(), lease=st.none() | leases)
    def finish(self, run: str, succeeded: bool, lease: Lease | None) -> None:
        session, status = self.runs_of[run]
        lease = self._own(session, lease)
        want = "succeeded" if succeeded else "failed"
        if session not in self.sessions:
            expected = "missing"  # its runs went with it
        elif status == want:
            expected = "ok"  # a repeated termination is idempotent
        else:  # the session-write rule first, then the lifecycle
            expected = self._expect(session, lease)
            if expected == "ok" and status != "running":
                expected = "transition"
        got = attempt(
            self.store.runs.finish,
            run,
            want,
            lease=lease,
            assistant_message=REPLY if succeeded else None,
        )
        assert got[0] == expected, (got, expected, status)
        if expected == "ok" and status == "running":
            model = self.sessions[session]
            if succeeded:
                model.messages.append(REPLY)
                model.turn_end = len(model.messages)
            model.updated, model.active_run = self.clock(), None
            self.runs_of[run] = (session, want)

    @rule(session=st.sampled_from(SESSIONS), lease=st.none() | leases)
    def claim_tool(self, session: str, lease: Lease | None) -> None:
        lease = self._own(session, lease)
        expected = self._expect(session, lease)
        key = self._next("exec ")
        got = attempt(
            self.store.tools.claim,
            key,
            session,
            local_turn_id="t",
            provider_call_id=key,
            tool_name="bash",
            side_effecting=True,
            lease=lease,
        )
        assert got[0] == expected, (got, expected)
        if expected == "ok":
            self.sessions[session].tools += 1

    @rule(session=st.sampled_from(SESSIONS), lease=st.none() | leases)
    def swap_lineage(self, session: str, lease: Lease | None) -> None:
        lease = self._own(session, lease)
        expected = self._expect(session, lease)
        version = self.sessions[session].lineage if session in self.sessions else 0
        state = ResponseState(session, previous_response_id=self._next("resp "))
        got = attempt(self.store.lineage.compare_and_swap, state, version, lease=lease)
        assert got[0] == expected and (expected != "ok" or got[1] is True), (got, expected)
        if expected == "ok":
            self.sessions[session].lineage += 1

    @rule(session=st.sampled_from(SESSIONS), lease=st.none() | leases)
    def archive_response_run(self, session: str, lease: Lease | None) -> None:
        lease = self._own(session, lease)
        expected = self._expect(session, lease)
        run = ResponseRun(session, self._next("bg "), "openai", "openai-responses", "queued")
        got = attempt(self.store.archives.save_run, run, lease=lease)
        assert got[0] == expected, (got, expected)
        if expected == "ok":
            self.sessions[session].archived += 1

    @rule(
        session=st.sampled_from(SESSIONS),
        channel=st.sampled_from(CHANNELS),
        lease=st.none() | leases,
    )
    def bind(self, session: str, channel: str, lease: Lease | None) -> None:
        lease = self._own(session, lease)
        expected = self._expect(session, lease)
        mine = [c for c, s in self.bound.items() if s == session]
        if expected == "ok" and mine != [channel] and (mine or channel in self.bound):
            expected = "bound"  # the session is bound elsewhere, or the channel to another
        got = attempt(self.store.bindings.bind, session, "chat", channel, lease=lease)
        assert got[0] == expected, (got, expected)
        if expected == "ok":
            self.bound[channel] = session

    @rule(session=st.sampled_from(SESSIONS), lease=st.none() | leases)
    def unbind(self, session: str, lease: Lease | None) -> None:
        lease = self._own(session, lease)
        expected = self._expect(session, lease)
        got = attempt(self.store.bindings.unbind, session, lease=lease)
        assert got[0] == expected, (got, expected)
        if expected == "ok":
            self.bound = {c: s for c, s in self.bound.items() if s != session}

    @rule(session=st.sampled_from(SESSIONS), pinned=st.booleans(), lease=st.none() | leases)
    def set_metadata(self, session: str, pinned: bool, lease: Lease | None) -> None:
        lease = self._own(session, lease)
        expected = self._expect(session, lease)
        got = attempt(
            self.store.sessions.set_metadata, session, SessionMetadata(pinned=pinned), lease=lease
        )
        assert got[0] == expected, (got, expected)
        if expected == "ok":
            self.sessions[session].pinned = pinned

    @rule(session=st.sampled_from(SESSIONS))
    def fork(self, session: str) -> None:
        model = self.sessions.get(session)
        expected = self._fork_expected(session)
        got = attempt(self.store.forks.fork, session, request_id=self._next("fork "))
        assert got[0] == expected, (got, expected)
        if expected == "ok":
            assert model is not None
            # a fork is a session of its own; it is not in SESSIONS, so only
            # deletes and retention passes touch it afterwards
            self.sessions[got[1].fork_session_id] = SessionModel(
                self.clock(), messages=model.messages[: model.turn_end]
            )

    def _fork_expected(self, session: str) -> str:
        model = self.sessions.get(session)
        if model is None:
            return "missing"
        if model.active_run is not None:
            return "active"  # judged before the lease (both are ForkSessionActiveError)
        if self._held(session):
            return "busy"
        if model.turn_end == 0:
            return "no_turn"
        return "ok"

    @rule(session=st.sampled_from(SESSIONS))
    def fork_ambiguously(self, session: str) -> None:
        """A fork that commits while its caller sees a lost connection, then
        the caller's retry under the same request id: the same fork (one new
        session, not two)."""
        replayable("fork_ambiguously", session=session)
        expected = self._fork_expected(session)
        request = self._next("fork ")
        call = (self.store.forks.fork, session)
        before = self._stored_ids()
        got = ambiguously(self.store, attempt, *call, request_id=request)
        if expected != "ok":
            assert got[0] == expected, (got, expected)
            return
        assert got == ("ambiguous", ("fork_session",)), (got, expected)
        made = self._stored_ids() - before
        assert len(made) == 1, f"the ambiguous fork made {sorted(made)}"
        (fork_id,) = made
        model = self.sessions[session]
        copied = model.messages[: model.turn_end]
        self.sessions[fork_id] = SessionModel(self.clock(), messages=copied)
        retried = attempt(*call, request_id=request)
        assert retried[0] == "ok", f"the retry of a committed fork: {retried}"
        assert retried[1].fork_session_id == fork_id, (
            f"the retry of a committed fork made another: {retried[1]} besides {fork_id}"
        )
        stored = self.store.forks.get(request)
        assert stored is not None and stored.fork_session_id == fork_id, stored

    def _stored_ids(self) -> set[str]:
        rows = self.store.db.read("test-sessions", lambda tx: tx.rows("SELECT id FROM sessions"))
        return {r[0] for r in rows}

    # -- deletes, retention, creates ---------------------------------------------

    @rule(session=st.sampled_from(SESSIONS), lease=st.none() | leases)
    def delete(self, session: str, lease: Lease | None) -> None:
        lease = self._own(session, lease)
        expected = self._expect(session, lease)
        if expected == "ok" and self.sessions[session].active_run is not None:
            expected = "active"
        got = attempt(self.store.sessions.delete, session, lease=lease)
        assert got[0] == expected, (got, expected)
        if expected == "ok":
            self._gone(session)
            self.audit_is_clean()

    @rule(session=st.sampled_from(SESSIONS), lease=st.none() | leases)
    def delete_ambiguously(self, session: str, lease: Lease | None) -> None:
        """A delete that commits while its caller sees a lost connection, then
        the caller's retry: refused as a missing session (a second delete),
        with the first one's ``deleted_sessions`` row readable (how the caller
        learns its delete happened)."""
        lease = self._own(session, lease)
        replayable(
            "delete_ambiguously",
            session=session,
            lease=None if lease is None else (lease.owner, lease.epoch),
        )
        expected = self._expect(session, lease)
        if expected == "ok" and self.sessions[session].active_run is not None:
            expected = "active"
        call = (self.store.sessions.delete, session)
        got = ambiguously(self.store, attempt, *call, lease=lease)
        if expected != "ok":
            assert got[0] == expected, (got, expected)
            return
        assert got == ("ambiguous", ("delete_session",)), (got, expected)
        self._gone(session)
        retried = attempt(*call, lease=lease)
        assert retried == ("missing",), f"the retry of a committed delete: {retried}"
        assert self.store.sessions.deleted(session) is not None, session
        self.audit_is_clean()

    @rule(keep_last=st.integers(0, 4))
    def retain(self, keep_last: int) -> None:
        newest = sorted(self.sessions, key=lambda s: (self.sessions[s].updated, s), reverse=True)
        chosen = sorted(newest[keep_last:], key=lambda s: (self.sessions[s].updated, s))
        busy = {s for s in chosen if self._held(s)}
        active = {s for s in chosen if s not in busy and self.sessions[s].active_run is not None}
        janitor = self.store.leases.acquire("retention:r", "janitor", 600)
        report = self.store.sessions.retain(janitor, keep_last=keep_last)
        expected = [s for s in chosen if s not in busy | active]
        assert [g.session_id for g in report.removed] == expected, (report, chosen)
        assert report.skipped == {**dict.fromkeys(busy, "busy"), **dict.fromkeys(active, "active")}
        assert not report.lease_lost
        for sid in expected:
            self._gone(sid)
        self.audit_is_clean()

    def _gone(self, sid: str) -> None:
        """A session deleted: its channel is free again."""
        del self.sessions[sid]
        self.deleted.add(sid)
        self.bound = {c: s for c, s in self.bound.items() if s != sid}

    @rule(reuse=st.booleans())
    def create(self, reuse: bool) -> None:
        sid = sorted(self.deleted)[0] if reuse and self.deleted else self._next("new ")
        got = attempt(self.store.sessions.create, sid)
        assert got[0] == ("exists" if sid in self.deleted else "ok"), got
        if got[0] == "ok":
            self.sessions[sid] = SessionModel(self.clock())

    # -- invariants --------------------------------------------------------------

    @checked
    def sessions_are_the_models(self) -> None:
        rows = self.store.db.read(
            "test-sessions", lambda tx: tx.rows("SELECT id, updated_at FROM sessions")
        )
        assert {r[0] for r in rows} == set(self.sessions), (rows, self.sessions)
        updated = {r[0]: r[1] for r in rows}
        for sid, model in self.sessions.items():
            assert updated[sid] == model.updated, (sid, updated[sid], model.updated)
            assert list(self.store.sessions.replay(sid).messages) == model.messages, sid
            assert self.store.sessions.get_metadata(sid).pinned is model.pinned
            assert len(self.store.tools.list(sid)) == model.tools
            lineage = self.store.lineage.get(sid)
            assert (lineage.version if lineage else 0) == model.lineage
            assert len(self.store.archives.runs(sid, limit=1000)) == model.archived
            active = self.store.runs.active(sid)
            assert (active.id if active else None) == model.active_run

    @checked
    def bindings_are_the_models(self) -> None:
        for channel in CHANNELS:
            found = self.store.bindings.find("chat", channel)
            assert (found.session_id if found else None) == self.bound.get(channel), channel

    @checked
    def nothing_of_a_deleted_session_remains(self) -> None:
        for sid in self.deleted:
            assert self.store.sessions.deleted(sid) is not None
            for table, condition in deletes.REMOVED:
                left = self._count(f"SELECT count(*) FROM {table} WHERE {condition}", sid)
                assert left == (0,), (sid, table, left)

    def _count(self, sql: str, sid: str) -> tuple[Any, ...] | None:
        """``sql``'s one row, with ``sid`` as its one parameter."""

        def body(tx: Tx) -> tuple[Any, ...] | None:
            return tx.one(sql, [sid])

        return self.store.db.read("test-left", body)

    def audit_is_clean(self) -> None:
        """Run after every delete and retention pass (not every step: an audit
        reads the whole store, and the machine runs on loaded CI machines)."""
        bad = [(c.name, c.detail) for c in run_audit(self.store) if not c.passed]
        assert bad == [], bad


def machine(opener: StoreOpener) -> type[DeletesMachine]:
    """The machine with its stores from ``opener``."""
    return bound(DeletesMachine, opener, f"DeletesMachine[{opener.name}]")
