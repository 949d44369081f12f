"""Benchmark the store on both backends against a raw fenced compare-and-set.

``make bench`` (``python model_tests/with_postgres.py --durable python
reports/bench.py``) measures DuckDB on a durable file and, when
``TURNKEEPER_TEST_PG`` names a server, PostgreSQL on it; it writes
``reports/bench.json`` and the table in ``reports/BENCH.md``.

Every figure is a ratio to the floor of its backend, measured interleaved
with it in the same run (the floor is timed right before each operation,
each repetition): a raw fenced compare-and-set, ``UPDATE leases SET epoch =
epoch + 1 WHERE target = ? AND epoch = ? AND expires_at < now()``, one
autocommit statement on a connection of its own (DuckDB: a durable file
beside the store's; PostgreSQL: the same server). Each row gives the median
and the spread (min, max) over :data:`REPS` repetitions, so the ratios
compare across machines and load; the machine's core count and load average
are recorded with them. Rates of threads (and, on PostgreSQL, processes) are
multiples of one writer's rate.

Measured, never asserted: CI runs it at a tiny size (the environment knobs
below) to prove that it runs, and checks only the committed file's form.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import duckdb

import turnkeeper
from turnkeeper import DeliveryPlan, DeliveryStep, EntryKind

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench_bounds lies beside this script
sys.path.insert(1, str(Path(__file__).resolve().parents[1] / "model_tests"))  # grown
from bench_bounds import duckdb_bounds, postgres_bounds
from bench_cli import big_session
from bench_cli import rows as cli_rows
from bench_encryption import note as encryption_note
from bench_encryption import rows as encryption_rows
from bench_encryption import section as encryption_section
from bench_goals import rows as goal_rows
from bench_ledger import ledger
from bench_ledger import rows as ledger_rows

HERE = Path(__file__).resolve().parent
REPS = int(os.environ.get("TURNKEEPER_BENCH_REPS", "5"))
MIN_S = float(os.environ.get("TURNKEEPER_BENCH_SECONDS", "0.4"))
"""Each timing runs the operation for at least this many seconds (and 3 calls)."""
REPLAY_ENTRIES = int(os.environ.get("TURNKEEPER_BENCH_REPLAY_ENTRIES", "10000"))
WRITERS_S = float(os.environ.get("TURNKEEPER_BENCH_WRITERS_S", "2"))
"""How long each thread or process count appends (every writer at least
:data:`MIN_APPENDS` times, however loaded the machine: a rate is never of nothing)."""
MIN_APPENDS = 3
BIG_SESSIONS = int(os.environ.get("TURNKEEPER_BENCH_BIG_SESSIONS", "40"))
BIG_COPIES = int(os.environ.get("TURNKEEPER_BENCH_BIG_COPIES", "1500"))
"""The big store: sessions written through the API, then copied this many times."""
RUNS = int(os.environ.get("TURNKEEPER_BENCH_RUNS", "1000000"))
"""Runs in the run history the analytics figure is computed over."""
OUT = Path(os.environ.get("TURNKEEPER_BENCH_OUT", HERE / "bench.json"))
TABLE = Path(os.environ.get("TURNKEEPER_BENCH_TABLE", HERE / "BENCH.md"))
MSG = {"message": {"role": "user", "content": "x" * 200}}
BATCH = 100
TURN_APPENDS = 4
TURN_THREE = "turn, 3 transactions (admit+start, append_many, finish+entries)"

Op = Callable[[], float]
"""One timed call: runs the operation once and returns the seconds it took."""


def timed(fn: Callable[[], object]) -> Op:
    def op() -> float:
        start = time.perf_counter()
        fn()
        return time.perf_counter() - start

    return op


def per_call(op: Op) -> float:
    """Mean seconds per call of ``op`` over at least :data:`MIN_S`."""
    spent, calls, start = 0.0, 0, time.perf_counter()
    while calls < 3 or time.perf_counter() - start < MIN_S:
        spent += op()
        calls += 1
    return spent / calls


# -- the floors ---------------------------------------------------------------------

FLOOR_SQL = (
    "UPDATE leases SET epoch = epoch + 1 WHERE target = {p} AND epoch = {p} AND expires_at < now()"
)


def duck_floor(folder: str) -> Op:
    con = duckdb.connect(f"{folder}/floor.duckdb")
    con.execute(
        "CREATE TABLE leases (target VARCHAR PRIMARY KEY, epoch BIGINT, expires_at TIMESTAMPTZ)"
    )
    con.execute("INSERT INTO leases VALUES ('t', 0, now() - INTERVAL 1 HOUR)")
    epoch = [0]
    sql = FLOOR_SQL.format(p="?")

    def cas() -> None:
        con.execute(sql, ["t", epoch[0]])
        epoch[0] += 1

    return timed(cas)


def pg_floor(url: str) -> Op:
    import psycopg

    con = psycopg.connect(url, autocommit=True)
    con.execute(
        "CREATE TABLE bench_floor "
        "(target VARCHAR PRIMARY KEY, epoch BIGINT, expires_at TIMESTAMPTZ)"
    )
    con.execute("INSERT INTO bench_floor VALUES ('t', 0, now() - INTERVAL '1 hour')")
    epoch = [0]
    sql = FLOOR_SQL.format(p="%s").replace("leases", "bench_floor")

    def cas() -> None:
        con.execute(sql, ["t", epoch[0]])
        epoch[0] += 1

    return timed(cas)


def pg_schema(url: str) -> str:
    """A fresh schema on the server (the benchmark's own)."""
    import psycopg

    schema = f"bench_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    sep = "&" if "?" in url else "?"
    return f"{url}{sep}options=-csearch_path%3D{schema}"


# -- the operations -----------------------------------------------------------------


REPLY = {"role": "assistant", "content": "done"}
USER = {"role": "user", "content": "go"}
PLAN = DeliveryPlan("chat", "t", (DeliveryStep("send", "msg"),))


def three_transaction_turn(
    store: turnkeeper.BaseStore, session_id: str, lease: turnkeeper.Lease, user: Any
) -> None:
    """admit+start → append_many of 3 → finish + its last entry + reply + plan."""
    run = store.runs.admit(
        session_id, {"i": uuid.uuid4().hex}, user_message=user, lease=lease, start=True
    )
    store.sessions.append_many(
        session_id, [(EntryKind.MESSAGE, MSG)] * (TURN_APPENDS - 1), lease=lease
    )
    store.runs.finish(
        run.id,
        "succeeded",
        entries=[(EntryKind.MESSAGE, MSG)],
        assistant_message=REPLY,
        delivery_plan=PLAN,
        lease=lease,
    )


TURN_PHASES = ("admit_run", "append_many", "finish_run")
"""The store operations of :func:`three_transaction_turn`, in order."""


def turn_statements(store: turnkeeper.BaseStore) -> dict[str, int]:
    """The statements one :func:`three_transaction_turn` sends, per phase
    (BEGIN and COMMIT included; the store's own counter), and their total:
    the second turn on a new session (the first warms what the store object
    remembers of it), as ``model_tests/benchmarks/test_turn_statements.py`` counts it."""
    session_id = f"stmts{uuid.uuid4().hex[:8]}"
    store.sessions.create(session_id)
    lease = store.leases.acquire(f"session:{session_id}", "bench", 3600, purpose="execution")
    three_transaction_turn(store, session_id, lease, USER)

    def spent() -> dict[str, float]:
        stats = store.statement_stats()
        return {
            op: stats[op]["statements_per_call"] * stats[op]["calls"] if op in stats else 0.0
            for op in TURN_PHASES
        }

    before = spent()
    three_transaction_turn(store, session_id, lease, USER)
    after = spent()
    phases = {op: round(after[op] - before[op]) for op in TURN_PHASES}
    return phases | {"total": sum(phases.values())}


def turn_round_trips(store: turnkeeper.BaseStore) -> dict[str, int]:
    """PostgreSQL only: the round trips one :func:`three_transaction_turn`
    makes, per phase, and their total: its second turn on a new session,
    counted from libpq's protocol trace (``PQtrace``, Linux) of each
    connection the store lends (one per phase): each simple ``Query`` and
    each ``Sync`` (a pipeline's end) the client sends is one wait for the
    server, as ``model_tests/benchmarks/test_turn_statements.py`` counts it."""
    import contextlib

    session_id = f"trips{uuid.uuid4().hex[:8]}"
    store.sessions.create(session_id)
    lease = store.leases.acquire(f"session:{session_id}", "bench", 3600, purpose="execution")
    three_transaction_turn(store, session_id, lease, USER)
    db: Any = store.db
    real = db.connection
    lends: list[int] = []

    @contextlib.contextmanager
    def traced() -> Any:
        with real() as conn, tempfile.TemporaryFile("w+") as out:
            conn.pgconn.trace(out.fileno())
            try:
                yield conn
            finally:
                conn.pgconn.untrace()
                out.seek(0)
                sent = [line.split("\t") for line in out if line.count("\t") >= 3]
                lends.append(
                    sum(f[1] == "F" and f[3].split()[0] in ("Query", "Sync") for f in sent)
                )

    db.connection = traced  # this store object's lends only, for one turn
    try:
        three_transaction_turn(store, session_id, lease, USER)
    finally:
        del db.connection
    phases = dict(zip(TURN_PHASES, lends, strict=True))
    return phases | {"total": sum(phases.values())}


def operations(store: turnkeeper.BaseStore, cold: turnkeeper.BaseStore) -> dict[str, Op]:
    """The rows of the table: name → one timed call (per entry for the batch).
    ``cold`` is a second store object on the same database with its replay
    cache off (every replay reads the branch's rows)."""
    store.sessions.create("s")
    lease = store.leases.acquire("session:s", "bench", 3600, purpose="execution")
    store.sessions.create("u")  # unleased: an unfenced append is refused on a leased session
    for sid in ("r", "g"):  # "g" grows by one entry before each of its replays
        store.sessions.create(sid)
        for done in range(0, REPLAY_ENTRIES, 1000):
            store.sessions.append_many(
                sid, [(EntryKind.MESSAGE, MSG)] * min(1000, REPLAY_ENTRIES - done)
            )
    store.sessions.create("runs")
    runs_lease = store.leases.acquire("session:runs", "bench", 3600, purpose="execution")
    outbox = store.runs.admit("runs", {"outbox": True}, lease=runs_lease)
    steps = tuple(DeliveryStep(str(n), "msg") for n in range(5000))
    store.runs.finish(
        outbox.id, "failed", lease=runs_lease, delivery_plan=DeliveryPlan("chat", "t", steps)
    )
    claimed = iter(range(len(steps)))
    parts: dict[str, float] = {}

    def turn_seven() -> float:
        """admit → start → 4 fenced appends → finish + plan, as 7 transactions."""
        t0 = time.perf_counter()
        run = store.runs.admit("runs", {"i": uuid.uuid4().hex}, user_message=USER, lease=runs_lease)
        t1 = time.perf_counter()
        store.runs.start(run.id, lease=runs_lease)
        for _ in range(TURN_APPENDS):
            store.sessions.append("runs", EntryKind.MESSAGE, MSG, lease=runs_lease)
        t2 = time.perf_counter()
        store.runs.finish(
            run.id, "succeeded", assistant_message=REPLY, delivery_plan=PLAN, lease=runs_lease
        )
        t3 = time.perf_counter()
        parts["admit_run"], parts["finish_run"] = t1 - t0, t3 - t2
        return t3 - t0

    def turn_three() -> float:
        t0 = time.perf_counter()
        three_transaction_turn(store, "runs", runs_lease, USER)
        return time.perf_counter() - t0

    def delivery() -> None:
        op = store.outbox.claim(f"{outbox.id}:delivery:{next(claimed)}", "bench", 60)
        store.outbox.finish(op.id, "bench", op.lease_epoch, "delivered")

    def grown() -> float:
        store.sessions.append("g", EntryKind.MESSAGE, MSG)
        return timed(lambda: store.sessions.replay("g"))()

    def batch() -> float:
        start = time.perf_counter()
        store.sessions.append_many("s", [(EntryKind.MESSAGE, MSG)] * BATCH, lease=lease)
        return (time.perf_counter() - start) / BATCH

    def part(name: str) -> Op:
        def op() -> float:
            turn_seven()
            return parts[name]

        return op

    return {
        "acquire (re-acquire)": timed(
            lambda: store.leases.acquire("session:s", "bench", 3600, purpose="execution")
        ),
        "renew": timed(lambda: store.leases.renew(lease, 3600)),
        "acquire + release": timed(
            lambda: store.leases.release(store.leases.acquire(f"t{uuid.uuid4().hex}", "bench", 60))
        ),
        "append": timed(lambda: store.sessions.append("u", EntryKind.MESSAGE, MSG)),
        "append (fenced)": timed(
            lambda: store.sessions.append("s", EntryKind.MESSAGE, MSG, lease=lease)
        ),
        f"append_many of {BATCH}, per entry (fenced)": batch,
        "admit_run": part("admit_run"),
        "finish_run (reply + 1-step plan)": part("finish_run"),
        "turn, 7 transactions (admit, start, 4 appends, finish)": turn_seven,
        TURN_THREE: turn_three,
        "claim + finish delivery": timed(delivery),
        f"replay ({REPLAY_ENTRIES} entries), unchanged since the last (cache)": timed(
            lambda: store.sessions.replay("r")
        ),
        f"replay ({REPLAY_ENTRIES} entries) after one append (cache + the new row)": grown,
        f"replay ({REPLAY_ENTRIES} entries), cache off": timed(lambda: cold.sessions.replay("r")),
    }


# -- concurrent writers -------------------------------------------------------------


def threads(store: turnkeeper.BaseStore, count: int, together: Any = None) -> float:
    """Fenced appends per second of ``count`` threads on one store, each to its own
    session. Every writer is ready (session, lease, a first append) before any
    is timed; ``together``, a barrier of other processes' writers, is waited
    for too, so that their timings overlap."""
    ready, go = threading.Barrier(count + 1), threading.Event()
    rates: list[float] = []
    lock = threading.Lock()

    def writer() -> None:
        sid = f"w{uuid.uuid4().hex[:8]}"
        store.sessions.create(sid)
        lease = store.leases.acquire(f"session:{sid}", sid, 3600, purpose="execution")
        store.sessions.append(sid, EntryKind.MESSAGE, MSG, lease=lease)
        ready.wait()
        go.wait()
        n, start = 0, time.perf_counter()
        while n < MIN_APPENDS or time.perf_counter() - start < WRITERS_S:
            store.sessions.append(sid, EntryKind.MESSAGE, MSG, lease=lease)
            n += 1
        with lock:
            rates.append(n / (time.perf_counter() - start))

    pool = [threading.Thread(target=writer) for _ in range(count)]
    for t in pool:
        t.start()
    ready.wait()  # this process's writers are ready
    if together is not None:
        together.wait()  # and every other process's
    go.set()
    for t in pool:
        t.join()
    return sum(rates)


def _appender(url: str, out: Any, together: Any) -> None:
    with turnkeeper.open_store(url) as store:
        out.put(threads(store, 1, together))


def processes(url: str, count: int) -> float:
    """Fenced appends per second of ``count`` processes (one thread each) together:
    spawned processes start one by one, seconds apart on a loaded machine, so
    none is timed before all are ready."""
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    together = ctx.Barrier(count)
    procs = [ctx.Process(target=_appender, args=(url, out, together)) for _ in range(count)]
    for p in procs:
        p.start()
    rates = [out.get(timeout=600) for _ in procs]
    for p in procs:
        p.join(60)
    return sum(rates)


def multiples(rates: dict[int, float]) -> dict[str, dict[str, float]]:
    one = rates[1] or 1.0
    return {
        str(n): {"ops_per_s": round(r, 1), "x_one_writer": round(r / one, 2)}
        for n, r in rates.items()
    }


# -- peers: LangGraph's SqliteSaver, and the analytics figure on SQLite --------------------


def _sqlite_saver(folder: str) -> tuple[Any, Callable[[], None]]:
    """LangGraph's ``SqliteSaver`` on a file in ``folder``, and its closer."""
    import sqlite3

    from langgraph.checkpoint.sqlite import SqliteSaver

    con = sqlite3.connect(f"{folder}/langgraph.sqlite", check_same_thread=False)
    saver = SqliteSaver(con)
    saver.setup()
    return saver, con.close


def _postgres_saver(url: str) -> tuple[Any, Callable[[], None]]:
    """LangGraph's ``PostgresSaver`` in a schema of its own at ``url`` (one
    connection, autocommit, rows as dicts, as ``PostgresSaver.from_conn_string``
    makes it), and its closer."""
    import psycopg
    from langgraph.checkpoint.postgres import PostgresSaver
    from psycopg.rows import dict_row

    con = psycopg.connect(url, autocommit=True, prepare_threshold=0, row_factory=dict_row)
    saver = PostgresSaver(con)
    saver.setup()
    return saver, con.close


def langgraph_peer(
    store: turnkeeper.BaseStore, cold: turnkeeper.BaseStore, folder: str, pg_url: str = ""
) -> dict[str, Any]:
    """Replay of the :data:`REPLAY_ENTRIES`-entry session (cached, and with the
    cache off) against LangGraph's ``get_tuple`` of a checkpoint holding the same
    messages (``SqliteSaver`` in ``folder`` beside DuckDB, ``PostgresSaver`` in a
    schema of its own at ``pg_url`` beside PostgreSQL), and an append against
    the ``put`` of that checkpoint with one message more (LangGraph writes the
    whole state), interleaved, median over :data:`REPS`."""
    try:
        from langgraph.checkpoint.base import empty_checkpoint

        saver, close = _postgres_saver(pg_url) if pg_url else _sqlite_saver(folder)
    except ImportError as exc:  # the bench extra is not installed
        return {"skipped": f"the LangGraph checkpointer is not installed ({exc})"}
    messages = [MSG["message"]] * REPLAY_ENTRIES
    config = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
    version = [0]

    def put() -> None:
        version[0] += 1
        checkpoint = empty_checkpoint()
        checkpoint["channel_values"] = {"messages": [*messages, MSG["message"]]}
        checkpoint["channel_versions"] = {"messages": version[0]}
        # new_versions names the version the blob is stored under: PostgresSaver keeps
        # channel values apart and get_tuple reads them at the checkpoint's versions
        step = {"source": "loop", "step": version[0]}
        saver.put(config, checkpoint, step, {"messages": version[0]})

    put()
    held = saver.get_tuple(config).checkpoint["channel_values"].get("messages", [])
    if len(held) != REPLAY_ENTRIES + 1:  # the peer must load what we replay
        raise RuntimeError(f"the LangGraph checkpoint holds {len(held)} messages")
    store.sessions.create("peer")
    lease = store.leases.acquire("session:peer", "bench", 3600, purpose="execution")
    pairs = {
        "replay / get_tuple": (
            timed(lambda: store.sessions.replay("r")),
            timed(lambda: saver.get_tuple(config)),
        ),
        "replay, cache off / get_tuple": (
            timed(lambda: cold.sessions.replay("r")),
            timed(lambda: saver.get_tuple(config)),
        ),
        "append (fenced) / put": (
            timed(lambda: store.sessions.append("peer", EntryKind.MESSAGE, MSG, lease=lease)),
            timed(put),
        ),
    }
    ratios: dict[str, list[float]] = {name: [] for name in pairs}
    for _ in range(REPS):
        for name, (ours, theirs) in pairs.items():
            ratios[name].append(per_call(ours) / per_call(theirs))
    close()
    return {name: _spread(r) for name, r in ratios.items()}


RSS_ENTRIES = int(os.environ.get("TURNKEEPER_BENCH_RSS_ENTRIES", "100000"))
_RSS_CHILD = """
import sys, turnkeeper

def status(name):
    with open("/proc/self/status") as lines:
        for line in lines:
            if line.startswith(name + ":"):
                return int(line.split()[1]) * 1024

with turnkeeper.open_store(sys.argv[1], replay_cache_bytes=0) as store:
    store.sessions.replay("rss-small")
    with open("/proc/self/clear_refs", "w") as clear:
        clear.write("5")  # VmHWM restarts from VmRSS
    base = status("VmRSS")
    got = store.sessions.replay(sys.argv[2])
    print(len(got.messages), status("VmHWM") - base)
"""


def replay_rss(where: str) -> dict[str, Any]:
    """Peak RSS of a cold replay of an :data:`RSS_ENTRIES`-entry session in a
    fresh process (its peak reset right before the replay), over the session's
    stored payload bytes: the first replay, from the rows (it stores the
    snapshot), and the next, from the stored snapshot; over ``min(REPS, 3)``
    sessions in a store of their own at ``where`` (closed before the children
    open it: one process at a time writes a DuckDB file). Linux only (``/proc``)."""
    import subprocess

    if not Path("/proc/self/clear_refs").exists():
        return {"skipped": "no /proc/self/clear_refs"}
    sids = [f"rss-{rep}" for rep in range(max(1, min(REPS, 3)))]
    payloads: dict[str, int] = {}
    with turnkeeper.open_store(where) as store:
        store.sessions.create("rss-small")
        store.sessions.append("rss-small", EntryKind.MESSAGE, MSG)
        for sid in sids:
            store.sessions.create(sid)
            for done in range(0, RSS_ENTRIES, 10_000):
                batch = min(10_000, RSS_ENTRIES - done)
                store.sessions.append_many(sid, [(EntryKind.MESSAGE, MSG)] * batch)
            payloads[sid] = store.db.read(
                "rss_payload",
                lambda tx, sid=sid: tx.one(
                    "SELECT sum(length(payload)) FROM entries WHERE session_id = ?", [sid]
                ),
            )[0]

    def child(sid: str) -> float:
        out = subprocess.run(
            [sys.executable, "-c", _RSS_CHILD, where, sid],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
        return int(out[1]) / payloads[sid]

    first = [child(sid) for sid in sids]
    stored = [child(sid) for sid in sids]
    return {
        "entries": RSS_ENTRIES,
        "payload_mb": round(payloads[sids[0]] / 1e6, 2),
        "from the rows (stores the snapshot)": _spread(first),
        "from the stored snapshot": _spread(stored),
    }


_DBOS: dict[str, Any] = {}
"""The DBOS workflow, registered once per process (DBOS keeps a global registry)."""


def _dbos_workflow() -> Callable[[int], int]:
    if not _DBOS:
        from dbos import DBOS

        @DBOS.step()
        def step(i: int) -> int:
            return i + 1

        @DBOS.workflow()
        def three_steps(x: int) -> int:
            return step(step(step(x)))

        _DBOS["workflow"] = three_steps
    return _DBOS["workflow"]  # type: ignore[no-any-return]


def dbos_peer(turn: Op, url: str) -> dict[str, Any]:
    """Our three-transaction turn against a DBOS workflow of three steps (each
    step's result checkpointed, as DBOS makes a workflow durable) on ``url``
    (SQLite beside DuckDB, the same server beside PostgreSQL), interleaved,
    median over :data:`REPS`; skipped when DBOS is not installed."""
    try:
        from dbos import DBOS
    except ImportError as exc:
        return {"skipped": f"dbos is not installed ({exc})"}
    workflow = _dbos_workflow()
    config = {"name": "bench", "system_database_url": url, "run_admin_server": False}
    DBOS(config={**config, "log_level": "WARNING"})  # type: ignore[typeddict-item]
    try:
        DBOS.launch()
        calls = iter(range(10**9))
        theirs = timed(lambda: workflow(next(calls)))
        theirs()
        ratios = [per_call(turn) / per_call(theirs) for _ in range(REPS)]
    finally:
        DBOS.destroy(destroy_registry=False)
    return _spread(ratios)


def _spread(values: list[float]) -> dict[str, float]:
    """Median, min and max to 3 significant digits: a ratio far below 1 (a
    per-entry cost against a commit's floor) keeps its digits, where a fixed
    2 decimals rounded a measured 0.004 to 0.0, as if nothing was measured."""
    return {
        "median": _digits(statistics.median(values)),
        "min": _digits(min(values)),
        "max": _digits(max(values)),
    }


def _digits(value: float) -> float:
    return float(f"{value:.3g}")


RUN_COLUMNS = (
    "id, session_id, intent_id, retry_of, attempt, status, cancel_requested, error, "
    "lease_epoch, started_at, updated_at, finished_at, model"
)
MODELS = 20
DAYS = 90
ENDED = ("succeeded", "failed", "cancelled", "interrupted", "abandoned")


def history(n: int) -> list[tuple[Any, ...]]:
    """``n`` ended runs over :data:`MODELS` models and :data:`DAYS` days (seeded)."""
    import random
    from datetime import UTC, datetime, timedelta

    rng = random.Random(7)
    start = datetime(2026, 1, 1, tzinfo=UTC)
    rows = []
    for i in range(n):
        began = start + timedelta(seconds=rng.randrange(DAYS * 86400))
        ended = began + timedelta(milliseconds=rng.randrange(1, 600_000))
        status = rng.choices(ENDED, weights=(80, 10, 4, 4, 2))[0]
        model = f"model-{rng.randrange(MODELS):02d}"
        rows.append(
            (
                f"r{i}",
                f"s{i % 5000}",
                f"i{i}",
                None,
                1,
                status,
                False,
                None,
                None,
                began,
                ended,
                ended,
                model,
            )
        )
    return rows


SQLITE_MODEL_DAYS = """
WITH t AS (
    SELECT model, substr(started_at, 1, 10) AS day, status,
           (julianday(finished_at) - julianday(started_at)) * 86400.0 AS d
    FROM runs WHERE status IN ('succeeded', 'failed', 'cancelled', 'interrupted', 'abandoned')
), r AS (
    SELECT model, day, status, d,
           row_number() OVER (PARTITION BY model, day ORDER BY d) - 1 AS k,
           0.95 * (count(*) OVER (PARTITION BY model, day) - 1) AS pos
    FROM t
)
SELECT model, day, count(*) AS runs,
       round(avg(CASE WHEN status IN ('failed', 'interrupted', 'abandoned')
                 THEN 1.0 ELSE 0.0 END), 4) AS failure_rate,
       round(max(CASE WHEN k = CAST(pos AS INTEGER) THEN d END)
             + (max(pos) - CAST(max(pos) AS INTEGER))
             * (coalesce(max(CASE WHEN k = CAST(pos AS INTEGER) + 1 THEN d END),
                         max(CASE WHEN k = CAST(pos AS INTEGER) THEN d END))
                - max(CASE WHEN k = CAST(pos AS INTEGER) THEN d END)), 3) AS p95_s
FROM r GROUP BY model, day ORDER BY model, day
"""
"""The report's ``runs_by_model_day`` figure in SQLite (no percentile_cont: the
same interpolated p95 from window ranks), indexed on ``(model, started_at)``."""


def analytics(store: turnkeeper.BaseStore, rows: list[tuple[Any, ...]], folder: str) -> Any:
    """Time the report's per-model, per-day figure (failure rate, p95 duration) on
    ``store`` loaded with ``rows``; with ``folder``, the same figure on SQLite too,
    checked to give the same answer. Returns (seconds, sqlite seconds or None)."""
    from turnkeeper.cli.report_runs import figure_sql

    columns = [c.strip() for c in RUN_COLUMNS.split(",")]
    # a bulk insert names every column, in table order: schema 16's JSON values a
    # runtime writes apart from the status (none here)
    loaded = [*columns, "usage", "context_usage", "progress", "error_info"]
    for at in range(0, len(rows), 100_000):  # the bench loads rows directly, not by API
        chunk = [(*r, None, None, None, None) for r in rows[at : at + 100_000]]
        store.db.write("bench_load", lambda tx, c=chunk: tx.insert_rows("runs", loaded, c))
    sql = figure_sql("runs_by_model_day")
    ours = statistics.median(per_call(timed(lambda: store.query(sql))) for _ in range(REPS))
    if not folder:
        return ours, None
    import sqlite3

    con = sqlite3.connect(f"{folder}/runs.sqlite")
    con.execute(f"CREATE TABLE runs ({RUN_COLUMNS})")
    con.executemany(
        f"INSERT INTO runs VALUES ({', '.join('?' * len(columns))})",
        [(*r[:9], *(t.isoformat(" ") for t in r[9:12]), r[12]) for r in rows],
    )
    con.execute("CREATE INDEX runs_model_started ON runs (model, started_at)")
    con.commit()
    theirs = statistics.median(
        per_call(timed(lambda: con.execute(SQLITE_MODEL_DAYS).fetchall())) for _ in range(REPS)
    )
    got = {(r["model"], str(r["day"])): r for r in store.query(sql).to_pylist()}
    for model, day, runs, rate, p95 in con.execute(SQLITE_MODEL_DAYS).fetchall():
        mine = got[(model, day)]
        if (mine["runs"], mine["failure_rate"]) != (runs, rate) or abs(mine["p95_s"] - p95) > 0.01:
            raise AssertionError(f"SQLite and the store disagree on {model} {day}")
    con.close()
    return ours, theirs


HISTORY_EVENTS = (
    "INSERT INTO run_events SELECT sid, seq, id, run_id, 'admit', 'admit', 'none', 'admitted', "
    "'{}', began FROM (SELECT h.*, "
    "row_number() OVER (PARTITION BY h.sid ORDER BY h.began, h.id) AS seq "
    "FROM (SELECT CASE WHEN t.k = 1 THEN 'z' ELSE 'a' END || r.session_id AS sid, "
    "r.id || ':' || t.k AS id, r.id AS run_id, r.started_at AS began "
    "FROM runs AS r, (VALUES (0), (1), (2)) AS t (k) WHERE r.id LIKE 'r%') AS h) AS w "
    "ORDER BY began"
)
"""Three run events for each run the analytics figure loaded, written in time
order (so the sessions' events interleave, as they do when written) under
session ids on both sides of the measured session's (``runs``), as random or
uuid ids are: no per-block range of ids leaves the measured session's out."""


def turn_beside_history(store: turnkeeper.BaseStore, floor: Op, turn: Op) -> list[float]:
    """The 3-transaction turn's ratios to the floor once the run history holds
    three events for each loaded run: a turn's cost must not grow with the
    history of other sessions."""
    store.db.write("bench_load", lambda tx: tx.exec(HISTORY_EVENTS))
    ratios = []
    for _ in range(REPS):
        base = per_call(floor)
        ratios.append(per_call(turn) / base)
    return ratios


def big_store(where: str, floor: Op) -> dict[str, list[float]]:
    """A fenced append and the 3-transaction turn, each as ratios to the floor, on
    a new store at ``where`` whose every table holds other sessions' rows: :data:`BIG_SESSIONS`
    sessions written through the API, copied :data:`BIG_COPIES` times with
    their names rewritten (``model_tests/grown.py``). Their cost must not grow
    with the store: each statement finds its rows through an index
    (``model_tests/internals/test_index_paths.py`` holds them to it)."""
    from grown import grow, populate

    with turnkeeper.open_store(where) as store:
        populate(store, BIG_SESSIONS)
        sizes = grow(store, BIG_COPIES)
        store.sessions.create("b")
        lease = store.leases.acquire("session:b", "bench", 3600, purpose="execution")
        where = (
            f"beside a big store ({sizes['sessions']} sessions, {sizes['leases']} lease rows, "
            f"{sizes['entries']} entries, {sizes['runs']} runs)"
        )
        ops = {
            f"append (fenced), {where}": timed(
                lambda: store.sessions.append("b", EntryKind.MESSAGE, MSG, lease=lease)
            ),
            f"turn, 3 transactions, {where}": timed(
                lambda: three_transaction_turn(store, "b", lease, USER)
            ),
        }
        ratios: dict[str, list[float]] = {name: [] for name in ops}
        for _ in range(REPS):
            for name, op in ops.items():
                base = per_call(floor)
                ratios[name].append(per_call(op) / base)
        return ratios


# -- one backend ----------------------------------------------------------------------


def measure(
    store: turnkeeper.BaseStore,
    cold: turnkeeper.BaseStore,
    floor: Op,
    least: dict[str, Op],
    rows: list[tuple[Any, ...]],
    folder: str,
    dbos_url: str,
    big: str,
    lg_url: str = "",
    rss: str = "",
) -> dict[str, Any]:
    """Every figure of one backend (``cold``: the same database, replay cache
    off; ``least``: the engine's bounds, ``bench_bounds``); the LangGraph peer
    beside it (``SqliteSaver`` in ``folder``, or ``PostgresSaver`` at
    ``lg_url``); DBOS on ``dbos_url``; the big store (:func:`big_store`) opened
    at ``big``; the replay's peak RSS (:func:`replay_rss`) in a store at ``rss``."""
    ops = operations(store, cold) | least
    ratios: dict[str, list[float]] = {name: [] for name in ops}
    floors: list[float] = []
    for _ in range(REPS):  # interleaved: the floor is timed right before each operation
        for name, op in ops.items():
            base = per_call(floor)
            floors.append(base)
            ratios[name].append(per_call(op) / base)
    stats = store.statement_stats()
    peers = langgraph_peer(store, cold, folder, lg_url) if folder or lg_url else {}
    dbos = dbos_peer(ops[TURN_THREE], dbos_url)
    ours, sqlite_s = analytics(store, rows, folder)
    beside = f"turn, 3 transactions, beside {len(rows)} runs' history ({3 * len(rows)} run events)"
    ratios[beside] = turn_beside_history(store, floor, ops[TURN_THREE])
    ratios |= big_store(big, floor)
    figure = {"runs": len(rows), "seconds": round(ours, 4)}
    if sqlite_s is not None:
        figure |= {
            "sqlite_seconds": round(sqlite_s, 4),
            "x_faster_than_sqlite": round(sqlite_s / ours, 1),
        }
    return {
        "floor_ms": round(statistics.median(floors) * 1000, 3),
        "analytics_model_day": figure,
        **({"langgraph": peers} if peers else {}),
        **({"replay_rss": replay_rss(rss)} if rss else {}),
        "dbos_three_steps": dbos,
        "operations": {
            name: {
                "median": round(statistics.median(r), 2),
                "min": round(min(r), 2),
                "max": round(max(r), 2),
            }
            for name, r in ratios.items()
        },
        "statements_per_turn": turn_statements(store),
        **(
            {"round_trips_per_turn": turn_round_trips(store)}
            if not isinstance(store, turnkeeper.DuckDBStore)
            else {}
        ),
        "threads": multiples({n: threads(store, n) for n in (1, 4, 16)}),
        "statements_per_call": {
            op: round(s["statements_per_call"], 2)
            for op, s in sorted(stats.items())
            if op
            in (
                "acquire_lease",
                "renew_lease",
                "release_lease",
                "append",
                "append_many",
                "replay",
                "admit_run",
                "start_run",
                "finish_run",
                "claim_delivery",
                "finish_delivery",
            )
        },
    }


def _turn_cell(result: dict[str, Any], backend: str) -> str:
    """Statements per turn: the total (admit+start / append_many / finish)."""
    t = result["backends"][backend].get("statements_per_turn")
    if t is None:
        return "—"
    return f"{t['total']} ({' / '.join(str(t[op]) for op in TURN_PHASES)})"


def table(result: dict[str, Any]) -> str:
    """``reports/BENCH.md``: every row, one column per backend (× floor, median [min–max])."""
    names = list(result["backends"])
    head = f"| operation | {' | '.join(f'{n} × floor' for n in names)} |"
    lines = [
        "# turnkeeper benchmark",
        "",
        "Generated by `make bench` (`reports/bench.py`); figures in `reports/bench.json`.",
        "Each figure is a ratio to its backend's floor, a raw fenced compare-and-set",
        "(`UPDATE leases SET epoch = epoch + 1 WHERE target = ? AND epoch = ? AND",
        "expires_at < now()`, autocommit), timed interleaved in the same run: the median",
        f"and [min–max] over {result['size']['reps']} repetitions. Lower is better; writers'",
        "rows are multiples of one writer's rate (higher is better). The *least* rows are",
        "the engine's bounds (`reports/bench_bounds.py`): raw SQL writing only the rows the",
        "operation must store, one statement per table, no store code; no implementation",
        "on that engine can cost less.",
        "",
        "| backend | floor (ms) |",
        "| --- | --- |",
        *[f"| {n} | {b['floor_ms']} |" for n, b in result["backends"].items()],
        "",
        head,
        "| --- |" + " --- |" * len(names),
    ]
    rows = list(next(iter(result["backends"].values()))["operations"])
    for row in rows:
        cells = []
        for n in names:
            r = result["backends"][n]["operations"].get(row)
            cells.append("—" if r is None else f"{r['median']} [{r['min']}–{r['max']}]")
        lines.append(f"| {row} | {' | '.join(cells)} |")
        if row == TURN_THREE and any(_turn_cell(result, n) != "—" for n in names):
            lines.append(
                f"| {row}: statements | {' | '.join(_turn_cell(result, n) for n in names)} |"
            )
    for kind in ("threads", "processes"):
        for count in ("1", "4", "8", "16"):
            cells = []
            for n in names:
                r = result["backends"][n].get(kind, {}).get(count)
                cells.append("—" if r is None else f"{r['x_one_writer']}× ({r['ops_per_s']:.0f}/s)")
            if any(c != "—" for c in cells):
                lines.append(
                    f"| fenced appends, {count} {kind}, own sessions | {' | '.join(cells)} |"
                )
    runs = result["size"]["runs"]
    cells = []
    for n in names:
        a = result["backends"][n]["analytics_model_day"]
        vs = f", {a['x_faster_than_sqlite']}× faster than SQLite" if "sqlite_seconds" in a else ""
        cells.append(f"{a['seconds']} s{vs}")
    lines.append(
        f"| failure rate + p95 duration per model per day, {runs} runs | {' | '.join(cells)} |"
    )
    cells = []
    for n in names:
        r = result["backends"][n].get("dbos_three_steps", {})
        cells.append(f"{r['median']}× [{r['min']}–{r['max']}]" if "median" in r else "—")
    if any(c != "—" for c in cells):
        lines.append(f"| DBOS: turn, 3 transactions / 3-step workflow | {' | '.join(cells)} |")
    for peer in ("replay / get_tuple", "replay, cache off / get_tuple", "append (fenced) / put"):
        cells = []
        for n in names:
            r = result["backends"][n].get("langgraph", {}).get(peer)
            cells.append("—" if r is None else f"{r['median']}× [{r['min']}–{r['max']}]")
        if any(c != "—" for c in cells):
            lines.append(
                f"| LangGraph SqliteSaver (DuckDB) / PostgresSaver (PostgreSQL): {peer}, "
                f"same history | {' | '.join(cells)} |"
            )
    lines += rss_rows(result)
    encrypted = [b.get("encryption") for b in result["backends"].values()]
    lines += encryption_rows(encrypted, TURN_PHASES)
    ledger_cells = [
        dict(ledger_rows(b["ledger"])) if "ledger" in b else {} for b in result["backends"].values()
    ]
    for row in dict.fromkeys(r for c in ledger_cells for r in c):
        lines.append(f"| {row} | {' | '.join(c.get(row, '—') for c in ledger_cells)} |")
    cli_cells = [
        dict(cli_rows(b["cli"])) if "cli" in b else {} for b in result["backends"].values()
    ]
    for row in dict.fromkeys(r for c in cli_cells for r in c):
        lines.append(f"| {row} | {' | '.join(c.get(row, '—') for c in cli_cells)} |")
    m = result["machine"]
    lines += ["", *goal_rows(result)]
    lines += encryption_note(
        {n: b.get("encryption") for n, b in result["backends"].items()}, m["cores"]
    )
    alone = {n: b["replay_alone"] for n, b in result["backends"].items() if "replay_alone" in b}
    if alone:
        at = "; ".join(
            f"{n}: load average {a['load_average']}, floor {a['floor_ms']} ms"
            for n, a in alone.items()
        )
        lines += [
            "The cold replay's rows (cache off, the LangGraph peers, the replay's peak RSS) were "
            "measured again alone (`python reports/bench.py replay`, each ratio against the floor "
            f"timed in that run) and merged into the full run's figures: {at}.",
            "",
        ]
    lines += [
        f"Machine: {m['cores']} cores, load average {m['load_average']} at the start, "
        f"Python {m['python']}, DuckDB {m['duckdb']}.",
        "",
    ]
    return "\n".join(lines)


def rss_rows(result: dict[str, Any]) -> list[str]:
    """The table's rows of :func:`replay_rss` (× the stored payload, median [min–max])."""
    lines = []
    for path in ("from the stored snapshot", "from the rows (stores the snapshot)"):
        cells = []
        for b in result["backends"].values():
            r = b.get("replay_rss", {})
            cells.append(
                f"{r[path]['median']}× [{r[path]['min']}–{r[path]['max']}] of {r['payload_mb']} MB"
                if path in r
                else "—"
            )
        if any(c != "—" for c in cells):
            entries = next(b["replay_rss"]["entries"] for b in result["backends"].values())
            lines.append(
                f"| cold replay of {entries} entries, {path}: peak RSS / stored payload "
                f"(fresh process) | {' | '.join(cells)} |"
            )
    return lines


def replay_only(
    store: turnkeeper.BaseStore,
    cold: turnkeeper.BaseStore,
    floor: Op,
    folder: str,
    lg_url: str,
    rss: str,
) -> dict[str, Any]:
    """The replay's rows alone (``reports/bench.py replay``): the cold
    replay × floor, the LangGraph peer, the peak RSS."""
    store.sessions.create("r")
    for done in range(0, REPLAY_ENTRIES, 1000):
        batch = min(1000, REPLAY_ENTRIES - done)
        store.sessions.append_many("r", [(EntryKind.MESSAGE, MSG)] * batch)
    name = f"replay ({REPLAY_ENTRIES} entries), cache off"
    op = timed(lambda: cold.sessions.replay("r"))
    ratios, floors = [], []
    for _ in range(REPS):
        base = per_call(floor)
        floors.append(base)
        ratios.append(per_call(op) / base)
    return {
        "floor_ms": round(statistics.median(floors) * 1000, 3),
        "operations": {name: _spread(ratios)},
        "langgraph": langgraph_peer(store, cold, folder, lg_url),
        "replay_rss": replay_rss(rss),
        "statements_per_call": {
            "replay": round(cold.statement_stats()["replay"]["statements_per_call"], 2)
        },
    }


def main_replay() -> int:
    """``reports/bench.py replay``: only the replay's rows (:func:`replay_only`),
    on DuckDB and, with ``TURNKEEPER_TEST_PG``, PostgreSQL, merged into the
    existing :data:`OUT` (each measured backend's cold replay row, LangGraph
    peers, replay RSS and replay statements replaced, the load average at its
    start kept under ``replay_alone``, every other figure kept as it was
    measured) and :data:`TABLE` regenerated from it, as ``encryption`` does.

    Raises:
        SystemExit: :data:`OUT` does not exist or lacks a measured backend
            (run the whole ``make bench`` first); nothing is written.
    """
    if not OUT.exists():
        raise SystemExit(f"{OUT} does not exist: run the whole benchmark first")
    result = json.loads(OUT.read_text(encoding="utf-8"))
    measured: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        path = f"{tmp}/store.duckdb"
        load = [round(x, 2) for x in os.getloadavg()]
        with (
            turnkeeper.open_store(path) as store,
            turnkeeper.open_store(path, replay_cache_bytes=0) as cold,
        ):
            measured["duckdb"] = replay_only(
                store, cold, duck_floor(tmp), tmp, "", f"{tmp}/rss.duckdb"
            ) | {"load_average": load}
    url = os.environ.get("TURNKEEPER_TEST_PG")
    if url:
        schema = pg_schema(url)
        load = [round(x, 2) for x in os.getloadavg()]
        with (
            turnkeeper.open_store(schema) as store,
            turnkeeper.open_store(schema, replay_cache_bytes=0) as cold,
        ):
            measured["postgres"] = replay_only(
                store, cold, pg_floor(schema), "", pg_schema(url), pg_schema(url)
            ) | {"load_average": load}
    missing = sorted(set(measured) - set(result["backends"]))
    if missing:
        raise SystemExit(
            f"{OUT} has no {', '.join(missing)} figures: run the whole benchmark first"
        )
    for name, section in measured.items():
        have = result["backends"][name]
        have["operations"].update(section["operations"])
        have["langgraph"] = section["langgraph"]
        have["replay_rss"] = section["replay_rss"]
        have["statements_per_call"].update(section["statements_per_call"])
        have["replay_alone"] = {
            "load_average": section["load_average"],
            "floor_ms": section["floor_ms"],
        }
    OUT.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    TABLE.write_text(table(result), encoding="utf-8")
    print(table(result))
    return 0


def default_threads_store(path: str) -> turnkeeper.BaseStore:
    """A DuckDB store on ``path`` opened with DuckDB's default worker threads
    (one per core) instead of the store's ``threads = 1``
    (``storage/duck/dialect.py`` ``THREADS``): the turn before that step, timed
    beside the store's. Each file is a DuckDB instance of its own, so the
    setting holds for this file only."""
    from turnkeeper.storage.duck import dialect

    settings = dialect.CONNECTION_SETTINGS
    dialect.CONNECTION_SETTINGS = tuple(s for s in settings if s[0] != dialect.THREADS[0])
    try:
        return turnkeeper.open_store(path)
    finally:
        dialect.CONNECTION_SETTINGS = settings


def turn_rows() -> int:
    """``reports/bench.py turn``: only the turn's rows (issue 21 part 2), on
    DuckDB and, with ``TURNKEEPER_TEST_PG``, PostgreSQL: the three-transaction
    turn × floor (median [min–max] over :data:`REPS`, the floor timed right
    before each), its milliseconds, the turn × a three-step DBOS workflow
    (:func:`dbos_peer`: SQLite beside DuckDB, the same server beside
    PostgreSQL) and its statements per phase. On DuckDB also the same turn on
    a store at DuckDB's default threads (:func:`default_threads_store`, the
    code before ``threads = 1``), timed in the same repetitions, and the
    ratio of the two per repetition. Printed, not
    written to ``reports/BENCH.md`` (``make bench`` writes that)."""

    def row(
        name: str,
        store: turnkeeper.BaseStore,
        floor: Op,
        dbos_url: str,
        before: turnkeeper.BaseStore | None = None,
    ) -> None:
        store.sessions.create("runs")
        lease = store.leases.acquire("session:runs", "bench", 3600, purpose="execution")
        turn = timed(lambda: three_transaction_turn(store, "runs", lease, USER))
        other: Op | None = None
        if before is not None:
            before.sessions.create("runs")
            held = before.leases.acquire("session:runs", "bench", 3600, purpose="execution")
            other = timed(lambda: three_transaction_turn(before, "runs", held, USER))
        ratios, floors, spent, was, was_ratios = [], [], [], [], []
        for _ in range(REPS):
            base = per_call(floor)
            took = per_call(turn)
            floors.append(base)
            spent.append(took)
            ratios.append(took / base)
            if other is not None:
                was.append(per_call(other))
                was_ratios.append(was[-1] / base)
        stmts = turn_statements(store)
        trips = turn_round_trips(store) if not isinstance(store, turnkeeper.DuckDBStore) else None
        dbos = dbos_peer(turn, dbos_url)
        versus = (
            f"{dbos['median']}× DBOS [{dbos['min']}–{dbos['max']}]" if "median" in dbos else dbos
        )
        print(
            f"{name}: {TURN_THREE}: {statistics.median(ratios):.2f}× floor "
            f"[{min(ratios):.2f}–{max(ratios):.2f}], {statistics.median(spent) * 1000:.3f} ms "
            f"(floor {statistics.median(floors) * 1000:.3f} ms); {versus}; "
            f"statements {stmts['total']} "
            f"({' / '.join(f'{op} {stmts[op]}' for op in TURN_PHASES)}); "
            + (
                f"round trips {trips['total']} "
                f"({' / '.join(str(trips[op]) for op in TURN_PHASES)}); "
                if trips
                else ""
            )
            + f"{os.cpu_count()} cores, load average {[round(x, 2) for x in os.getloadavg()]}"
        )
        if was:
            now_over_was = [a / b for a, b in zip(spent, was, strict=True)]
            print(
                f"{name}: the same turn at DuckDB's default threads (before threads = 1): "
                f"{statistics.median(was_ratios):.2f}× floor "
                f"[{min(was_ratios):.2f}–{max(was_ratios):.2f}], "
                f"{statistics.median(was) * 1000:.3f} ms; threads = 1 / default, per "
                f"repetition: {statistics.median(now_over_was):.3f} "
                f"[{min(now_over_was):.3f}–{max(now_over_was):.3f}]"
            )

    with (
        tempfile.TemporaryDirectory() as tmp,
        turnkeeper.open_store(f"{tmp}/s.duckdb") as store,
        default_threads_store(f"{tmp}/before.duckdb") as before,
    ):
        row("duckdb", store, duck_floor(tmp), f"sqlite:///{tmp}/dbos.sqlite", before)
    url = os.environ.get("TURNKEEPER_TEST_PG")
    if url:
        schema = pg_schema(url)
        with turnkeeper.open_store(schema) as store:
            dbos_url = url.replace("postgresql://", "postgresql+psycopg://", 1)
            row("postgres", store, pg_floor(schema), dbos_url)
    return 0


THREAD_COUNTS = (1, 16)
"""The writer counts of ``reports/bench.py threads`` (issue 21 part 4: 16 against one)."""


def thread_rows() -> int:
    """``reports/bench.py threads``: only the DuckDB writers' rows (issue 21
    part 4), on a durable file: per repetition (:data:`REPS`), the floor, then
    each count of :data:`THREAD_COUNTS` writers' fenced appends per second
    (:func:`threads`, each for :data:`WRITERS_S`), one right after the other,
    so each multiple of one writer compares rates taken under the same load;
    the median [min–max] of each multiple, each rate and the floor, and the
    appends' statements per call (a group commit's share, BEGIN and COMMIT
    included) and how many of them committed grouped. Printed, not written
    to ``reports/BENCH.md`` (``make bench`` writes that)."""
    multiples_of: dict[int, list[float]] = {n: [] for n in THREAD_COUNTS}
    rates: dict[int, list[float]] = {n: [] for n in THREAD_COUNTS}
    floors: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        floor = duck_floor(tmp)
        with turnkeeper.open_store(f"{tmp}/s.duckdb") as store:
            for _ in range(REPS):
                floors.append(per_call(floor))
                taken = {n: threads(store, n) for n in THREAD_COUNTS}
                for n, rate in taken.items():
                    rates[n].append(rate)
                    multiples_of[n].append(rate / taken[THREAD_COUNTS[0]])
            stats = store.statement_stats()["append"]
    for n in THREAD_COUNTS:
        x = multiples_of[n]
        print(
            f"duckdb: fenced appends, {n} threads, own sessions: "
            f"{statistics.median(x):.2f}× one thread [{min(x):.2f}–{max(x):.2f}], "
            f"{statistics.median(rates[n]):.0f}/s [{min(rates[n]):.0f}–{max(rates[n]):.0f}]"
        )
    print(
        f"floor {statistics.median(floors) * 1000:.3f} ms "
        f"[{min(floors) * 1000:.3f}–{max(floors) * 1000:.3f}]; append: "
        f"{stats['statements_per_call']:.2f} statements per call, "
        f"{stats['grouped']:.0f} of {stats['calls']:.0f} calls grouped; {REPS} repetitions "
        f"of {WRITERS_S} s; {os.cpu_count()} cores, load average "
        f"{[round(x, 2) for x in os.getloadavg()]}"
    )
    return 0


def main() -> int:
    load = [round(x, 2) for x in os.getloadavg()]
    backends: dict[str, Any] = {}
    rows = history(RUNS)
    with tempfile.TemporaryDirectory() as tmp:
        floor = duck_floor(tmp)
        path = f"{tmp}/store.duckdb"
        with (
            turnkeeper.open_store(path) as store,
            turnkeeper.open_store(path, replay_cache_bytes=0) as cold,
        ):
            backends["duckdb"] = measure(
                store,
                cold,
                floor,
                duckdb_bounds(tmp),
                rows,
                tmp,
                f"sqlite:///{tmp}/dbos.sqlite",
                f"{tmp}/big.duckdb",
                rss=f"{tmp}/rss.duckdb",
            )
            backends["duckdb"]["ledger"] = ledger(store)
        backends["duckdb"]["cli"] = big_session(tmp)
    url = os.environ.get("TURNKEEPER_TEST_PG")
    if url:
        schema = pg_schema(url)
        with (
            turnkeeper.open_store(schema) as store,
            turnkeeper.open_store(schema, replay_cache_bytes=0) as cold,
        ):
            dbos_url = url.replace("postgresql://", "postgresql+psycopg://", 1)
            least = postgres_bounds(pg_schema(url))
            backends["postgres"] = measure(
                store,
                cold,
                pg_floor(schema),
                least,
                rows,
                "",
                dbos_url,
                pg_schema(url),
                lg_url=pg_schema(url),
                rss=pg_schema(url),
            )
            backends["postgres"]["ledger"] = ledger(store, schema)
        backends["postgres"]["processes"] = multiples({n: processes(schema, n) for n in (1, 4, 8)})
    with tempfile.TemporaryDirectory() as tmp:
        for name, measured in encryption_section(sys.modules[__name__], tmp, url or "").items():
            backends[name]["encryption"] = measured
    result = {
        "floor": FLOOR_SQL.format(p="?") + " (autocommit)",
        "backends": backends,
        "machine": {
            "cores": os.cpu_count(),
            "load_average": load,
            "python": platform.python_version(),
            "duckdb": duckdb.__version__,
        },
        "size": {
            "reps": REPS,
            "min_s": MIN_S,
            "replay_entries": REPLAY_ENTRIES,
            "runs": RUNS,
            "writers_s": WRITERS_S,
            "big_sessions": BIG_SESSIONS,
            "big_copies": BIG_COPIES,
        },
    }
    OUT.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    TABLE.write_text(table(result), encoding="utf-8")
    print(table(result))
    return 0


def encryption_alone() -> int:
    """``reports/bench.py encryption``: only the encryption section
    (``reports/bench_encryption.py``), on DuckDB and, with
    ``TURNKEEPER_TEST_PG``, PostgreSQL, merged into the existing :data:`OUT`
    (each measured backend's ``encryption`` replaced, marked ``alone``, every
    other figure kept as it was measured) and :data:`TABLE` regenerated from
    it, so that the two stay one.

    Raises:
        SystemExit: :data:`OUT` does not exist or lacks a measured backend
            (run the whole ``make bench`` first); nothing is written.
    """
    if not OUT.exists():
        raise SystemExit(f"{OUT} does not exist: run the whole benchmark first")
    result = json.loads(OUT.read_text(encoding="utf-8"))
    url = os.environ.get("TURNKEEPER_TEST_PG", "")
    with tempfile.TemporaryDirectory() as tmp:
        measured = encryption_section(sys.modules[__name__], tmp, url)
    missing = sorted(set(measured) - set(result["backends"]))
    if missing:
        raise SystemExit(
            f"{OUT} has no {', '.join(missing)} figures: run the whole benchmark first"
        )
    for name, section in measured.items():
        result["backends"][name]["encryption"] = section | {"alone": True}
    OUT.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    TABLE.write_text(table(result), encoding="utf-8")
    print(table(result))
    return 0


if __name__ == "__main__":
    ONLY = {
        "turn": turn_rows,
        "replay": main_replay,
        "threads": thread_rows,
        "encryption": encryption_alone,
    }
    sys.exit(ONLY[sys.argv[1]]() if sys.argv[1:2] and sys.argv[1] in ONLY else main())
