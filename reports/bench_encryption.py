"""Encryption's rows of ``make bench`` (issue 23, cost): the same work on an
encrypted store and on a clear one, as the ratio encrypted / clear.

Each backend gets two new databases side by side (DuckDB: two durable files
in the same folder; PostgreSQL: two schemas on the same server), one opened
with ``encryption=`` (a :class:`turnkeeper.LocalKeyProvider` key), one
without, and on each the same three operations:

- a fenced append (``sessions.append(..., lease=)``) of one message;
- the three-transaction turn (``bench.three_transaction_turn``: admit+start,
  ``append_many`` of 3, finish with its last entry, the reply and a plan);
- a cold replay of a :data:`bench.REPLAY_ENTRIES`-entry session, on a second
  store object with its replay cache off (``replay_cache_bytes=0``). The
  clear twin reads the session's stored snapshot; an encrypted store stores
  none (it would be a clear copy) and reads the branch's rows, opening each;
- the same cold replay with the clear twin's snapshot set aside
  (:func:`from_rows`: both read and decode every row, the clear one without
  opening), so that the cost of opening is told apart from the snapshot's
  absence.

Every repetition (:data:`bench.REPS`) times the backend's floor, then each
twin right after the other (the order alternating per repetition, so a drift
of the machine's load weighs on both alike): each figure is the median and
[min–max] of the per-repetition ratios. The statements a turn sends are
counted on both (``bench.turn_statements``). Where the time goes is measured
beside them, per call, with no database: sealing one payload, opening one
(AES-256-GCM and the text form, ``storage/crypto/seal.py``), the AES-GCM
decrypt alone inside that, and unwrapping a session's data key (the
provider's ``unwrap``, once per session per store object: the keyring
caches it).

Measured, never asserted; the bench refuses to time an "encrypted" twin whose
payloads are stored clear (:func:`sealed_check`). ``python reports/bench.py
encryption`` measures this section alone and merges it into the existing
``reports/bench.json`` (every other row kept as measured) and regenerates
``reports/BENCH.md`` from it.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from typing import Any

import turnkeeper
from turnkeeper import EntryKind

APPEND = "append (fenced)"
TURN = "turn, 3 transactions (admit+start, append_many, finish+entries)"
REPLAY = "replay ({entries} entries), cache off (clear: its stored snapshot; encrypted: its rows)"
ROWS = "replay ({entries} entries), cache off, both from their rows (clear: its snapshot set aside)"
MICRO_CALLS = 2000
"""Calls per timing of the per-payload figures (sealing, opening, unwrapping)."""


def provider() -> turnkeeper.LocalKeyProvider:
    """A new random master key for the encrypted twin."""
    return turnkeeper.LocalKeyProvider.from_text(turnkeeper.LocalKeyProvider.generate("bench"))


def sealed_check(store: turnkeeper.BaseStore, session_id: str, sealed: bool) -> None:
    """Refuse to time a twin that is not what it is named: every stored payload
    of ``session_id`` must be ciphertext (``enc1:``) when ``sealed``, and
    none may be when not.

    Raises:
        RuntimeError: a payload stored otherwise (names the session).
    """
    got = store.query(
        "SELECT count(*) AS n, count(*) FILTER (WHERE payload LIKE 'enc1:%') AS s "
        f"FROM entries WHERE session_id = '{session_id}'"
    ).to_pylist()[0]
    if got["n"] == 0 or got["s"] != (got["n"] if sealed else 0):
        kind = "sealed" if sealed else "clear"
        raise RuntimeError(
            f"the {kind} twin's session {session_id!r} holds {got['s']} sealed "
            f"payloads of {got['n']}: it would not measure what it is named"
        )


def from_rows(replay: Any) -> Any:
    """``replay`` (a call) run with the stored snapshots set aside: no snapshot
    is read (``storage.ops.replays._from_stored`` answers ``None``) and none
    is stored (``replay_snapshots.PERSIST_ROWS`` out of reach), restored
    after the call; the bench patches the store's module for this one call,
    nothing shipped changes."""
    from turnkeeper.storage.ops import replay_snapshots, replays

    def call() -> Any:
        stored, persist = replays._from_stored, replay_snapshots.PERSIST_ROWS
        replays._from_stored = lambda *_a, **_k: None  # type: ignore[assignment]
        replay_snapshots.PERSIST_ROWS = 1 << 62
        try:
            return replay()
        finally:
            replays._from_stored, replay_snapshots.PERSIST_ROWS = stored, persist

    return call


def twin(bench: Any, store: turnkeeper.BaseStore, cold: turnkeeper.BaseStore, sealed: bool) -> Any:
    """The four timed operations on one store (``cold``: the same database,
    replay cache off), its sessions written first; name → ``bench.Op``."""
    store.sessions.create("a")
    lease = store.leases.acquire("session:a", "bench", 3600, purpose="execution")
    store.sessions.create("runs")
    runs = store.leases.acquire("session:runs", "bench", 3600, purpose="execution")
    store.sessions.create("r")
    for done in range(0, bench.REPLAY_ENTRIES, 1000):
        count = min(1000, bench.REPLAY_ENTRIES - done)
        store.sessions.append_many("r", [(EntryKind.MESSAGE, bench.MSG)] * count)
    cold.sessions.replay("r")  # the clear twin stores its snapshot; both cache the data key
    sealed_check(store, "r", sealed)
    return {
        APPEND: bench.timed(
            lambda: store.sessions.append("a", EntryKind.MESSAGE, bench.MSG, lease=lease)
        ),
        TURN: bench.timed(lambda: bench.three_transaction_turn(store, "runs", runs, bench.USER)),
        REPLAY.format(entries=bench.REPLAY_ENTRIES): bench.timed(lambda: cold.sessions.replay("r")),
        ROWS.format(entries=bench.REPLAY_ENTRIES): bench.timed(
            from_rows(lambda: cold.sessions.replay("r"))
        ),
    }


def per_payload(bench: Any, keys: turnkeeper.LocalKeyProvider) -> dict[str, float]:
    """Microseconds per call, no database: sealing one message payload (the
    JSON of ``bench.MSG``), opening it, the AES-GCM decrypt alone within
    that (the ``cryptography`` call on the decoded bytes, associated data
    made), and unwrapping a data key with ``keys``; each the median over
    ``bench.REPS`` timings."""
    from turnkeeper.storage.crypto.seal import _HEADER, DataKey, _aad, text_bytes, wrap_context

    key = DataKey.new("s")
    text = json.dumps(bench.MSG)
    stored = key.seal_text("e", "payload", text)
    context = wrap_context("s", 1)
    wrapped = keys.wrap(key.key, context)
    raw = text_bytes(stored) or b""
    nonce, body = _HEADER.unpack_from(raw)[2], raw[_HEADER.size :]
    aad = _aad("s", "e", "payload", 1)
    if key._aead.decrypt(nonce, body, aad) != text.encode():  # the layout read right
        raise RuntimeError("the sealed value's layout is not the one timed")

    def each(fn: Any) -> float:
        def op() -> float:
            start = time.perf_counter()
            for _ in range(MICRO_CALLS):
                fn()
            return (time.perf_counter() - start) / MICRO_CALLS

        return statistics.median(bench.per_call(op) for _ in range(bench.REPS)) * 1e6

    return {
        "seal_us": round(each(lambda: key.seal_text("e", "payload", text)), 2),
        "open_us": round(each(lambda: key.open_text("e", "payload", stored)), 2),
        "aes_gcm_decrypt_us": round(each(lambda: key._aead.decrypt(nonce, body, aad)), 2),
        "unwrap_us": round(each(lambda: keys.unwrap(wrapped, keys.key_id, context)), 2),
        "payload_bytes": len(text),
    }


def measure(
    bench: Any,
    clear: turnkeeper.BaseStore,
    clear_cold: turnkeeper.BaseStore,
    sealed: turnkeeper.BaseStore,
    sealed_cold: turnkeeper.BaseStore,
    floor: Any,
    keys: turnkeeper.LocalKeyProvider,
) -> dict[str, Any]:
    """One backend's section: per operation the ratio encrypted / clear, each
    twin × the floor and in milliseconds (median [min–max] over
    ``bench.REPS``); the statements per turn of each; the per-payload
    figures (:func:`per_payload`); the machine's load average at the start."""
    load = [round(x, 2) for x in os.getloadavg()]
    ops = {
        "clear": twin(bench, clear, clear_cold, sealed=False),
        "encrypted": twin(bench, sealed, sealed_cold, sealed=True),
    }
    names = list(ops["clear"])
    spent: dict[str, dict[str, list[float]]] = {side: {name: [] for name in names} for side in ops}
    x_floor: dict[str, dict[str, list[float]]] = {
        side: {name: [] for name in names} for side in ops
    }
    floors: list[float] = []
    for rep in range(bench.REPS):
        order = ("clear", "encrypted") if rep % 2 == 0 else ("encrypted", "clear")
        for name in names:
            base = bench.per_call(floor)
            floors.append(base)
            for side in order:
                took = bench.per_call(ops[side][name])
                spent[side][name].append(took)
                x_floor[side][name].append(took / base)
    ratios = {
        name: [e / c for e, c in zip(spent["encrypted"][name], spent["clear"][name], strict=True)]
        for name in names
    }
    stats = {
        side: store.statement_stats() for side, store in (("clear", clear), ("encrypted", sealed))
    }
    return {
        "load_average": load,
        "reps": bench.REPS,
        "floor_ms": round(statistics.median(floors) * 1000, 3),
        "encrypted_over_clear": {name: bench._spread(r) for name, r in ratios.items()},
        "x_floor": {
            side: {name: bench._spread(r) for name, r in rows.items()}
            for side, rows in x_floor.items()
        },
        "ms": {
            side: {name: round(statistics.median(r) * 1000, 3) for name, r in rows.items()}
            for side, rows in spent.items()
        },
        "statements_per_turn": {
            "clear": bench.turn_statements(clear),
            "encrypted": bench.turn_statements(sealed),
        },
        "append_statements_per_call": {
            side: round(s["append"]["statements_per_call"], 2) for side, s in stats.items()
        },
        "per_payload": per_payload(bench, keys),
    }


def section(bench: Any, folder: str, pg_url: str = "") -> dict[str, dict[str, Any]]:
    """The section on DuckDB (two durable files in ``folder``, the floor's
    beside them) and, with ``pg_url``, on PostgreSQL (two new schemas there,
    the floor in the clear one's): backend name → :func:`measure`'s dict."""
    keys = provider()
    out: dict[str, dict[str, Any]] = {}
    clear_path, sealed_path = f"{folder}/enc-clear.duckdb", f"{folder}/enc-sealed.duckdb"
    with (
        turnkeeper.open_store(clear_path) as clear,
        turnkeeper.open_store(clear_path, replay_cache_bytes=0) as clear_cold,
        turnkeeper.open_store(sealed_path, encryption=keys) as sealed,
        turnkeeper.open_store(sealed_path, encryption=keys, replay_cache_bytes=0) as sealed_cold,
    ):
        floor = bench.duck_floor(folder)
        out["duckdb"] = measure(bench, clear, clear_cold, sealed, sealed_cold, floor, keys)
    if pg_url:
        clear_url, sealed_url = bench.pg_schema(pg_url), bench.pg_schema(pg_url)
        with (
            turnkeeper.open_store(clear_url) as clear,
            turnkeeper.open_store(clear_url, replay_cache_bytes=0) as clear_cold,
            turnkeeper.open_store(sealed_url, encryption=keys) as sealed,
            turnkeeper.open_store(sealed_url, encryption=keys, replay_cache_bytes=0) as cold,
        ):
            floor = bench.pg_floor(clear_url)
            out["postgres"] = measure(bench, clear, clear_cold, sealed, cold, floor, keys)
    return out


def _stmts(t: dict[str, int], phases: tuple[str, ...]) -> str:
    return f"{t['total']} ({' / '.join(str(t[op]) for op in phases)})"


def rows(sections: list[dict[str, Any] | None], phases: tuple[str, ...]) -> list[str]:
    """The table's rows of this section, one cell per backend (``None``: not
    measured there, ``—``); ``phases``: the turn's phases in order."""
    have = [s for s in sections if s is not None]
    if not have:
        return []

    def line(name: str, cell: Any) -> str:
        return f"| {name} | {' | '.join('—' if s is None else cell(s) for s in sections)} |"

    out = []
    for op in have[0]["encrypted_over_clear"]:
        out.append(
            line(
                f"encryption: {op}, encrypted / clear",
                lambda s, op=op: (
                    f"{s['encrypted_over_clear'][op]['median']}× "
                    f"[{s['encrypted_over_clear'][op]['min']}–"
                    f"{s['encrypted_over_clear'][op]['max']}] "
                    f"({s['ms']['encrypted'][op]} vs {s['ms']['clear'][op]} ms)"
                ),
            )
        )
    out.append(
        line(
            f"encryption: {TURN}: statements, encrypted vs clear",
            lambda s: (
                f"{_stmts(s['statements_per_turn']['encrypted'], phases)} vs "
                f"{_stmts(s['statements_per_turn']['clear'], phases)}"
            ),
        )
    )
    out.append(
        line(
            "encryption: append: statements per call, encrypted vs clear",
            lambda s: (
                f"{s['append_statements_per_call']['encrypted']} vs "
                f"{s['append_statements_per_call']['clear']}"
            ),
        )
    )
    out.append(
        line(
            "encryption, per call (no database): seal / open one payload (of it AES-GCM's "
            "decrypt) / unwrap a data key, µs",
            lambda s: (
                f"{s['per_payload']['seal_us']} / {s['per_payload']['open_us']} "
                f"({s['per_payload']['aes_gcm_decrypt_us']}) / {s['per_payload']['unwrap_us']} "
                f"({s['per_payload']['payload_bytes']} B)"
            ),
        )
    )
    return out


OPENING = (
    "profiled (cProfile of the encrypted cold replay on DuckDB): opening a payload is the "
    "text form's base64 decoded twice (once for the key version, `Keyring.open_text`, once "
    "more by `DataKey.open_text`), the key version read twice, the associated data packed per "
    "entry; AES-GCM's own decrypt is the smaller part; the data key is "
    "unwrapped once per session per store object (the keyring caches it), not per replay"
)
"""Where an encrypted replay's time goes beyond the figures' own split (the
profile this section was written with; the figures above are measured)."""


def note(named: dict[str, dict[str, Any] | None], cores: int) -> list[str]:
    """The notes on the section: how it was measured (alone, merged into the
    full run's file, or with it), and under load when the 1-minute load
    average at a backend's start was at least half the cores; then, per
    backend, the cold replay's ratio split into the snapshot's absence
    (clear from its rows / clear from its snapshot) and the opening
    (encrypted / clear, both from their rows), and a payload's opening
    against AES-GCM's decrypt alone (:data:`OPENING`)."""
    have = {n: s for n, s in named.items() if s is not None}
    if not have:
        return []
    loads = [s["load_average"] for s in have.values()]
    loaded = any(load[0] >= cores / 2 for load in loads)
    how = (
        "measured alone (`python reports/bench.py encryption`) and merged into the full run's "
        "figures"
        if any(s.get("alone") for s in have.values())
        else "measured with the rest"
    )
    at = ", ".join(f"{n} {s['load_average']}" for n, s in have.items())
    lines = [
        "## Encryption's cost (issue 23)",
        "",
        f"The encryption rows: {how}; load average at the start of each backend's: "
        f"{at} on {cores} cores"
        + (
            " (taken under load: each ratio compares twins timed one right after the other, "
            "but the milliseconds are a busy machine's)"
            if loaded
            else ""
        )
        + ".",
        "",
    ]
    split = []
    for name, s in have.items():
        snap = next((op for op in s["ms"]["clear"] if "stored snapshot" in op), None)
        rows = next((op for op in s["ms"]["clear"] if "from their rows" in op), None)
        if snap is None or rows is None:
            continue
        absent = s["ms"]["clear"][rows] / s["ms"]["clear"][snap]
        opening = s["encrypted_over_clear"][rows]["median"]
        p = s["per_payload"]
        split += [
            f"- {name}: the encrypted cold replay "
            f"({s['encrypted_over_clear'][snap]['median']}× clear) reads its rows, as an "
            f"encrypted store keeps no snapshot: the snapshot's absence is {absent:.3g}× "
            f"(clear from its rows / from its snapshot, medians) and the opening "
            f"{opening}× (encrypted / clear, both from their rows); opening a payload costs "
            f"{p['open_us']} µs, AES-GCM's decrypt {p['aes_gcm_decrypt_us']} µs of it."
        ]
    return lines + ([*split, f"- {OPENING}.", ""] if split else [])
