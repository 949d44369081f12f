"""Where a DuckDB turn's time goes (issue 21, part 2): the figures of
``docs/duckdb-turn-profile.md``.

``python reports/duck_turn_profile.py`` runs :func:`bench.three_transaction_turn`
on a durable file after a warm-up and prints, as markdown:

- per statement, in the turn's order: its wall time (``Tx._execute``, the
  Python call included), DuckDB's own total for it and the part spent
  planning (binder + optimizer + physical planner) and running its operators
  (``enable_profiling``, ``profiling_coverage = 'ALL'``, read from the cursor
  after the statement), and its SQL's start; medians over :data:`TURNS` turns;
- the turn's wall time, the store's Python outside statements, the floor
  (``bench.duck_floor``) and the same rows written by hand
  (:func:`by_hand`), each the median [min–max] over :data:`REPS`
  repetitions, interleaved as ``bench.py`` times them;
- the write-ahead log's growth per turn and DuckDB's checkpoint threshold;
- the keys and indexes each table the turn writes maintains.

Profiling costs time of its own, so the per-statement DuckDB figures come from
a second store object whose file has profiling on; the wall figures come from
a store without it. Measured, never asserted.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import duckdb

import turnkeeper
from turnkeeper.storage.duck import dialect, files
from turnkeeper.storage.duck import tx as duck_tx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench import USER, duck_floor, per_call, three_transaction_turn, timed

TURNS = int(os.environ.get("TURNKEEPER_PROFILE_TURNS", "40"))
REPS = int(os.environ.get("TURNKEEPER_BENCH_REPS", "5"))
WARM = int(os.environ.get("TURNKEEPER_PROFILE_WARM", "20"))
TABLES = (
    "leases",
    "sessions",
    "execution_intents",
    "runs",
    "active_runs",
    "run_events",
    "entries",
    "conversation_turns",
    "delivery_intents",
    "delivery_operations",
    "delivery_events",
)
"""The tables one turn reads (the lease) or writes."""

PROFILED = "profiled"
"""A file whose folder has this name is opened with DuckDB's profiling on."""
DEFAULT_THREADS = "default-threads"
"""A file whose folder has this name is opened with DuckDB's default worker
threads (one per core) instead of the store's ``threads = 1``: the step's
before (``storage/duck/dialect.py`` ``THREADS``)."""

_configure = files.configure


def _under(con: duckdb.DuckDBPyConnection, folder: str) -> bool:
    row = con.execute(
        "SELECT path FROM duckdb_databases() WHERE database_name = current_database()"
    ).fetchone()
    return row is not None and f"/{folder}/" in str(row[0])


def _profiled(con: duckdb.DuckDBPyConnection) -> bool:
    return _under(con, PROFILED)


def _configure_profiled(con: duckdb.DuckDBPyConnection) -> None:
    """The store's settings; for a file under a :data:`PROFILED` folder all but
    the configuration's lock, so that each cursor can turn DuckDB's profiler on
    (a per-connection setting) as :func:`_traced` first meets it; under a
    :data:`DEFAULT_THREADS` folder all but ``threads``."""
    skip = set()
    if _profiled(con):
        skip.add("lock_configuration")
    if _under(con, DEFAULT_THREADS) or (_profiled(con) and _before()):
        skip.add(dialect.THREADS[0])
    for name, _, statement in dialect.CONNECTION_SETTINGS:
        if name not in skip:
            con.execute(statement)


def _before() -> bool:
    """Whether the traced and profiled turns run at DuckDB's default threads."""
    return os.environ.get("TURNKEEPER_PROFILE_THREADS") == "default"


files.configure = _configure_profiled

_execute = duck_tx.Tx._execute
_trace: list[list[Any]] | None = None
_seen: set[int] = set()
"""While set: ``[sql, wall seconds, cursor]`` per statement the store runs."""


def _traced(self: duck_tx.Tx, sql: str, params: Any) -> duckdb.DuckDBPyConnection:
    if _trace is None:
        return _execute(self, sql, params)
    _collect()  # the previous statement's profile, before this one replaces it
    if id(self.cursor) not in _seen:
        _seen.add(id(self.cursor))
        if _profiled(self.cursor):
            self.cursor.execute("SET enable_profiling = 'no_output'")
            self.cursor.execute("SET profiling_coverage = 'ALL'")
    start = time.perf_counter()
    result = _execute(self, sql, params)
    _trace.append([sql, time.perf_counter() - start, self.cursor, start])
    return result


def _collect() -> None:
    """Replace the last traced statement's cursor by DuckDB's profile of it."""
    if _trace and isinstance(_trace[-1][2], duckdb.DuckDBPyConnection):
        cursor = _trace[-1][2]
        try:
            _trace[-1][2] = json.loads(cursor.get_profiling_information(format="json"))
        except duckdb.Error:
            _trace[-1][2] = {}


_rows = duck_tx.Tx.rows


def _traced_rows(
    self: duck_tx.Tx, sql: str, params: Any = (), *, binary: bool = False
) -> list[tuple[Any, ...]]:
    """``Tx.rows`` with its fetch counted in the statement's wall time."""
    if _trace is None:
        return _rows(self, sql, params, binary=binary)
    before = len(_trace)
    found = _rows(self, sql, params, binary=binary)
    fetched = time.perf_counter()
    if len(_trace) == before + 1:
        _trace[-1][1] = fetched - _trace[-1][3]
    return found


duck_tx.Tx._execute = _traced  # type: ignore[method-assign]
duck_tx.Tx.rows = _traced_rows  # type: ignore[method-assign]


def traced_turns(
    stores: list[tuple[turnkeeper.BaseStore, turnkeeper.Lease]],
) -> list[tuple[list[list[list[Any]]], list[float]]]:
    """:data:`TURNS` turns on each of ``stores`` (one turn on each in turn, so
    that a change of load falls on all alike): per store, each turn's
    statements, ``[sql, wall s, DuckDB profile, start]`` (a read's wall
    includes its fetch), and each turn's wall seconds."""
    global _trace
    out: list[tuple[list[list[list[Any]]], list[float]]] = [([], []) for _ in stores]
    for _ in range(TURNS):
        for (store, lease), (turns, walls) in zip(stores, out, strict=True):
            _trace = []
            start = time.perf_counter()
            three_transaction_turn(store, "runs", lease, USER)
            walls.append(time.perf_counter() - start)
            _collect()
            turns.append(_trace)
            _trace = None
    return out


def _phases(profile: dict[str, Any]) -> tuple[float, float, float]:
    """DuckDB's total, planning (binder, optimizer, physical plan) and operator
    CPU seconds of one statement (NaN where the profile lacks them)."""
    nan = float("nan")
    if not profile:
        return nan, nan, nan
    plan = sum(profile.get(k, {}).get("total_time", 0.0) for k in ("planner", "optimizer"))
    plan += profile.get("physical_planner", {}).get("total_time", 0.0)
    query = profile.get("query", {})
    return query.get("total_time", nan), plan, query.get("cpu_time", nan)


def statement_table(walls: list[list[list[Any]]], profiled: list[list[list[Any]]]) -> str:
    """The per-statement table (milliseconds, medians over the turns)."""
    by_pos: dict[int, list[float]] = defaultdict(list)
    duck: dict[int, list[tuple[float, float, float, float]]] = defaultdict(list)
    sqls: dict[int, str] = {}
    for turn in walls:
        for i, (sql, wall, *_) in enumerate(turn):
            by_pos[i].append(wall)
            sqls[i] = sql
    for turn in profiled:
        for i, (_, wall, profile, _) in enumerate(turn):
            total, plan, cpu = _phases(profile)
            duck[i].append((total, plan, cpu, wall - total))
    lines = [
        "| # | wall (ms) | DuckDB total | planning | operators | client side | statement |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    sums = [0.0] * 5
    for i in sorted(by_pos):
        wall = statistics.median(by_pos[i]) * 1000
        total, plan, cpu, client = (
            statistics.median(p[k] for p in duck[i]) * 1000 for k in range(4)
        )
        text = " ".join(sqls[i].split())
        head = text[:70].replace("|", "\\|") + ("…" if len(text) > 70 else "")
        lines.append(
            f"| {i + 1} | {wall:.3f} | {total:.3f} | {plan:.3f} | {cpu:.3f} | "
            f"{client:.3f} | `{head}` |"
        )
        for k, v in enumerate((wall, total, plan, cpu, client)):
            sums[k] += v
    lines.append(
        f"| sum | {sums[0]:.3f} | {sums[1]:.3f} | {sums[2]:.3f} | {sums[3]:.3f} | "
        f"{sums[4]:.3f} | {len(by_pos)} statements |"
    )
    return "\n".join(lines)


def keys_and_indexes(path: str) -> str:
    """Each table's keys and indexes (each one an ART DuckDB maintains per insert)."""
    con = duckdb.connect(path, read_only=True)
    lines = ["| table | columns | PRIMARY KEY / UNIQUE (ART each) | other indexes |"]
    lines.append("| --- | ---: | --- | --- |")
    for table in TABLES:
        keys = con.execute(
            "SELECT constraint_type, constraint_column_names FROM duckdb_constraints() "
            "WHERE table_name = ? AND constraint_type IN ('PRIMARY KEY', 'UNIQUE')",
            [table],
        ).fetchall()
        index = con.execute(
            "SELECT index_name, expressions FROM duckdb_indexes() WHERE table_name = ?", [table]
        ).fetchall()
        columns = con.execute(
            "SELECT count(*) FROM duckdb_columns() WHERE table_name = ?", [table]
        ).fetchone()
        key_text = "; ".join(f"{kind} ({', '.join(cols)})" for kind, cols in keys)
        index_text = "; ".join(f"{name} {expr}" for name, expr in index) or "—"
        lines.append(
            f"| {table} | {columns[0] if columns else 0} | {key_text or '—'} | {index_text} |"
        )
    con.close()
    return "\n".join(lines)


class _Rows:
    """``execute(sql, params).fetchall()/fetchone()`` over ``Store.query``."""

    def __init__(self, store: turnkeeper.BaseStore) -> None:
        self._store = store
        self._rows: list[tuple[Any, ...]] = []

    def execute(self, sql: str, params: list[Any]) -> _Rows:
        table = self._store.query(sql, params)
        self._rows = list(zip(*(column.to_pylist() for column in table.columns), strict=True))
        return self

    def fetchall(self) -> list[tuple[Any, ...]]:
        return self._rows

    def fetchone(self) -> tuple[Any, ...] | None:
        return self._rows[0] if self._rows else None


def written_rows(con: _Rows, run_id: str) -> dict[str, list[tuple[Any, ...]]]:
    """The rows one turn (its run ``run_id``) left in each table it writes."""
    run = con.execute("SELECT intent_id, session_id FROM runs WHERE id = ?", [run_id]).fetchone()
    assert run is not None
    intent_id, session_id = run
    turn_row = con.execute("SELECT * FROM conversation_turns WHERE run_id = ?", [run_id]).fetchall()
    first, last = con.execute(
        "SELECT start_seq, end_seq FROM conversation_turns WHERE run_id = ?", [run_id]
    ).fetchone() or (0, 0)
    found = con.execute("SELECT id FROM delivery_intents WHERE run_id = ?", [run_id]).fetchone()
    delivery = found[0] if found else ""
    return {
        "execution_intents": con.execute(
            "SELECT * FROM execution_intents WHERE id = ?", [intent_id]
        ).fetchall(),
        "runs": con.execute("SELECT * FROM runs WHERE id = ?", [run_id]).fetchall(),
        "active_runs": [(session_id, run_id)],
        "run_events": con.execute("SELECT * FROM run_events WHERE run_id = ?", [run_id]).fetchall(),
        "entries": con.execute(
            "SELECT * FROM entries WHERE session_id = ? AND seq BETWEEN ? AND ? ORDER BY seq",
            [session_id, first, last],
        ).fetchall(),
        "conversation_turns": turn_row,
        "delivery_intents": con.execute(
            "SELECT * FROM delivery_intents WHERE run_id = ?", [run_id]
        ).fetchall(),
        "delivery_operations": con.execute(
            "SELECT * FROM delivery_operations WHERE intent_id = ?", [delivery]
        ).fetchall(),
        "delivery_events": con.execute(
            "SELECT * FROM delivery_events WHERE intent_id = ?", [delivery]
        ).fetchall(),
    }


def by_hand(path: str, template: dict[str, list[tuple[Any, ...]]], threads: int) -> Any:
    """The same rows a turn writes, written by hand on a connection of its own
    to a file with the store's schema (``path``): per transaction a lease read
    (``SELECT expires_at FROM leases WHERE target = ? AND epoch = ?``), then
    one plain ``INSERT … VALUES`` per table (its rows in one statement) and one
    ``UPDATE … WHERE`` by key per changed row, as the store's three
    transactions do: admit+start (intent, run, active run, run events, the
    session row, the user's entry, the conversation turn), append_many (the
    session row, 3 entries), finish (the run, the active run's removal, run
    event, the session row, 2 entries, the conversation turn, the delivery
    intent, operation, event). Every key column gets a fresh value each turn.
    ``threads``: DuckDB's worker threads on that connection."""
    con = duckdb.connect(path)
    con.execute("SET TimeZone = 'UTC'")
    con.execute(f"SET threads = {threads}")
    epoch = con.execute("SELECT epoch FROM leases WHERE target = 'session:runs'").fetchone()
    counter = [0]
    keyed = {
        "execution_intents": (0,),
        "runs": (0, 2),
        "run_events": (2,),
        "entries": (1,),
        "conversation_turns": (0,),
        "delivery_intents": (0, 2),
        "delivery_operations": (0, 1),
        "delivery_events": (0, 1),
    }

    def fresh(table: str, rows: list[tuple[Any, ...]], salt: str) -> list[list[Any]]:
        out = []
        for row in rows:
            values = list(row)
            for col in keyed.get(table, ()):
                if isinstance(values[col], str):
                    values[col] = f"{values[col]}~{salt}"
            out.append(values)
        return out

    def insert(table: str, rows: list[list[Any]], **fixed: Any) -> None:
        if not rows:
            return
        width = len(rows[0])
        marks = ", ".join("(" + ", ".join("?" * width) + ")" for _ in rows)
        con.execute(f"INSERT INTO {table} VALUES {marks}", [v for r in rows for v in r])

    def lease() -> None:
        con.execute(
            "SELECT expires_at FROM leases WHERE target = 'session:runs' AND epoch = ?",
            [epoch[0] if epoch else 0],
        ).fetchall()

    def session(seq: int, entries: int, events: int) -> None:
        con.execute(
            "UPDATE sessions SET leaf_id = ?, next_seq = ?, entry_count = entry_count + ?, "
            "event_seq = event_seq + ?, updated_at = now() WHERE id = 'hand'",
            [f"leaf{seq}", seq, entries, events],
        )

    def turn() -> None:
        counter[0] += 1
        salt = f"{counter[0]}"
        base = counter[0] * 1000
        entries = fresh("entries", template["entries"], salt)
        for n, row in enumerate(entries):
            row[0], row[4] = "hand", base + n  # session_id, seq
        events = fresh("run_events", template["run_events"], salt)
        for n, row in enumerate(events):
            row[0], row[1] = "hand", base + n  # session_id, seq
        run = fresh("runs", template["runs"], salt)
        turn_row = fresh("conversation_turns", template["conversation_turns"], salt)
        con.execute("BEGIN TRANSACTION")
        lease()
        insert("execution_intents", fresh("execution_intents", template["execution_intents"], salt))
        insert("runs", run)
        insert("active_runs", [["hand", run[0][0]]])
        insert("run_events", events[:1])
        session(base + 1, 1, 1)
        insert("entries", entries[:1])
        insert("conversation_turns", turn_row)
        con.execute("COMMIT")
        con.execute("BEGIN TRANSACTION")
        lease()
        session(base + 4, 3, 0)
        insert("entries", entries[1:4])
        con.execute("COMMIT")
        con.execute("BEGIN TRANSACTION")
        lease()
        con.execute(
            "UPDATE runs SET status = 'succeeded', finished_at = now() WHERE id = ?", [run[0][0]]
        )
        con.execute("DELETE FROM active_runs WHERE session_id = 'hand'")
        insert("run_events", events[1:])
        session(base + 6, 2, 1)
        insert("entries", entries[4:])
        con.execute(
            "UPDATE conversation_turns SET status = 'closed', end_seq = ? WHERE id = ?",
            [base + 6, turn_row[0][0]],
        )
        insert("delivery_intents", fresh("delivery_intents", template["delivery_intents"], salt))
        operations = fresh("delivery_operations", template["delivery_operations"], salt)
        insert("delivery_operations", operations)
        insert("delivery_events", fresh("delivery_events", template["delivery_events"], salt))
        con.execute("COMMIT")

    return timed(turn)


def _spread(values: list[float], scale: float = 1000.0) -> str:
    return (
        f"{statistics.median(values) * scale:.2f} "
        f"[{min(values) * scale:.2f}–{max(values) * scale:.2f}]"
    )


def main() -> int:
    """Print the profile's figures (module docstring) as markdown. With
    ``TURNKEEPER_PROFILE_THREADS=default`` the traced and profiled turns run at
    DuckDB's default threads (the code before the step)."""
    load_before = [round(x, 2) for x in os.getloadavg()]
    traced_folder = DEFAULT_THREADS if _before() else "store"
    with tempfile.TemporaryDirectory() as tmp:
        for folder in (PROFILED, "hand", "hand1", DEFAULT_THREADS, "store"):
            os.makedirs(f"{tmp}/{folder}")
        path = f"{tmp}/store/store.duckdb"
        with (
            turnkeeper.open_store(path) as store,
            turnkeeper.open_store(f"{tmp}/{DEFAULT_THREADS}/store.duckdb") as before,
            turnkeeper.open_store(f"{tmp}/{PROFILED}/store.duckdb") as profiled,
        ):
            leases = {}
            for st in (store, before, profiled):
                st.sessions.create("runs")
                leases[id(st)] = st.leases.acquire(
                    "session:runs", "bench", 3600, purpose="execution"
                )
                for _ in range(WARM):
                    three_transaction_turn(st, "runs", leases[id(st)], USER)
            traced = before if _before() else store
            threads_of = [
                int(st.query("SELECT current_setting('threads') AS n").to_pylist()[0]["n"])
                for st in (traced, profiled)
            ]
            wal = Path(f"{tmp}/{traced_folder}/store.duckdb.wal")
            wal_before = wal.stat().st_size if wal.exists() else 0
            (walls, traced_walls), (prof, _) = traced_turns(
                [(traced, leases[id(traced)]), (profiled, leases[id(profiled)])]
            )
            wal_after = wal.stat().st_size if wal.exists() else 0
            rows = _Rows(store)
            run_row = rows.execute(
                "SELECT id FROM runs WHERE session_id = 'runs' ORDER BY started_at DESC LIMIT 1", []
            ).fetchone()
            assert run_row is not None
            checkpoint_row = rows.execute(
                "SELECT current_setting('checkpoint_threshold')", []
            ).fetchone()
            checkpoint = checkpoint_row[0] if checkpoint_row else "?"
            template = written_rows(rows, run_row[0])
            # The same rows by hand, on files of their own with the store's schema.
            hands = {}
            for folder, threads in (("hand", os.cpu_count() or 1), ("hand1", 1)):
                with turnkeeper.open_store(f"{tmp}/{folder}/store.duckdb") as h:
                    h.sessions.create("runs")
                    h.sessions.create("hand")
                    h.leases.acquire("session:runs", "bench", 3600, purpose="execution")
                hands[threads] = by_hand(f"{tmp}/{folder}/store.duckdb", template, threads)
            ops = {
                "turn, threads = 1 (the store now)": timed(
                    lambda: three_transaction_turn(store, "runs", leases[id(store)], USER)
                ),
                "turn, DuckDB's default threads (before)": timed(
                    lambda: three_transaction_turn(before, "runs", leases[id(before)], USER)
                ),
                "the same rows by hand, threads = 1": hands[1],
                f"the same rows by hand, DuckDB's default threads ({os.cpu_count()})": hands[
                    os.cpu_count() or 1
                ],
            }
            floor = duck_floor(tmp)
            for _ in range(WARM):
                for op in ops.values():
                    op()
            floors: list[float] = []
            spent: dict[str, list[float]] = {name: [] for name in ops}
            for _ in range(REPS):
                floors.append(per_call(floor))
                for name, op in ops.items():
                    spent[name].append(per_call(op))
            pairs = []
            first, second = (
                ops["turn, threads = 1 (the store now)"],
                ops["turn, DuckDB's default threads (before)"],
            )
            for n in range(TURNS * 2):
                if n % 2:
                    a, b = first(), second()
                else:
                    b, a = second(), first()
                pairs.append(a / b)
        table_text = keys_and_indexes(path)
    load_after = [round(x, 2) for x in os.getloadavg()]
    inside = [sum(s[1] for s in t) for t in walls]
    print(f"Traced turns at threads = {threads_of[0]}, profiled at threads = {threads_of[1]}:")
    print()
    print(statement_table(walls, prof))
    print()
    print("| figure | ms, median [min–max] | × floor, median [min–max] |")
    print("| --- | ---: | ---: |")
    print(f"| floor (fenced compare-and-set, autocommit) | {_spread(floors)} | 1 |")
    for name, values in spent.items():
        ratios = [v / f for v, f in zip(values, floors, strict=True)]
        print(f"| {name} | {_spread(values)} | {_spread(ratios, 1.0)} |")
    print(f"| traced turns: the turn | {_spread(traced_walls)} | |")
    print(f"| traced turns: its statements, summed | {_spread(inside)} | |")
    outside = [t - i for t, i in zip(traced_walls, inside, strict=True)]
    print(f"| traced turns: outside its statements (Python) | {_spread(outside)} | |")
    print()
    print(
        f"threads = 1 / default threads, turn by turn ({len(pairs)} pairs, order alternating): "
        f"median {statistics.median(pairs):.3f} "
        f"[quartiles {statistics.quantiles(pairs, n=4)[0]:.3f}–"
        f"{statistics.quantiles(pairs, n=4)[2]:.3f}]"
    )
    print()
    print(
        f"write-ahead log: {(wal_after - wal_before) / TURNS:.0f} bytes per turn "
        f"({TURNS} turns: {wal_before} -> {wal_after} bytes, no checkpoint if it only grew); "
        f"checkpoint_threshold {checkpoint}"
    )
    print()
    print(table_text)
    print()
    print(
        f"{os.cpu_count()} cores; load average {load_before} before, {load_after} after; "
        f"DuckDB {duckdb.__version__}; {TURNS} traced turns, {REPS} repetitions, "
        f"{WARM} warm-up turns"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
