"""The differential state machine for sessions and forks (issue 22).

Writers race on the sessions' leaves as explicit steps: each writer remembers
the leaf it last saw (``look``) and appends, appends a batch, branches or
compacts with ``expected_leaf`` set to it, a compare-and-set on the leaf; a
stale one must be refused with ``SessionModifiedError`` and nothing written.
Blind writers append, title and label without it; turns (a run admitted and
finished ``succeeded``) add their entries under the leaf; forks copy a session
up to its latest completed turn, once per request id (the same request gives
the same fork, even after the source moved on; another source under it
conflicts). Writer ``w3`` writes through a second store object where the
opener gives one (:meth:`~.opener.StoreOpener.peer`: another worker's
connections and caches, on PostgreSQL). Ambiguous commits: the write commits,
but its caller sees ``OperationalError`` (:func:`.sessions_model.lost_reply`), and retries: an
append given its own ``entry_id`` is then refused by name
(``SessionModifiedError`` whose ``actual_leaf`` is that id, then
``EntryExistsError`` without ``expected_leaf``), a fork's request id answers
with the fork it made. All on an injected clock.

The model is a plain tree per session (:mod:`.sessions_model`); after every step:

- each session's leaf, entry count, title, labels and entries are the model's, and
  its replay (through each store object) is the context the model builds at the leaf;
- each fork's replay is its source's at the turn it was made at, and its
  entry count, title and labels are those of what it copied (the path to that
  turn, and the path to every entry a copied compaction or label names,
  until closed); and the store holds exactly the model's sessions (a fork retried
  after an ambiguous commit made no second one).

``machine(opener)`` returns the machine class with its stores from ``opener``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import initialize, rule

from turnkeeper import BaseStore, EntryKind, NewEntry

from .base import FuzzMachine, bound, checked
from .opener import StoreOpener
from .sessions_model import (
    ForkModel,
    Node,
    SessionModel,
    attempt,
    lost_reply,
    say,
    seen_context,
    text_of,
)

SESSIONS = ("s1", "s2")
WRITERS = ("w1", "w2", "w3")
REQUESTS = ("f1", "f2", "f3")
REPLY = {"role": "assistant", "content": "done"}


class SessionsMachine(FuzzMachine):
    """Writers w1, w2 (through the store) and w3 (through the opener's peer, if
    any) racing on two sessions' leaves; forks under three request ids."""

    def __init__(self) -> None:
        super().__init__()
        self.peer = self.opener.peer(self.store, self.clock)
        self.other: BaseStore = self.store if self.peer is None else self.peer
        # w3 writes through its own store object on PostgreSQL (its own caches:
        # the replay cache, the calls open at each session's head), as a
        # worker process of its own would
        self.of = {"w1": self.store, "w2": self.store, "w3": self.other}
        self.sessions: dict[str, SessionModel] = {}
        self.seen: dict[tuple[str, str], str | None] = {}  # (writer, session) -> leaf it saw
        self.forks: dict[str, ForkModel] = {}  # request id -> the fork it made
        self.n = 0

    @initialize()
    def create_sessions(self) -> None:
        """Each session begins with one completed turn (so that forks can succeed)."""
        for sid in SESSIONS:
            self.store.sessions.create(sid)
            self.sessions[sid] = SessionModel(self.clock())
            self.turn(sid)
            for writer in WRITERS:
                self.seen[writer, sid] = self.sessions[sid].leaf

    def teardown(self) -> None:
        """Close the peer, then the store (the opener's)."""
        try:
            if self.peer is not None:
                self.peer.close()
        finally:
            super().teardown()

    def _next(self, prefix: str) -> str:
        self.n += 1
        return f"{prefix}{self.n}"

    def _message(self, text: str) -> dict[str, Any]:
        return {"message": {"role": "user", "content": text}}

    @rule(seconds=st.sampled_from((0.5, 2.0)))
    def advance(self, seconds: float) -> None:
        self.clock.advance(seconds)
        say(f"clock +{seconds} s")

    # -- writers with a view of the leaf -------------------------------------------

    @rule(writer=st.sampled_from(WRITERS), session=st.sampled_from(SESSIONS))
    def look(self, writer: str, session: str) -> None:
        """The writer reads the session's leaf."""
        got = self.of[writer].sessions.get(session)
        assert got is not None and got.leaf_id == self.sessions[session].leaf
        self.seen[writer, session] = got.leaf_id
        say(f"{writer} sees {session} at {got.leaf_id}")

    def _expected(self, writer: str, session: str) -> tuple[str | None, tuple[Any, ...] | None]:
        """The writer's expected leaf, and the refusal it gets (None: the append goes in)."""
        expected, leaf = self.seen[writer, session], self.sessions[session].leaf
        return expected, (None if expected == leaf else ("modified", leaf))

    @rule(writer=st.sampled_from(WRITERS), session=st.sampled_from(SESSIONS))
    def append(self, writer: str, session: str) -> None:
        expected, refused = self._expected(writer, session)
        text = self._next("note ")
        got = attempt(
            self.of[writer].sessions.append,
            session,
            EntryKind.MESSAGE,
            self._message(text),
            expected_leaf=expected,
        )
        say(f"{writer} appends {text!r} to {session} at {expected}: {got[0]}")
        if refused is not None:
            assert got == refused, (got, refused)
            return
        assert got[0] == "ok", got
        self._add(session, got[1].id, Node(expected, "user", text))
        self.seen[writer, session] = got[1].id

    @rule(
        writer=st.sampled_from(WRITERS),
        session=st.sampled_from(SESSIONS),
        size=st.integers(2, 3),
    )
    def append_many(self, writer: str, session: str, size: int) -> None:
        expected, refused = self._expected(writer, session)
        texts = [self._next("batch ") for _ in range(size)]
        got = attempt(
            self.of[writer].sessions.append_many,
            session,
            [(EntryKind.MESSAGE, self._message(t)) for t in texts],
            expected_leaf=expected,
        )
        say(f"{writer} appends {texts!r} to {session} at {expected}: {got[0]}")
        if refused is not None:
            assert got == refused, (got, refused)
            return
        assert got[0] == "ok" and len(got[1]) == size, got
        parent = expected
        for entry, text in zip(got[1], texts, strict=True):
            self._add(session, entry.id, Node(parent, "user", text))
            parent = entry.id
        self.seen[writer, session] = parent

    @rule(
        writer=st.sampled_from(WRITERS), session=st.sampled_from(SESSIONS), pick=st.integers(0, 30)
    )
    def branch(self, writer: str, session: str, pick: int) -> None:
        """Move the leaf to an earlier entry (any branch's), or to none (a new root)."""
        model = self.sessions[session]
        ids = list(model.nodes)  # in sequence order: a script replays alike
        target = None if pick == 0 else ids[pick % len(ids)]
        expected, refused = self._expected(writer, session)
        got = attempt(self.of[writer].sessions.branch, session, target, expected_leaf=expected)
        say(f"{writer} branches {session} from {expected} to {target}: {got[0]}")
        if refused is not None:
            assert got == refused, (got, refused)
            return
        assert got == ("ok", None), got
        model.leaf, model.updated = target, self.clock()
        self.seen[writer, session] = target

    @rule(
        writer=st.sampled_from(WRITERS), session=st.sampled_from(SESSIONS), keep=st.integers(0, 9)
    )
    def compact(self, writer: str, session: str, keep: int) -> None:
        """A compaction entry keeping the path from one of its entries (or none)."""
        model = self.sessions[session]
        path = model.path()
        first_kept = path[-1 - keep] if keep < len(path) else None
        summary = self._next("summary ")
        payload = {"summary": summary, "firstKeptEntryId": first_kept, "tokensBefore": 100}
        expected, refused = self._expected(writer, session)
        got = attempt(
            self.of[writer].sessions.append,
            session,
            EntryKind.COMPACTION,
            payload,
            expected_leaf=expected,
        )
        say(f"{writer} compacts {session} at {expected} keeping from {first_kept}: {got[0]}")
        if refused is not None:
            assert got == refused, (got, refused)
            return
        assert got[0] == "ok", got
        node = Node(expected, "compactionSummary", summary, first_kept, compaction=True)
        self._add(session, got[1].id, node)
        self.seen[writer, session] = got[1].id

    # -- blind writers ---------------------------------------------------------------

    @rule(session=st.sampled_from(SESSIONS))
    def blind_append(self, session: str) -> None:
        """An append without ``expected_leaf``: under whatever the leaf is."""
        text = self._next("blind ")
        entry = self.store.sessions.append(session, EntryKind.MESSAGE, self._message(text))
        say(f"blind append {text!r} to {session}")
        self._add(session, entry.id, Node(self.sessions[session].leaf, "user", text))

    @rule(session=st.sampled_from(SESSIONS))
    def title(self, session: str) -> None:
        name = self._next("title ")
        entry = self.store.sessions.set_title(session, name)
        say(f"title {session} {name!r}")
        self._add(session, entry.id, Node(self.sessions[session].leaf, title=name))

    @rule(session=st.sampled_from(SESSIONS), pick=st.integers(0, 30), clear=st.booleans())
    def label(self, session: str, pick: int, clear: bool) -> None:
        """Label an entry (of any branch), or clear its label: a label entry under the leaf."""
        model = self.sessions[session]
        ids = list(model.nodes)  # in sequence order: a script replays alike
        target, name = ids[pick % len(ids)], None if clear else self._next("label ")
        entry = self.store.sessions.set_label(session, target, name)
        say(f"label {target} of {session} {name!r}")
        self._add(session, entry.id, Node(model.leaf, target=target, label=name))

    @rule(session=st.sampled_from(SESSIONS))
    def turn(self, session: str) -> None:
        """A run admitted and finished ``succeeded``: its entries go under the leaf,
        a chain whose messages are the ask and the reply and whose last entry
        is the turn's ``turn_end``."""
        model = self.sessions[session]
        before = self.store.sessions.get(session)
        assert before is not None
        ask = self._next("ask ")
        run = self.store.runs.admit(
            session, {"q": ask}, user_message={"role": "user", "content": ask}, start=True
        )
        self.store.runs.finish(run.id, "succeeded", assistant_message=REPLY)
        say(f"turn on {session}: {ask!r}")
        new = [e for e in self.store.sessions.entries(session) if e.seq >= before.next_seq]
        parent, said = model.leaf, []
        for e in new:
            assert e.parent_id == parent, (e, parent)  # a chain under the leaf
            payload: Any = e.payload
            message = payload.get("message") if e.kind == EntryKind.MESSAGE else None
            if message is not None:
                said.append((message["role"], message["content"]))
            role = None if message is None else message["role"]
            self._add(
                session, e.id, Node(parent, role, "" if message is None else message["content"])
            )
            parent = e.id
        assert said == [("user", ask), ("assistant", REPLY["content"])], said
        assert new[-1].kind == EntryKind.TURN_END, new[-1]
        model.turn_end = new[-1].id

    def _add(self, session: str, entry_id: str, node: Node) -> None:
        model = self.sessions[session]
        assert entry_id not in model.nodes, entry_id
        model.nodes[entry_id] = node
        model.leaf, model.updated = entry_id, self.clock()

    # -- forks -------------------------------------------------------------------------

    def _fork_outcome(self, session: str, request: str) -> tuple[str, ForkModel | None]:
        made = self.forks.get(request)
        if made is not None:
            return ("same" if made.source == session else "conflict"), made
        model = self.sessions[session]
        assert model.turn_end is not None  # every session has a completed turn
        context = [(role, text) for _, role, text in model.context(model.turn_end)]
        copied = model.copied(model.turn_end)
        labels = sorted((model.nodes[t].text, v) for t, v in model.labels(copied).items())
        title = model.title(copied)
        return "new", ForkModel(session, context, len(copied), title, labels, self.clock())

    @rule(session=st.sampled_from(SESSIONS), request=st.sampled_from(REQUESTS))
    def fork(self, session: str, request: str) -> None:
        """A fork by request id: new, the same fork again, or a conflict."""
        outcome, made = self._fork_outcome(session, request)
        got = attempt(self.store.forks.fork, session, request_id=request)
        say(f"fork {session} as {request}: {got[0]} ({outcome})")
        if outcome == "conflict":
            assert got == ("conflict",), got
            return
        assert got[0] == "ok" and made is not None, got
        fork = got[1]
        assert fork.source_session_id == session and fork.entries_copied == made.count, fork
        if made.fork_id is None:  # new, or made by an ambiguous commit: learned now
            assert fork.fork_session_id not in self.sessions, fork
            made.fork_id = fork.fork_session_id
        assert fork.fork_session_id == made.fork_id, (fork, made)
        self.forks[request] = made

    @rule(session=st.sampled_from(SESSIONS), request=st.sampled_from(REQUESTS))
    def ambiguous_fork(self, session: str, request: str) -> None:
        """A fork that commits while its caller sees OperationalError; a later
        fork under the same request id must answer with it."""
        outcome, made = self._fork_outcome(session, request)
        with lost_reply(self.store, "fork_session"):
            got = attempt(self.store.forks.fork, session, request_id=request)
        say(f"fork {session} as {request}, outcome unknown: {got[0]} ({outcome})")
        if outcome == "conflict":
            assert got == ("conflict",), got
            return
        assert got == ("unknown",), got  # it committed (a new fork, or the same one read)
        assert made is not None
        self.forks[request] = made  # a new fork's id is not known yet

    @rule(
        writer=st.sampled_from(WRITERS), session=st.sampled_from(SESSIONS), size=st.integers(1, 3)
    )
    def ambiguous_append(self, writer: str, session: str, size: int) -> None:
        """An append (``size`` 1) or a batch, each entry with its own id, that
        commits while its caller sees OperationalError, retried as the README
        says (look before writing it again): the retry under the same
        ``expected_leaf`` is refused with the leaf now its last id, and one
        without is refused as its first id taken."""
        store = self.of[writer]
        expected, refused = self._expected(writer, session)
        ids = [self._next("own-") for _ in range(size)]
        texts = [self._next("own ") for _ in ids]
        call: Callable[..., Any]
        args: tuple[Any, ...]
        if size == 1:
            operation, args = "append", (session, EntryKind.MESSAGE, self._message(texts[0]))
            call = store.sessions.append
        else:
            batch = [
                NewEntry(EntryKind.MESSAGE, self._message(t), entry_id=e)
                for e, t in zip(ids, texts, strict=True)
            ]
            operation, args, call = "append_many", (session, batch), store.sessions.append_many
        own = {"entry_id": ids[0]} if size == 1 else {}
        with lost_reply(store, operation):
            got = attempt(call, *args, expected_leaf=expected, **own)
        say(f"{writer} appends {ids} to {session} at {expected}, outcome unknown: {got[0]}")
        if refused is not None:
            assert got == refused, (got, refused)
            return
        assert got == ("unknown",), got
        parent = expected
        for e, t in zip(ids, texts, strict=True):
            self._add(session, e, Node(parent, "user", t))
            parent = e
        again = attempt(call, *args, expected_leaf=expected, **own)
        assert again == ("modified", ids[-1]), again  # the leaf is its last entry: it committed
        blind = attempt(call, *args, **own)
        assert blind == ("exists",), blind
        self.seen[writer, session] = ids[-1]

    @rule(
        writer=st.sampled_from(WRITERS), session=st.sampled_from(SESSIONS), pick=st.integers(0, 30)
    )
    def ambiguous_branch(self, writer: str, session: str, pick: int) -> None:
        """A branch that commits while its caller sees OperationalError; its
        retry under the same ``expected_leaf`` is refused with the leaf its
        target (or, the target being that leaf, moves nothing)."""
        model = self.sessions[session]
        ids = list(model.nodes)  # in sequence order: a script replays alike
        target = None if pick == 0 else ids[pick % len(ids)]
        expected, refused = self._expected(writer, session)
        with lost_reply(self.of[writer], "branch"):
            got = attempt(self.of[writer].sessions.branch, session, target, expected_leaf=expected)
        say(f"{writer} branches {session} from {expected} to {target}, outcome unknown: {got[0]}")
        if refused is not None:
            assert got == refused, (got, refused)
            return
        assert got == ("unknown",), got
        model.leaf, model.updated = target, self.clock()
        again = attempt(self.of[writer].sessions.branch, session, target, expected_leaf=expected)
        assert again == (("ok", None) if target == expected else ("modified", target)), again
        self.seen[writer, session] = target

    # -- invariants ------------------------------------------------------------------

    @checked
    def sessions_are_the_models(self) -> None:
        for sid, model in self.sessions.items():
            got = self.store.sessions.get(sid)
            assert got is not None, sid
            assert got.leaf_id == model.leaf, (sid, got.leaf_id, model.leaf)
            assert got.entry_count == len(model.nodes), (sid, got.entry_count, len(model.nodes))
            assert got.title == model.title(), (sid, got.title)
            assert got.updated_at == model.updated, (sid, got.updated_at, model.updated)
            assert self.store.sessions.labels(sid) == model.labels(), sid
            stored = {e.id: e.parent_id for e in self.store.sessions.entries(sid)}
            assert stored == {e: n.parent for e, n in model.nodes.items()}, sid
            for store in {id(self.store): self.store, id(self.other): self.other}.values():
                context = seen_context(store.sessions.replay(sid))
                assert context == model.context(), (sid, context, model.context())

    @checked
    def forks_are_the_models(self) -> None:
        count = self.store.sessions.count(include_sub_agents=True)
        assert count == len(self.sessions) + len(self.forks), (count, self.forks)
        for request, made in self.forks.items():
            if made.fork_id is None:
                continue
            got = self.store.sessions.get(made.fork_id)
            assert got is not None and got.entry_count == made.count, (request, got)
            assert got.title == made.title, (request, got.title, made.title)
            assert got.updated_at == made.created, (request, got.updated_at, made.created)
            texts = {e.id: text_of(e) for e in self.store.sessions.entries(made.fork_id)}
            labels = self.store.sessions.labels(made.fork_id)
            assert sorted((texts[t], v) for t, v in labels.items()) == made.labels, request
            context = [(r, t) for _, r, t in seen_context(self.store.sessions.replay(made.fork_id))]
            assert context == made.context, (request, context, made.context)


def machine(opener: StoreOpener) -> type[SessionsMachine]:
    """The machine with its stores (and ``w3``'s peer) from ``opener``."""
    return bound(SessionsMachine, opener, f"SessionsMachine[{opener.name}]")
