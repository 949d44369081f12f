"""One bad value never breaks analytics (issue 17, item 6): a store holding every
kind of value the store accepts (NUL, the PostgreSQL text code's escape
character U+E000 and what the code writes for NUL, JSON escapes spelled out,
invalid-JSON-looking text, rich markup, terminal escapes, 64-bit edge numbers,
nesting as deep as JSON text may go) is read by every analytics path, on both
backends: each report figure, the rendered report, ``--json``, ``--parquet``,
``sessions`` (list, search, show), ``audit``, ``export``, and ``query()`` over
the stored JSON (``json_sql``), and each gives back the exact values.

Before the fix, on PostgreSQL ``turnkeeper report`` exited 2 with
``DataError: unsupported Unicode escape sequence`` (``payload::json`` on a
payload holding ``\\u0000``), ``query()`` gave ``json`` values as Python
reprs and raised a bare ``ValueError`` on text cut inside the text code; on
both backends ``report`` and ``sessions`` died with rich's ``MarkupError`` on
a stored ``[/]``; and ``sessions --search`` never found text that JSON
escapes (a quote, a backslash, a newline, NUL).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner, Result
from conftest import new_pg_schema

import turnkeeper
from turnkeeper import DeliveryPlan, DeliveryStep, EntryKind, FinalizeRequest, ThreadRecord
from turnkeeper.cli import report
from turnkeeper.cli.main import cli
from turnkeeper.formats import pi
from turnkeeper.storage import backend

TEXTS = [
    "nul\x00inside",
    "\x00",
    "\ue000",
    "\ue000\ue001",
    "\ue000\ue000\ue001x\ue000",
    "\\u0000",
    "\\\\u0000",
    "\\\x00",
    "\\\\\\u0000\\",
    '{"a": [1, 2',
    "not json ] } \" ' \\",
    "[/] [bold red]markup[/]",
    "\x1b[31mred\x1b[0m\r\x07\x7f\x9b",
    "? %s $1 %_\\ -- /* ; '",
    "emoji 😀 \U0010ffff \uffff \u202e rtl \u2028",
    "line\nbreak\ttab",
    "",
]
"""Text the store keeps exactly, in payloads and free text."""

NUMBERS = [2**64 - 1, -(2**63), 1.7976931348623157e308, 5e-324, -0.0, 0.1, 10**18]
"""The JSON numbers at the edges of what the store accepts (64-bit integers,
finite doubles)."""

DEPTH = 250
"""Nesting depth of the deepest stored value (orjson writes up to 254 levels)."""


def nested(depth: int) -> Any:
    value: Any = {"leaf": "\x00"}
    for i in range(depth):
        value = [value] if i % 2 else {"k\x00\ue000": value}
    return value


SESSION = "s[/]\ue000?%_'\"😀"
"""A session id holding what ids may: markup, the text code's escape, SQL and
LIKE characters (ids hold no control characters)."""


@dataclass
class Stored:
    """A store filled with hostile values, closed; what was written."""

    db: str
    backend: str
    payloads: list[dict[str, Any]] = field(default_factory=list)
    providers: set[tuple[str, str, str]] = field(default_factory=set)
    user_turns: int = 0


def fill(store: turnkeeper.BaseStore, out: Stored) -> None:
    store.sessions.create(SESSION, cwd="\x00[/]\ue000", header={"x\x00": "\ue000\ue001"})
    store.sessions.set_title(SESSION, "title \x00 [/] \ue000")
    for i, text in enumerate(TEXTS):
        store.sessions.append(
            SESSION, EntryKind.MESSAGE, {"message": {"role": "user", "content": text}}
        )
        provider, model = TEXTS[-1 - i], text
        store.sessions.append(
            SESSION,
            EntryKind.MESSAGE,
            {
                "message": {
                    "role": "assistant",
                    "content": [{"type": "text", "text": text}],
                    "provider": provider,
                    "model": model,
                }
            },
        )
        out.providers.add(("assistant", provider, model))
        store.sessions.append(
            SESSION, EntryKind.MODEL_CHANGE, {"provider": text, "modelId": provider}
        )
        out.providers.add(("model_change", text, provider))
    out.user_turns = len(TEXTS)
    store.sessions.append(
        SESSION,
        EntryKind.CUSTOM,
        {
            "customType": "\x00",
            "numbers": NUMBERS,
            "keys": {text: text for text in TEXTS},
            "deep": nested(DEPTH),
        },
    )
    # run history: a model, an error, a tool reason and result, a delivery failure
    for i, text in enumerate(TEXTS[:4]):
        run = store.runs.admit(
            SESSION,
            {"text": text, "n": NUMBERS},
            user_message={"role": "user", "content": text},
            model=text or "m",
            start=True,
        )
        out.user_turns += 1
        key = f"{run.id}:call"
        store.tools.claim(
            key,
            SESSION,
            local_turn_id=run.turn_id,
            provider_call_id=f"c{i}",
            tool_name="tool[/]\ue000",
            side_effecting=False,
            arguments={"a": text},
            run_id=run.id,
        )
        store.tools.complete(key, {"out": text, "n": NUMBERS})
        plan = DeliveryPlan("chat", "room[/]", steps=(DeliveryStep("send", "message"),))
        store.runs.finish(run.id, "failed", error=text + "[/]", delivery_plan=plan)
        claim = store.outbox.claim(f"{run.id}:delivery:send", "outbox", ttl_s=30)
        store.outbox.finish(
            claim.id, "outbox", claim.lease_epoch, "failed", failure_code="code\x00[/]"
        )
    store.threads.finalize(FinalizeRequest(ThreadRecord("rec", key="k\ue000", state={"s": TEXTS})))
    out.payloads = [e.payload for e in store.sessions.entries(SESSION)]


@pytest.fixture(params=["duckdb", "postgres"])
def stored(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Stored]:
    if request.param == "postgres":
        request.applymarker(pytest.mark.postgres)
        db = new_pg_schema()
    else:
        db = str(tmp_path / "hostile.duckdb")
    out = Stored(db, request.param)
    with turnkeeper.open_store(db) as store:
        fill(store, out)
    yield out


def run(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def test_lone_surrogates_are_refused_and_nothing_is_stored() -> None:
    """The store never accepts a lone surrogate (UTF-8 has no form for it), so no
    analytics path ever meets one."""
    with turnkeeper.open_store(":memory:") as store:
        store.sessions.create("s")
        for bad in ("\ud800", "x\udfffy"):
            with pytest.raises(turnkeeper.InvalidInputError):
                store.sessions.append(
                    "s", EntryKind.MESSAGE, {"message": {"role": "user", "content": bad}}
                )
            with pytest.raises(turnkeeper.InvalidInputError):
                store.sessions.set_title("s", bad)
        assert store.sessions.entries("s") == []


def test_every_report_figure_reads_every_stored_value(stored: Stored) -> None:
    with turnkeeper.open_store(stored.db, read_only=True) as store:
        data = report.collect(store)
    assert data["turns_per_session"]["total"] == stored.user_turns
    models = {(r["source"], r["provider"], r["model"]) for r in data["models"]}
    assert models == stored.providers
    reasons = {(r["source"], r["reason"]) for r in data["run_history"]["failure_reasons"]}
    assert {("run", text + "[/]") for text in TEXTS[:4]} <= reasons
    assert ("delivery", "code\x00[/]") in reasons
    by_model = {r["model"] for r in data["run_history"]["runs_by_model_day"]}
    assert by_model == {text or "m" for text in TEXTS[:4]}


def test_the_report_command_renders_and_exports_every_value(stored: Stored, tmp_path: Path) -> None:
    tables = run("report", "--db", stored.db)
    assert tables.exit_code == 0, tables.output
    assert "[/] [bold red]markup[/]" in tables.output  # shown, never read as markup
    assert "\\x1b[31mred" in tables.output  # a terminal escape is spelled, never sent
    assert "\x1b" not in tables.output and "\x00" not in tables.output
    as_json = run("report", "--db", stored.db, "--json")
    assert as_json.exit_code == 0, as_json.output
    figures = json.loads(as_json.output)
    models = {(r["source"], r["provider"], r["model"]) for r in figures["models"]}
    assert models == stored.providers
    folder = tmp_path / "parquet"
    written = run("report", "--db", stored.db, "--parquet", str(folder))
    assert written.exit_code == 0, written.output
    entries = pq.read_table(folder / "entries.parquet").to_pylist()
    assert [orjson.loads(e["payload"]) for e in sorted(entries, key=lambda e: e["seq"])] == (
        stored.payloads
    )
    sessions = pq.read_table(folder / "sessions.parquet").to_pylist()
    assert [(s["id"], s["title"], s["cwd"]) for s in sessions] == [
        (SESSION, "title \x00 [/] \ue000", "\x00[/]\ue000")
    ]
    tools = pq.read_table(folder / "tool_executions.parquet").to_pylist()
    assert sorted(orjson.loads(t["result"])["out"] for t in tools) == sorted(TEXTS[:4])


def test_sessions_list_search_and_show_every_value(stored: Stored) -> None:
    listed = run("sessions", "--db", stored.db)
    assert listed.exit_code == 0, listed.output
    assert "title \\x00 [/]" in listed.output
    as_json = json.loads(run("sessions", "--db", stored.db, "--json").output)
    assert [s["id"] for s in as_json["sessions"]] == [SESSION]
    shown = run("sessions", "show", SESSION, "--db", stored.db)
    assert shown.exit_code == 0, shown.output
    assert "[/] [bold red]markup[/]" in shown.output
    assert "\x1b" not in shown.output and "\x00" not in shown.output
    searched = run("sessions", "--db", stored.db, "--json", "--search", 'not json ] } "')
    assert [s["id"] for s in json.loads(searched.output)["sessions"]] == [SESSION]


def test_session_search_finds_text_that_json_escapes(stored: Stored) -> None:
    """``search`` matches message text as written, though the stored JSON spells
    a quote, a backslash, a newline or NUL as an escape."""
    with turnkeeper.open_store(stored.db, read_only=True) as store:
        for text in [t for t in TEXTS if t] + ["[/]", '"', "\\", "\n", "\x00", "\ue000"]:
            found = store.sessions.list(search=text).sessions
            assert [s.id for s in found] == [SESSION], repr(text)
            assert store.sessions.count(search=text) == 1, repr(text)
        assert store.sessions.list(search="absent\x00text").sessions == ()
        assert store.sessions.count(search='"absent') == 0


def test_audit_and_export_keep_every_value(stored: Stored, tmp_path: Path) -> None:
    audited = run("audit", "--db", stored.db)
    assert audited.exit_code == 0, audited.output
    out = tmp_path / "export.jsonl"
    exported = run("export", SESSION, "--db", stored.db, "-o", str(out))
    assert exported.exit_code == 0, exported.output
    text = out.read_text(encoding="utf-8")
    assert text.endswith("\n")  # JSONL: lines end at "\n" only (U+2028 is text)
    lines = [orjson.loads(line) for line in text[:-1].split("\n")]
    assert lines[0]["id"] == SESSION and lines[0]["x\x00"] == "\ue000\ue001"
    base = ("type", "id", "parentId", "timestamp")
    assert [{k: v for k, v in e.items() if k not in base} for e in lines[1:]] == (stored.payloads)
    with turnkeeper.open_store(":memory:") as copy:  # and it imports back exactly
        pi.import_file(copy, out)
        assert [e.payload for e in copy.sessions.entries(SESSION)] == stored.payloads


def test_query_reads_every_stored_json_value(stored: Stored) -> None:
    with turnkeeper.open_store(stored.db, read_only=True) as store:
        payload = store.json_sql("payload")
        rows = store.query("SELECT payload FROM entries ORDER BY seq").to_pylist()
        assert [orjson.loads(r["payload"]) for r in rows] == stored.payloads
        users = store.query(
            f"SELECT {payload} -> 'message' ->> 'content' AS text FROM entries "
            f"WHERE kind = 'message' AND {payload} -> 'message' ->> 'role' = 'user' "
            "ORDER BY seq"
        ).to_pylist()
        assert [r["text"] for r in users][: len(TEXTS)] == TEXTS
        messages = store.query(
            f"SELECT {payload} -> 'message' AS m FROM entries WHERE kind = 'message' ORDER BY seq"
        ).to_pylist()
        expected = [p["message"] for p in stored.payloads if "message" in p]
        assert [orjson.loads(r["m"]) for r in messages] == expected
        custom = store.query(
            f"SELECT {payload} -> 'numbers' AS n, {payload} -> 'keys' AS k, "
            f"{payload} -> 'deep' AS d, {payload} ->> 'customType' AS t "
            "FROM entries WHERE kind = 'custom'"
        ).to_pylist()
        assert len(custom) == 1
        assert orjson.loads(custom[0]["n"]) == NUMBERS
        assert orjson.loads(custom[0]["k"]) == {text: text for text in TEXTS}
        assert orjson.loads(custom[0]["d"]) == nested(DEPTH)
        assert custom[0]["t"] == "\x00"
        for text in TEXTS:  # a parameter holding the value finds it
            hits = store.query(
                f"SELECT count(*) AS n FROM entries WHERE {payload} -> 'message' ->> 'content' = ?",
                [text],
            ).to_pylist()
            assert hits == [{"n": 1 + (text in TEXTS[:4])}], repr(text)  # runs repeat 4
        other = [store.json_sql(c) for c in ("request", "result", "state", "header")]
        found = store.snapshot(
            lambda snap: [
                snap.query(f"SELECT {other[0]} ->> 'text' AS v FROM execution_intents"),
                snap.query(f"SELECT {other[1]} ->> 'out' AS v FROM tool_executions"),
                snap.query(f"SELECT {other[2]} -> 's' AS v FROM thread_records"),
                snap.query(f"SELECT {other[3]} ->> ?::VARCHAR AS v FROM sessions", ["x\x00"]),
            ]
        )
        assert sorted(r["v"] for r in found[0].to_pylist()) == sorted(TEXTS[:4])
        assert sorted(r["v"] for r in found[1].to_pylist()) == sorted(TEXTS[:4])
        assert [orjson.loads(r["v"]) for r in found[2].to_pylist()] == [TEXTS]
        assert found[3].to_pylist() == [{"v": "\ue000\ue001"}]
        counted = store.query_batches(
            f"SELECT {payload} ->> 'customType' AS t FROM entries WHERE kind = 'custom'",
            lambda schema, batches: [r for b in batches for r in b.to_pylist()],
        )
        assert counted == [{"t": "\x00"}]


def test_query_gives_json_values_as_json_text(stored: Stored) -> None:
    """A ``json``/``jsonb`` result is JSON text on both backends (PostgreSQL's
    driver made it a Python object, which came back as its repr)."""
    with turnkeeper.open_store(stored.db, read_only=True) as store:
        literal = store.query(
            """SELECT CAST('{"a": [1, "\ue000", null]}' AS JSON) AS j"""
        ).to_pylist()
        assert orjson.loads(literal[0]["j"]) == {"a": [1, "\ue000", None]}
        payload = store.json_sql("payload")
        cast = "::jsonb" if stored.backend == "postgres" else ""
        rows = store.query(
            f"SELECT ({payload}){cast} -> 'keys' AS k FROM entries WHERE kind = 'custom'"
        ).to_pylist()
        assert orjson.loads(rows[0]["k"]) == {text: text for text in TEXTS}


def test_query_reads_text_cut_anywhere_in_a_stored_value(stored: Stored) -> None:
    """Text a query computes from stored text (a prefix cut anywhere, inside
    PostgreSQL's two-character code of U+0000 or U+E000 too) reads back: it
    raised a bare ``ValueError`` from the driver's loader."""
    with turnkeeper.open_store(stored.db, read_only=True) as store:
        cut = store.query(
            "SELECT left(payload, n) AS p FROM entries, generate_series(1, 80) AS r(n) "
            """WHERE payload LIKE '{"message":{"role":"user",%'"""
        ).to_pylist()
        whole = [orjson.dumps({"message": {"role": "user", "content": t}}).decode() for t in TEXTS]
        prefixes = {r["p"] for r in cut}
        assert len(prefixes) > 80
        for p in prefixes:  # a prefix, or one that cut a code in two and kept its escape
            cut_code = p[-1] == "\ue000"
            assert any(w.startswith(p) or (cut_code and w.startswith(p[:-1])) for w in whole)
        assert '{"message":{"role":"user","content":"\ue000' in prefixes


@pytest.mark.postgres
def test_an_escaped_backslash_before_u0000_is_no_nul_escape(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The guard in ``Dialect.json`` on PostgreSQL: only a ``\\u0000`` escape
    becomes the code of U+0000, never the text ``\\u0000`` (JSON ``\\\\u0000``,
    an escaped backslash then ``u0000``). Patched to replace every ``\\u0000``
    it meets, the text comes back changed or the document unreadable."""
    texts = ["\\u0000", "\\\\u0000", "\\\x00", "\\\\\\u0000\\", "a\x00\\u0000\x00"]
    with turnkeeper.open_store(new_pg_schema()) as store:
        store.sessions.create("s")
        for text in texts:
            store.sessions.append(
                "s", EntryKind.MESSAGE, {"message": {"role": "user", "content": text}}
            )

        def contents() -> list[Any]:
            payload = store.json_sql("payload")
            sql = f"SELECT {payload} -> 'message' ->> 'content' AS t FROM entries ORDER BY seq"
            return [r["t"] for r in store.query(sql).to_pylist()]

        assert contents() == texts
        monkeypatch.setattr(backend, "_PG_NUL_PATTERN", r"E'\\\\u0000'")
        monkeypatch.setattr(backend, "_PG_NUL_CODE", "chr(57344) || chr(57345)")
        try:
            broken = contents()
        except turnkeeper.DatabaseError:
            return
        assert broken != texts


WRONG_SHAPES: dict[str, Any] = {
    "runs.end_turn(status=[])": lambda s, run: s.runs.end_turn(run.turn_id, []),
    "runs.admit(resource_events=None)": lambda s, run: s.runs.admit(
        "h", {"a": 2}, resource_events=None, on_active="use_existing"
    ),
    "runs.admit(resource_events=5)": lambda s, run: s.runs.admit("h", {"a": 2}, resource_events=5),
    "bindings.transfer(leases=None)": lambda s, run: s.bindings.transfer(
        "tg", "c", "h", "h", leases=None
    ),
    "projects.delete(leases=None)": lambda s, run: s.projects.delete("p", leases=None),
    "projects.delete(leases='session:h')": lambda s, run: s.projects.delete(
        "p", leases="session:h"
    ),
}


@pytest.mark.parametrize("call", sorted(WRONG_SHAPES))
def test_an_argument_of_the_wrong_shape_is_invalid_input(call: str) -> None:
    """A list where text belongs, ``None`` or a number where a list does: each an
    ``InvalidInputError`` naming the argument (an attack helper saw bare
    ``TypeError`` from these five), and nothing is written."""
    with turnkeeper.open_store(":memory:") as store:
        store.sessions.create("h")
        run = store.runs.admit("h", {"a": 1}, start=True)
        before = store.query("SELECT count(*) AS n FROM run_events").to_pylist()
        with pytest.raises(turnkeeper.InvalidInputError):
            WRONG_SHAPES[call](store, run)
        assert store.query("SELECT count(*) AS n FROM run_events").to_pylist() == before
