"""What stays clear (issue 23): the clear facts of entry payloads.

``entries.role``, ``provider`` and ``model`` keep what ``turnkeeper report``
reads of a payload (``spec/clear_facts.py``), so that its figures never read
a payload that encryption at rest may seal. Shown here, on both backends:

- every write path stores them as :func:`clear_facts` derives them from the
  payload (appends alone and several, one statement or in a transaction,
  merged by DuckDB's group commit, a run's held entries, imports, forks,
  branch summaries, bulk loads), with a control that breaks one path;
- migration 33 fills the rows an older turnkeeper stored with the same rule
  in each engine's SQL, hostile values included (U+0000 in PostgreSQL's text
  code, U+E000, cuts at the bound, values that are not strings), with a
  control without the backfill;
- the report's ``turns`` and ``models`` over the columns equal the JSON
  queries it ran before over the real corpus sessions, imported.
"""

from __future__ import annotations

import random
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
import pytest

import turnkeeper
from turnkeeper import EntryKind
from turnkeeper.cli.report import SQL, collect
from turnkeeper.formats import import_file
from turnkeeper.spec.clear_facts import CUT, NAME_MAX, NONE, ClearFacts, bounded, clear_facts
from turnkeeper.spec.records import ImportBatch, ImportEntry
from turnkeeper.storage.crypto.keyring import PAYLOAD
from turnkeeper.storage.ops import session_rows

M = EntryKind.MESSAGE
AT = datetime(2026, 1, 2, tzinfo=UTC)

OLD_FIGURES = {
    "turns": (
        "WITH t AS (SELECT s.id, count(e.id) AS turns FROM sessions s LEFT JOIN ("
        "SELECT session_id, id FROM (SELECT session_id, id, {payload} AS p FROM entries "
        "WHERE kind = 'message') m WHERE (p -> 'message' ->> 'role') = 'user'"
        ") e ON e.session_id = s.id GROUP BY s.id) "
        "SELECT min(turns) AS min, round((avg(turns))::NUMERIC, 2)::DOUBLE PRECISION AS avg, "
        "max(turns) AS max, "
        "coalesce(sum(turns), 0)::BIGINT AS total FROM t"
    ),
    "models": (
        "SELECT source, provider, model, count(*) AS entries FROM ("
        "SELECT 'assistant' AS source, (p -> 'message' ->> 'provider') AS provider, "
        "(p -> 'message' ->> 'model') AS model FROM ("
        "SELECT {payload} AS p FROM entries WHERE kind = 'message') a "
        "WHERE (p -> 'message' ->> 'role') = 'assistant' "
        "UNION ALL SELECT 'model_change', (p ->> 'provider'), "
        "coalesce((p ->> 'modelId'), (p ->> 'model')) FROM ("
        "SELECT {payload} AS p FROM entries WHERE kind = 'model_change') c) m "
        "GROUP BY source, provider, model ORDER BY entries DESC, source, provider, model"
    ),
}
"""The report's two figures as it computed them before the clear columns
(api/cli/report.py at d197934): reading the payload JSON, the reference the
column queries must equal on a clear store."""


def user(text: str) -> dict[str, Any]:
    return {"message": {"role": "user", "content": text}}


def assistant(text: str, provider: Any = "anthropic", model: Any = "claude-x") -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": [{"type": "text", "text": text}],
        "provider": provider,
        "model": model,
    }


def stored_facts(store: turnkeeper.BaseStore) -> list[tuple[str, str, str, ClearFacts, Any]]:
    """Every entry as ``(session, id, kind, its stored facts, its payload decoded)``."""
    rows = store.query(
        "SELECT session_id, id, kind, role, provider, model, payload FROM entries "
        "ORDER BY session_id, seq"
    ).to_pylist()
    # a sealed payload (an encrypted configuration) opened as the store opens it
    payloads = store.db.read(
        "open",
        lambda tx: [
            tx.keys.open_json(tx, r["session_id"], r["id"], PAYLOAD, r["payload"]) for r in rows
        ],
    )
    return [
        (
            r["session_id"],
            r["id"],
            r["kind"],
            ClearFacts(r["role"], r["provider"], r["model"]),
            payload,
        )
        for r, payload in zip(rows, payloads, strict=True)
    ]


def assert_facts_derived(store: turnkeeper.BaseStore) -> dict[str, ClearFacts]:
    """Every entry's stored facts are its payload's (:func:`clear_facts`);
    returns them by ``session/id``."""
    out: dict[str, ClearFacts] = {}
    for sid, eid, kind, facts, payload in stored_facts(store):
        assert facts == clear_facts(kind, payload), (sid, eid, kind, payload)
        out[f"{sid}/{eid}"] = facts
    return out


# -- the pure rule ------------------------------------------------------------------


def test_the_rule_reads_role_and_the_models_and_nothing_else() -> None:
    msg = {"message": assistant("hi", "openai", "gpt-5")}
    assert clear_facts("message", msg) == ("assistant", "openai", "gpt-5")
    # a user message's role only, whatever else its message holds
    assert clear_facts("message", {"message": {"role": "user", "model": "m"}}) == ClearFacts("user")
    assert clear_facts("message", {"message": "text"}) == NONE
    assert clear_facts("model_change", {"provider": "xai", "modelId": "grok"}) == (
        None,
        "xai",
        "grok",
    )
    # pi's modelId, else model where modelId is absent or null (the report's coalesce)
    assert clear_facts("model_change", {"provider": "p", "model": "m"}) == (None, "p", "m")
    assert clear_facts("model_change", {"modelId": None, "model": "m"}).model == "m"
    assert clear_facts("model_change", {"modelId": 5, "model": "m"}).model is None
    for kind in ("custom", "compaction", "custom_message", "turn_end", "unknown_kind"):
        assert clear_facts(kind, {"message": assistant("x"), "provider": "p"}) == NONE
    # values that are not JSON strings are not names
    for odd in (None, 5, 1.5, True, {"a": 1}, ["m"]):
        assert clear_facts("message", {"message": assistant("x", odd, odd)}) == ClearFacts(
            "assistant"
        )


def test_a_fact_is_bounded_and_a_cut_one_says_so() -> None:
    assert bounded("m" * NAME_MAX) == "m" * NAME_MAX
    cut = bounded("m" * (NAME_MAX + 1))
    assert cut == "m" * (NAME_MAX - 1) + CUT and len(cut) == NAME_MAX
    emoji = "😀" * 300  # counted in code points, as SQL's length counts them
    assert bounded(emoji) == "😀" * (NAME_MAX - 1) + CUT
    long_role = {"message": {"role": "r" * 1000, "content": "x"}}
    assert clear_facts("message", long_role).role == "r" * (NAME_MAX - 1) + CUT


# -- every write path stores them ----------------------------------------------------


def _write_every_path(store: turnkeeper.BaseStore) -> dict[str, ClearFacts]:
    """Entries written by every path that inserts into ``entries``; the facts
    some of them must have, by ``session/id``."""
    expected: dict[str, ClearFacts] = {}
    store.sessions.create("w")
    one = store.sessions.append("w", M, user("hello"))  # one entry
    expected[f"w/{one.id}"] = ClearFacts("user")
    many = store.sessions.append_many(  # several
        "w",
        [
            (M, {"message": assistant("a", "openai", "gpt\x00odd")}),
            (EntryKind.MODEL_CHANGE, {"provider": "xai", "modelId": "grok-4"}),
            (M, {"message": {"role": "user", "content": "x", "model": "not-read"}}),
        ],
    )
    expected[f"w/{many[0].id}"] = ClearFacts("assistant", "openai", "gpt\x00odd")
    expected[f"w/{many[1].id}"] = ClearFacts(None, "xai", "grok-4")
    expected[f"w/{many[2].id}"] = ClearFacts("user")
    bulk = store.sessions.append_many(  # more rows than a list insert takes (bulk load)
        "w", [(M, {"message": assistant(str(i), "p", f"m{i % 3}")}) for i in range(300)]
    )
    expected[f"w/{bulk[-1].id}"] = ClearFacts("assistant", "p", "m2")
    summary = store.sessions.branch_with_summary("w", one.id, "back")
    expected[f"w/{summary.id}"] = NONE
    # a run: admission and finish write held chains (user message, turn entries, reply)
    run = store.runs.admit("w", {"prompt": "go"}, user_message={"role": "user", "content": "go"})
    store.runs.start(run.id)
    store.runs.finish(
        run.id, "succeeded", assistant_message=assistant("done", "anthropic", "opus\ue000")
    )
    expected[f"w/{run.id}:user"] = ClearFacts("user")
    expected[f"w/{run.id}:assistant"] = ClearFacts("assistant", "anthropic", "opus\ue000")
    # an import (chunked; COPY on PostgreSQL)
    entries = [
        ImportEntry("i1", None, "message", AT, user("imported")),
        ImportEntry("i2", "i1", "message", AT, {"message": assistant("r", "imp", "m-imp")}),
        ImportEntry("i3", "i2", "model_change", AT, {"provider": "q", "modelId": "r" * 300}),
        ImportEntry("i4", "i3", "odd_kind", AT, {"message": assistant("x")}),
    ]
    store.sessions.import_batch(ImportBatch("imp", "/w", AT, {}, entries, "i4"))
    expected["imp/i2"] = ClearFacts("assistant", "imp", "m-imp")
    expected["imp/i3"] = ClearFacts(None, "q", "r" * (NAME_MAX - 1) + CUT)
    expected["imp/i4"] = NONE
    # a fork copies them
    fork = store.forks.fork("w", request_id="f1", boundary_turn_id=run.turn_id)
    copied = store.sessions.entries(fork.fork_session_id)
    reply = next(
        e
        for e in copied
        if e.kind == M
        and e.payload["message"]["content"] != "go"
        and e.payload["message"].get("model") == "opus\ue000"
    )
    expected[f"{fork.fork_session_id}/{reply.id}"] = clear_facts(M, reply.payload)
    return expected


def test_every_write_path_stores_the_facts_of_its_payload(store: turnkeeper.BaseStore) -> None:
    expected = _write_every_path(store)
    got = assert_facts_derived(store)
    assert {k: got[k] for k in expected} == expected
    # not vacuous: the forked reply has a model, and the fork copied every fact it had
    forked = [k for k in expected if not k.startswith(("w/", "imp/"))]
    assert expected[forked[0]].model == "opus\ue000"
    assert sum(1 for f in got.values() if f.model is not None) > 300


def test_control_a_path_without_the_facts_is_caught(
    store: turnkeeper.BaseStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Control: with the drafts' facts cut (what a write path that forgot them
    stores), the check above fails."""
    monkeypatch.setattr(session_rows, "clear_facts", lambda kind, payload: NONE)
    _write_every_path(store)
    with pytest.raises(AssertionError):
        assert_facts_derived(store)


def test_merged_appends_store_the_facts(duck_real_store: turnkeeper.DuckDBStore) -> None:
    """DuckDB's group commit merges queued appends into one insert (its own rows)."""
    from test_group_commit import grouped, queued_together

    store = duck_real_store
    for i in range(6):
        store.sessions.create(f"g{i}")

    def write(i: int) -> Any:
        if i % 2:
            return store.sessions.append(f"g{i}", M, {"message": assistant("x", "p", f"m{i}")})
        return store.sessions.append_many(
            f"g{i}", [(M, user("q")), (M, {"message": assistant("y", "p", f"n{i}")})]
        )

    got = queued_together(store, [lambda i=i: write(i) for i in range(6)])
    assert not [g for g in got if isinstance(g, BaseException)], got
    assert grouped(store, "append") + grouped(store, "append_many") >= 2
    facts = assert_facts_derived(store)
    assert sorted(f.model for f in facts.values() if f.model) == sorted(
        [f"m{i}" for i in (1, 3, 5)] + [f"n{i}" for i in (0, 2, 4)]
    )


# -- the report's figures --------------------------------------------------------------


def _figures(store: turnkeeper.BaseStore) -> dict[str, Any]:
    payload = store.json_sql("payload")
    return {
        name: (
            store.query(OLD_FIGURES[name].format(payload=payload)).to_pylist(),
            store.query(SQL[name]).to_pylist(),
        )
        for name in OLD_FIGURES
    }


def test_turns_and_models_equal_the_json_queries_over_the_corpus(
    real_store: turnkeeper.BaseStore, corpus_dir: Path
) -> None:
    """The corpus's pi, Claude Code and Codex sessions imported (and a session
    of odd names: U+0000, U+E000, markup), the figures over the columns equal
    the ones the report computed from the payload JSON before; and the whole
    report (``--json``'s figures) stays the same once no payload is JSON. (A
    clear store: the reference reads payload JSON; the last step stands in for
    sealing.)"""
    store = real_store
    files = sorted(
        p
        for pattern in ("pi/*.jsonl", "codex/*.jsonl", "claude-code/*.jsonl.gz")
        for p in corpus_dir.glob(pattern)
    )
    assert len(files) >= 6
    for path in files:
        import_file(store, path)
    store.sessions.create("odd")
    store.sessions.append_many(
        "odd",
        [
            (M, user("q")),
            (M, {"message": assistant("a", "p\x00", "[/]\ue000")}),
            (M, {"message": assistant("b", None, "only-model")}),
            (EntryKind.MODEL_CHANGE, {"provider": "x\x00", "modelId": "\ue000y"}),
        ],
    )
    figures = _figures(store)
    for name, (old, new) in figures.items():
        assert new == old, name
    before = collect(store)
    # every payload replaced by text that is no JSON, as encryption at rest seals it:
    # the whole report is unchanged, while the JSON queries no longer run
    store.db.write("seal", lambda tx: tx.exec("UPDATE entries SET payload = 'enc1:' || id"))
    assert collect(store) == before
    with pytest.raises(turnkeeper.DatabaseError):
        _figures(store)
    turns, models = figures["turns"][1][0], figures["models"][1]
    assert turns["total"] >= 300 and turns["max"] > turns["min"] > 0
    assert {m["source"] for m in models} == {"assistant", "model_change"}
    assert ("assistant", "p\x00", "[/]\ue000") in {
        (m["source"], m["provider"], m["model"]) for m in models
    }
    assert len(models) >= 8


# -- migration 33 ----------------------------------------------------------------------

HOSTILE_MODELS: list[Any] = [
    "plain",
    "nul\x00inside",
    "\ue000escape\ue000\ue001",
    "m" * NAME_MAX,
    "m" * (NAME_MAX + 1),
    "x" * (NAME_MAX - 2) + "\x00" + "y" * 10,  # the cut keeps U+0000 whole (one character)
    "x" * (NAME_MAX - 2) + "\ue000\x00" + "y",
    "😀" * 250,
    "e\u0301" * 150,
    None,
    5,
    {"id": "m"},
    True,
]


ALPHABET = ["x", "\x00", "\ue000", "\ue001", '"', "\\", "\\u0000", "é", "😀", "e\u0301", "\n"]


def random_names(n: int) -> list[str]:
    """``n`` names of :data:`ALPHABET`'s pieces (seeded), most near the bound."""
    rng = random.Random(33)
    out = []
    for _ in range(n):
        size = rng.choice([rng.randint(1, 20), rng.randint(NAME_MAX - 8, NAME_MAX + 8)])
        text = ""
        while len(text) < size:
            text += rng.choice(ALPHABET)
        out.append(text[:size])
    return out


def _old_rows(store: turnkeeper.BaseStore) -> dict[str, str]:
    store.sessions.create("h")
    store.sessions.append("h", M, user("hi"))
    store.sessions.append("h", M, {"message": {"role": "r\x00" * 150, "content": "x"}})
    store.sessions.append_many(
        "h", [(M, {"message": assistant("r", name, name[::-1])}) for name in random_names(120)]
    )
    for model in HOSTILE_MODELS:
        store.sessions.append("h", M, {"message": assistant("a", "prov\x00", model)})
    for model in HOSTILE_MODELS:
        if isinstance(model, str):
            store.sessions.append(
                "h", EntryKind.MODEL_CHANGE, {"provider": model, "modelId": model}
            )
    store.sessions.append("h", EntryKind.CUSTOM, {"customType": "c", "message": assistant("z")})
    store.sessions.append("h", M, user("to be sealed"), entry_id="sealed")
    store.sessions.append(
        "h", EntryKind.MODEL_CHANGE, {"provider": "p", "modelId": "x"}, entry_id="fallback"
    )
    return {}


def _forge(backend: str, where: str) -> None:
    """What the API cannot write, set by hand in the old store: a model change
    whose modelId is null (the fallback to ``model``), and a payload that is not
    JSON (as a value sealed by encryption at rest would be)."""
    sets = [
        ("fallback", '{"provider":"p","modelId":null,"model":"from-model"}'),
        ("sealed", "enc1:AAAA"),
    ]
    sql = "UPDATE entries SET payload = ? WHERE session_id = 'h' AND id = ?"
    if backend == "postgres":
        import psycopg

        with psycopg.connect(where) as con:
            for eid, text in sets:
                assert con.execute(sql.replace("?", "%s"), [text, eid]).rowcount == 1
    else:
        import duckdb

        with duckdb.connect(where) as con:
            for eid, text in sets:
                assert con.execute(sql, [text, eid]).fetchone() == (1,)


def _upgraded_facts(
    store: turnkeeper.BaseStore, session_id: str = "h"
) -> dict[str, tuple[ClearFacts, ClearFacts]]:
    """Every entry of the session: (stored facts, the rule's facts of its payload)."""
    rows = store.query(
        "SELECT id, kind, payload, role, provider, model FROM entries WHERE session_id = ?",
        [session_id],
    ).to_pylist()
    out = {}
    for r in rows:
        stored = ClearFacts(r["role"], r["provider"], r["model"])
        text = r["payload"]
        derived = clear_facts(r["kind"], orjson.loads(text)) if text.startswith("{") else NONE
        out[r["id"]] = (stored, derived)
    return out


@pytest.mark.parametrize("backend", ["duckdb", "postgres"])
def test_migration_33_fills_the_facts_of_what_an_older_turnkeeper_stored(
    backend: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store at schema 32 (entries without the columns) opened by this
    turnkeeper: each entry's facts are what :func:`clear_facts` derives, for
    every hostile value, and the store goes on writing them."""
    from older_stores import store_at

    where = store_at(backend, 32, tmp_path, monkeypatch, _old_rows)
    _forge(backend, where)
    with turnkeeper.open_store(where) as store:
        assert store.schema_version() == turnkeeper.SCHEMA_VERSION
        facts = _upgraded_facts(store)
        for eid, (stored, derived) in facts.items():
            assert stored == derived, eid
        assert facts["fallback"][0] == ClearFacts(None, "p", "from-model")
        assert facts["sealed"][0] == NONE  # not JSON: left NULL, the migration did not fail
        models = {f[0].model for f in facts.values()}
        assert "x" * (NAME_MAX - 2) + "\x00" + CUT in models
        assert "x" * (NAME_MAX - 2) + "\ue000" + CUT in models
        assert "nul\x00inside" in models and "m" * (NAME_MAX - 1) + CUT in models
        assistants = sum(1 for f in facts.values() if f[0].role == "assistant")
        assert assistants == len(HOSTILE_MODELS) + 120
        assert sum(1 for f in facts.values() if (f[0].model or "").endswith(CUT)) > 30
        store.sessions.create("n")  # and it goes on (h holds a forged payload no read decodes)
        store.sessions.append("n", M, {"message": assistant("n", "p", "new")})
        leaf = store.sessions.get("n").leaf_id
        assert _upgraded_facts(store, "n")[leaf] == (ClearFacts("assistant", "p", "new"),) * 2


@pytest.mark.parametrize("backend", ["duckdb", "postgres"])
def test_control_without_the_backfill_the_upgrade_check_fails(
    backend: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Control: version 33 without its dialect part (the backfill) leaves the
    old rows' facts NULL, and the check above finds them."""
    from older_stores import _database, store_at

    from turnkeeper.storage.migrations import load

    where = store_at(backend, 32, tmp_path, monkeypatch, _old_rows)
    db = _database(backend)
    cut = [(v, sql) if v != 33 else (33, dict(load())[33]) for v, sql in db.MIGRATIONS]
    monkeypatch.setattr(db.Database, "migrations", lambda self: cut)
    with turnkeeper.open_store(where) as store:
        facts = _upgraded_facts(store)
        wrong = [eid for eid, (stored, derived) in facts.items() if stored != derived]
        assert len(wrong) > len(HOSTILE_MODELS)
