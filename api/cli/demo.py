"""``turnkeeper demo``: run a simulated fleet against one store, then audit what it stored.

Prints a rich table (or, with ``--json``, one JSON object with the same
figures): turns committed, stale writes fenced, takeovers, busy refusals,
store operations per second, statements per call of the hot operations (of
every process's store) and one row per audit check, then the database file
it used (``db`` in JSON). Exits 1 when any audit check fails, and a fleet
that committed fewer than ``--min-turns`` turns fails one (``fleet_did_work``).
The default file is :data:`DEMO_DB`.
"""

from __future__ import annotations

import math
import secrets
import shlex
import time
from dataclasses import asdict
from datetime import datetime
from typing import Any

import click
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from turnkeeper.spec.errors import SessionIDExistsError
from turnkeeper.storage import BaseStore
from turnkeeper.storage.audit import Check, run_audit

from .common import EXIT_FAILED, dumps, fmt_num, open_db, stdout_console
from .fleet import DEFAULT_TTL_S, FleetConfig, WorkerStats
from .fleet_ledger import late_check
from .fleet_runners import (
    JOIN_S,
    READY_S,
    Flag,
    ProcessFleet,
    ThreadFleet,
    merge_statements,
    stats_delta,
)
from .fleet_services import ServiceStats

HOT_OPERATIONS = (
    "acquire_lease",
    "renew_lease",
    "release_lease",
    "append",
    "finalize",
    "admit_run",
    "finish_run",
    "claim_delivery",
    "finish_delivery",
)
"""Operations whose statements per call the table shows (JSON has every operation)."""

DRAIN_S = 2.0
"""Seconds, beyond three lease TTLs, that the drain after the workers stop waits
for the services to make progress (to converge one more orphan or settle one
more delivery) before it gives up; it ends as soon as nothing is left to do,
and the demo reports its time apart from the fleet's."""

STALLED_FLEET_S = 60.0
"""Seconds past ``--duration`` that a fleet short of ``--min-turns`` gets to
commit its next turn before it is stopped (a hang guard: the demo then fails
its ``fleet_did_work`` check)."""

PROGRESS_TICK_S = 0.1
"""Seconds between progress-bar refreshes (and checks for finished workers)."""

DEMO_DB = "turnkeeper-demo.duckdb"
"""The demo's default database file (in the current directory), apart from the
``turnkeeper.duckdb`` every other command defaults to, so a demo never writes
into a runtime's real store."""

MAX_DURATION_S = 86_400.0
"""Longest ``--duration`` accepted (a day)."""

MAX_TTL_S = 3_600.0
"""Longest ``--ttl`` accepted (an hour; stalled workers sleep past it)."""

MAX_MIN_TURNS = 1_000_000
"""Largest ``--min-turns`` accepted."""


class Seconds(click.FloatRange):
    """A finite number of seconds in ``(minimum, maximum]``: refuses ``nan``, ``inf``,
    zero and negatives (``FloatRange`` alone lets ``nan`` through)."""

    name = "seconds"

    def __init__(self, minimum: float, maximum: float) -> None:
        super().__init__(min=minimum, max=maximum, min_open=True)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = click.FLOAT.convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number of seconds.", param, ctx)
        return super().convert(number, param, ctx)


def ensure_sessions(store: BaseStore, cfg: FleetConfig) -> list[str]:
    """Create (or reuse, when the database already has them) ``demo-<seed>-<n>``."""
    ids = [f"demo-{cfg.seed}-{n}" for n in range(cfg.sessions)]
    for n, sid in enumerate(ids):
        try:
            store.sessions.create(sid, cwd=f"/demo/project-{n % 5}", header={"demo": True})
        except SessionIDExistsError:
            continue
        store.sessions.set_title(sid, f"Demo session {n} (seed {cfg.seed})")
    return ids


def db_now(store: BaseStore) -> datetime:
    """The database clock's now (aware UTC)."""
    value: datetime = store.query("SELECT now() AS now").column("now")[0].as_py()
    return value


def _count_takeovers(store: BaseStore, session_ids: list[str], since: datetime) -> int:
    table = store.query(
        "SELECT count(*) AS n FROM lease_events WHERE edge = 'takeover' AND occurred_at >= ? "
        "AND target IN (SELECT 'session:' || unnest(?::VARCHAR[]))",
        [since, session_ids],
    )
    return int(table.column("n")[0].as_py())


def _ready(fleet: ThreadFleet | ProcessFleet, console: Console | None) -> bool:
    """Wait until every unit of ``fleet`` is ready (a spinner on ``console`` if given)."""
    if console is None:
        return fleet.wait_ready(READY_S)
    with console.status("starting the fleet"):
        return fleet.wait_ready(READY_S)


def _wait(
    fleet: ThreadFleet | ProcessFleet,
    cfg: FleetConfig,
    console: Console | None,
    start: float,
) -> None:
    """Run the workers from ``start`` (monotonic seconds) for ``cfg.duration_s``
    seconds and past that until they committed ``cfg.min_turns`` turns, then set
    the fleet's stop flag (a stalled worker stops waiting instead of outliving
    the fleet's time) and wait for the workers, showing a time-based progress
    bar on ``console`` if given. A fleet short of its turns is stopped anyway
    once :data:`STALLED_FLEET_S` pass past the deadline without a new turn."""
    deadline = start + cfg.duration_s
    progress = Progress(
        TextColumn("[bold]fleet"),
        BarColumn(),
        TextColumn("{task.completed:>4.1f}/{task.total:.0f} s"),
        TimeElapsedColumn(),
        TextColumn(
            "{task.fields[turns]} turns · {task.fields[fenced]} fenced · {task.fields[busy]} busy"
        ),
        console=console,
        disable=console is None,
    )
    turns_seen, last_turn_at = 0, start
    with progress:
        task = progress.add_task("fleet", total=cfg.duration_s, turns=0, fenced=0, busy=0)
        while fleet.workers_alive():
            now = time.monotonic()
            stats = fleet.live_stats()
            turns = sum(s.turns_committed for s in stats)
            if turns > turns_seen:
                turns_seen, last_turn_at = turns, now
            if now >= deadline and (
                turns >= cfg.min_turns or now - max(deadline, last_turn_at) >= STALLED_FLEET_S
            ):
                fleet.stop.set()
            progress.update(
                task,
                completed=min(now - start, cfg.duration_s),
                turns=turns,
                fenced=sum(
                    s.stale_appends_fenced
                    + s.stale_ledger_appends_fenced
                    + s.stale_finalizes_fenced
                    + s.stale_finishes_fenced
                    for s in stats
                ),
                busy=sum(s.busy_refusals for s in stats),
            )
            fleet.join_workers(PROGRESS_TICK_S)
        progress.update(task, completed=cfg.duration_s)


def run_fleet(store: BaseStore, cfg: FleetConfig, console: Console | None) -> dict[str, Any]:
    """Start the fleet, run it once every unit is ready, drain, audit the result,
    return the figures.

    ``startup_s`` is the time the units took to be ready (a process fleet's
    processes import and connect first). The workers then run for
    ``cfg.duration_s`` seconds, and past that until they committed
    ``cfg.min_turns`` turns (``fleet_s`` is the time until they stopped: the
    operation each had in flight finishes first). Then the drain
    (``drain_s``) gives the recovery coordinators and outbox workers the time
    they need to converge the orphans the workers left and settle the outbox:
    it ends as soon as nothing is left, or once they made no progress for
    three lease TTLs plus :data:`DRAIN_S` (``unsettled`` then says how much
    was left). ``elapsed_s`` is fleet and drain. The statement figures are
    those of every process's store. ``console`` shows a progress bar while
    the fleet runs (``None``: no bar). The returned dict is what ``--json``
    prints; ``audit`` holds one dict per check and ``audit_passed`` whether
    all passed; the check ``fleet_did_work`` fails when the fleet committed
    fewer than ``cfg.min_turns`` turns.
    """
    session_ids = ensure_sessions(store, cfg)
    run_id = secrets.token_hex(3)
    url = getattr(store.db, "url", None)
    fleet: ThreadFleet | ProcessFleet = (
        ProcessFleet(url, cfg, session_ids, run_id)
        if isinstance(url, str)  # PostgreSQL: the fleet runs as processes
        else ThreadFleet(store, cfg, session_ids, run_id)
    )
    spawned = time.monotonic()
    try:
        fleet.start()  # inside: a Ctrl-C held during start() is raised as it returns
        ready = _ready(fleet, console)
        t0 = time.monotonic()
        startup_s = t0 - spawned
        started_at = db_now(store)
        before = store.statement_stats()
        if ready:
            fleet.go()
            _wait(fleet, cfg, console, t0)
        fleet.stop.set()
        fleet.join_workers(JOIN_S)
        fleet_s = time.monotonic() - t0
        unsettled = _drain(store, fleet.service_stop, 3 * cfg.ttl_s + DRAIN_S)
    finally:
        stats, service_parts, unit_statements = fleet.finish()
    elapsed = time.monotonic() - t0
    statements = merge_statements([stats_delta(before, store.statement_stats()), *unit_statements])
    figures = summarize(stats, cfg, elapsed, statements)
    figures.update(
        startup_s=round(startup_s, 3),
        fleet_s=round(fleet_s, 3),
        drain_s=round(elapsed - fleet_s, 3),
        unsettled=unsettled,
    )
    service_stats = ServiceStats.merged(service_parts)
    figures.update(services_summary(service_stats))
    figures["takeovers"] = _count_takeovers(store, session_ids, started_at)
    figures.update(db=store.path, run_id=run_id)
    checks = run_audit(
        store,
        session_ids,
        refused_markers=[m for s in stats for m in s.refused_markers],
        refused_records=[r for s in stats for r in s.refused_records],
    )
    attempted = 4 * sum(s.stalls for s in stats)  # append, ledger append, finish, finalize
    checks.append(
        Check(
            "stale_writes_refused",
            "every write a stalled worker tried with its expired lease was refused",
            sum(s.stale_writes_accepted for s in stats),
            attempted,
        )
    )
    checks.append(late_check(store, session_ids, stats))
    checks.append(
        Check(
            "stale_delivery_acks_refused",
            "every acknowledgement an outbox worker sent after its claim expired was refused",
            service_stats.stale_acks_accepted,
            service_stats.stale_acks_fenced + service_stats.stale_acks_accepted,
        )
    )
    errors = [e for s in stats for e in s.errors] + service_stats.errors
    checks.append(
        Check(
            "workers_error_free",
            "no worker or service hit an unexpected error",
            len(errors),
            sum(s.iterations for s in stats),
            "; ".join(errors[:3]),
        )
    )
    turns = figures["turns_committed"]
    checks.append(
        Check(
            "fleet_did_work",
            f"the fleet committed at least {cfg.min_turns} turns (--min-turns)",
            max(0, cfg.min_turns - turns),
            turns,
            f"{turns} turns in {figures['iterations']} iterations"
            + ("" if ready else f"; the fleet's units were not all ready after {READY_S:.0f} s"),
        )
    )
    figures["audit"] = [c.as_dict() for c in checks]
    figures["audit_passed"] = all(c.passed for c in checks)
    return figures


UNSETTLED_SQL = (
    "SELECT (SELECT count(*) FROM active_runs) + (SELECT count(*) FROM delivery_operations o "
    "LEFT JOIN delivery_operations d ON d.id = o.depends_on "
    "WHERE o.status NOT IN ('delivered', 'unsupported', 'failed', 'uncertain') "
    "AND coalesce(d.status NOT IN ('failed', 'uncertain'), TRUE)) AS n"
)
"""What the drain waits for: non-terminal runs, and delivery operations that are
not terminal and not blocked for good by a failed or uncertain dependency (a
``send`` whose ``upload`` failed is never claimable; the demo's plans have one
level of dependency)."""


def _drain(store: BaseStore, stop: Flag, quiet_s: float) -> int:
    """Give the services the time they need to converge every orphan and settle
    every delivery (see :data:`UNSETTLED_SQL`): ends as soon as nothing is
    left, or once ``quiet_s`` seconds passed without a new low in what is
    left (so a loaded machine, slow but progressing, is not cut short), or
    when ``stop`` is set. Returns what was left (0: everything settled)."""
    lowest, since = -1, time.monotonic()
    while True:
        left = int(store.query(UNSETTLED_SQL).column("n")[0].as_py())
        if left == 0 or stop.is_set():
            return left
        if lowest < 0 or left < lowest:
            lowest, since = left, time.monotonic()
        elif time.monotonic() - since >= quiet_s:
            return left
        stop.wait(PROGRESS_TICK_S)


def services_summary(stats: ServiceStats) -> dict[str, Any]:
    """The recovery coordinator's and outbox workers' figures."""
    ttr = sorted(stats.time_to_recovery_s)
    return {
        "recoveries_converged": stats.recoveries_converged,
        "recovery_leases_lost": stats.recovery_lost,
        "tools_interrupted": stats.tools_interrupted,
        "time_to_recovery_s": {
            "median": round(ttr[len(ttr) // 2], 3) if ttr else None,
            "max": round(ttr[-1], 3) if ttr else None,
        },
        "deliveries": {
            "claims": stats.claims,
            "claim_refusals": stats.claim_refusals,
            "delivered": stats.delivered,
            "requeued": stats.requeued,
            "failed": stats.failed,
            "uncertain": stats.uncertain,
            "repeated_acks": stats.repeated_acks,
            "replies_read": stats.replies_read,
            "stale_acks_fenced": stats.stale_acks_fenced,
            "claims_lost": stats.claims_lost,
        },
    }


def summarize(
    stats: list[WorkerStats],
    cfg: FleetConfig,
    elapsed_s: float,
    statements: dict[str, dict[str, float]],
) -> dict[str, Any]:
    """Fold the workers' counters and the statement deltas into the result figures."""

    def total(name: str) -> int:
        return sum(int(getattr(s, name)) for s in stats)

    operations = sum(int(v["calls"]) for v in statements.values())
    config = asdict(cfg)
    return {
        "seed": cfg.seed,
        "workers": cfg.workers,
        "sessions": cfg.sessions,
        "duration_s": cfg.duration_s,
        "ttl_s": cfg.ttl_s,
        "config": config,
        "elapsed_s": round(elapsed_s, 3),
        "iterations": total("iterations"),
        "turns_committed": total("turns_committed"),
        "entries_written": total("entries_written"),
        "stale_writes_fenced": total("stale_appends_fenced")
        + total("stale_ledger_appends_fenced")
        + total("stale_finalizes_fenced")
        + total("stale_finishes_fenced"),
        "stale_appends_fenced": total("stale_appends_fenced"),
        "stale_finalizes_fenced": total("stale_finalizes_fenced"),
        "stale_ledger_appends_fenced": total("stale_ledger_appends_fenced"),
        "ledger_records": total("ledger_records"),
        "stale_writes_accepted": total("stale_writes_accepted"),
        "lost_mid_turn": total("lost_mid_turn"),
        "busy_refusals": total("busy_refusals"),
        "stalls": total("stalls"),
        "abandoned": total("abandoned"),
        "crashes": total("crashes"),
        "runs_admitted": total("runs_admitted"),
        "run_retries": total("retries"),
        "run_active_refusals": total("run_active_refusals"),
        "tool_calls": total("tool_calls"),
        "stale_finishes_fenced": total("stale_finishes_fenced"),
        "records_finalized": total("finalized"),
        "conflicts_given_up": total("conflicts"),
        "store_operations": operations,
        "ops_per_s": round(operations / elapsed_s, 1) if elapsed_s > 0 else 0.0,
        "retries": sum(int(v["retries"]) for v in statements.values()),
        "statements": statements,
        "errors": [e for s in stats for e in s.errors][:20],
        "first_choices": {str(s.index): list(s.choices) for s in stats},
    }


def render(console: Console, figures: dict[str, Any]) -> None:
    """Print the figures as one rich table (fleet, statements per call, audit), then
    the database file the run used."""
    table = Table(
        title=(
            f"turnkeeper demo: {figures['workers']} workers, {figures['sessions']} sessions, "
            f"{figures['fleet_s']:.1f} s fleet + {figures['drain_s']:.1f} s drain "
            f"(started in {figures['startup_s']:.1f} s), "
            f"seed {figures['seed']}, ttl {figures['ttl_s']} s"
        ),
        title_justify="left",
    )
    table.add_column("figure")
    table.add_column("value", justify="right")
    table.add_column("note", overflow="fold")
    f = figures
    d, ttr = f["deliveries"], f["time_to_recovery_s"]
    rows: list[tuple[str, str, str]] = [
        (
            "runs succeeded",
            fmt_num(f["turns_committed"]),
            f"{f['runs_admitted']:,} admitted ({f['run_retries']:,} retries), "
            f"{f['entries_written']:,} entries, "
            f"{f['tool_calls']:,} tool calls",
        ),
        (
            "stale writes fenced",
            fmt_num(f["stale_writes_fenced"]),
            f"{f['stale_appends_fenced']} appends, "
            f"{f['stale_ledger_appends_fenced']} ledger appends, "
            f"{f['stale_finishes_fenced']} run ends, "
            f"{f['stale_finalizes_fenced']} finalizes after {f['stalls']} stalls",
        ),
        (
            "orphans recovered",
            fmt_num(f["recoveries_converged"]),
            f"left by {f['crashes']} crashes, {f['stalls']} stalls and "
            f"{f['lost_mid_turn']} leases lost mid-turn; {f['tools_interrupted']} tool "
            f"calls interrupted; median {ttr['median']} s, max {ttr['max']} s to recovery; "
            f"{f['recovery_leases_lost']} recovery leases lost (fenced, retried)",
        ),
        (
            "replies delivered",
            fmt_num(d["delivered"]),
            f"{d['claims']:,} claims won, {d['claim_refusals']:,} lost to another worker; "
            f"{d['requeued']} "
            f"requeued, {d['failed']} failed, {d['uncertain']} uncertain, "
            f"{d['repeated_acks']} repeated acks, {d['stale_acks_fenced']} stale acks fenced, "
            f"{d['claims_lost']} claims expired before the ack (fenced, retried)",
        ),
        (
            "admissions refused",
            fmt_num(f["run_active_refusals"]),
            "the session still had a non-terminal run",
        ),
        ("leases lost mid-turn", fmt_num(f["lost_mid_turn"]), "refused, counted apart"),
        ("takeovers", fmt_num(f["takeovers"]), f"{f['abandoned']} leases abandoned"),
        ("busy refusals", fmt_num(f["busy_refusals"]), f"{f['iterations']:,} iterations"),
        ("thread records finalized", fmt_num(f["records_finalized"]), ""),
        (
            "ledger records appended",
            fmt_num(f["ledger_records"]),
            "turn_started, step_done, turn_done … under the session lease",
        ),
        (
            "store operations / s",
            fmt_num(f["ops_per_s"]),
            f"{f['store_operations']:,} ops, {f['retries']:,} conflict retries",
        ),
    ]
    for row in rows:
        table.add_row(*row)
    table.add_section()
    for op in HOT_OPERATIONS:  # every one, so a run too short (or too loaded) to call one says so
        s = f["statements"].get(op)
        if s is None:
            table.add_row(f"statements / {op}", "—", "not called in this run")
        else:
            table.add_row(
                f"statements / {op}",
                f"{s['statements_per_call']:.2f}",
                f"{int(s['calls']):,} calls, {int(s['retries']):,} retries",
            )
    table.add_section()
    for check in f["audit"]:
        verdict = "[green]PASS[/]" if check["passed"] else "[bold red]FAIL[/]"
        note = f"{check['violations']} violations / {check['checked']:,} checked"
        if check["detail"]:
            note += f": {check['detail']}"
        table.add_row(f"audit: {check['name']}", verdict, note)
    console.print(table)
    db = str(f["db"])
    console.print(
        f"database: {db} (analyse it: turnkeeper report --db {shlex.quote(db)})",
        markup=False,
        highlight=False,
        soft_wrap=True,
    )


@click.command("demo")
@click.option(
    "--db",
    type=str,
    default=DEMO_DB,
    show_default=True,
    help="DuckDB database file (the demo's own, not turnkeeper.duckdb), or a "
    "postgresql:// URL: then the fleet runs as processes.",
)
@click.option("--workers", type=click.IntRange(min=1), default=8, show_default=True)
@click.option("--sessions", type=click.IntRange(min=1), default=20, show_default=True)
@click.option(
    "--duration",
    type=Seconds(0.0, MAX_DURATION_S),
    default=20.0,
    show_default=True,
    help="Seconds the fleet runs once its workers are ready (> 0, at most a day).",
)
@click.option(
    "--min-turns",
    type=click.IntRange(min=1, max=MAX_MIN_TURNS),
    default=1,
    show_default=True,
    help="Turns the fleet must commit: it runs past --duration until it has, and "
    "fails its audit if it cannot.",
)
@click.option(
    "--seed", type=int, default=None, help="Seed for repeatable choices (default: random)."
)
@click.option(
    "--ttl",
    type=Seconds(0.0, MAX_TTL_S),
    default=DEFAULT_TTL_S,
    show_default=True,
    help="Lease and outbox claim TTL in seconds (> 0, at most an hour); stalls sleep past it.",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of a table.")
@click.pass_context
def demo_command(
    ctx: click.Context,
    db: str,
    workers: int,
    sessions: int,
    duration: float,
    min_turns: int,
    seed: int | None,
    ttl: float,
    as_json: bool,
) -> None:
    """Run W worker threads sharing one store for SECONDS, racing for S sessions.

    Workers take session leases (TTL in seconds), append pi-style turns,
    finalize thread records, and now and then stall past the TTL (their late
    writes must be fenced), crash mid-run or abandon a lease (a later worker
    takes it over). Recovery coordinators converge the orphans and outbox
    workers deliver the replies. The clock starts once every worker and
    service is ready (on PostgreSQL they are processes, which take a while
    to start); after SECONDS, and once the fleet committed --min-turns
    turns, the workers stop and the drain gives the services the time they
    need to finish (it gives up once they made no progress for three TTLs
    + 2 s); the title shows the times (startup_s, fleet_s, drain_s and
    elapsed_s in JSON). Prints the figures and an audit of the stored data
    as a table (or one JSON object with --json) and the database file used;
    exits 1 if any audit check fails, fleet_did_work included (fewer than
    --min-turns turns: a fleet that did nothing fails). The default database
    is turnkeeper-demo.duckdb, apart from the turnkeeper.duckdb the other
    commands default to.
    """
    if seed is None:
        seed = secrets.randbelow(1_000_000)
    cfg = FleetConfig(
        workers=workers,
        sessions=sessions,
        duration_s=duration,
        seed=seed,
        ttl_s=ttl,
        min_turns=min_turns,
    )
    console = stdout_console()
    show_bar = not as_json and console.is_terminal
    with open_db(db) as store:
        figures = run_fleet(store, cfg, console if show_bar else None)
    if as_json:
        click.echo(dumps(figures))
    else:
        render(console, figures)
    if not figures["audit_passed"]:
        ctx.exit(EXIT_FAILED)
