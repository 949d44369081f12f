"""``turnkeeper keys rotate`` (rewrap every data key under the current master
key) and ``turnkeeper encrypt`` (seal an existing clear store in place,
session by session), over ``store.keys`` and ``store.sessions.encrypt``.

Both need the master key (``--key-file`` or ``$TURNKEEPER_MASTER_KEY``),
take their leases themselves, show progress on a terminal (rich, on
stderr), print a final report (``--json``: one object) and are resumable:
run again, they skip what is done.
"""

from __future__ import annotations

import os
import socket
from typing import Any

import click
import duckdb

from turnkeeper import BaseStore, is_postgres
from turnkeeper.spec import errors
from turnkeeper.spec.records import Lease
from turnkeeper.storage.ops.keys import BATCH_ROWS, ROTATION_TARGET

from .common import (
    EXIT_FAILED,
    CliError,
    db_option,
    dumps,
    key_provider,
    open_db,
    progress_bar,
)

TTL_S = 60.0
"""The leases' time to live, renewed between batches (rotation)."""

_CLEAR = "SELECT id FROM sessions WHERE key_version IS NULL ORDER BY id"


def _owner() -> str:
    return f"turnkeeper-cli:{socket.gethostname()}:{os.getpid()}"


def _check_into(db: str, into: str) -> None:
    if is_postgres(db):
        raise CliError("--into copies a DuckDB file; on PostgreSQL see the README")
    if os.path.exists(into):
        raise CliError(f"--into {into}: the file exists (give a new path)")


def _literal(path: str) -> str:
    return "'" + path.replace("'", "''") + "'"


def copy_database(source: str, target: str) -> None:
    """Copy the DuckDB store ``source`` into the new file ``target``: its
    schema and live rows (``COPY FROM DATABASE``), none of its freed blocks.

    Raises:
        CliError: DuckDB refused (the message in one line).
    """
    con = duckdb.connect()
    try:
        con.execute(f"ATTACH {_literal(source)} AS tk_source (READ_ONLY)")
        con.execute(f"ATTACH {_literal(target)} AS tk_target")
        con.execute("COPY FROM DATABASE tk_source TO tk_target")
    except duckdb.Error as exc:
        con.close()
        for leftover in (target, target + ".wal"):  # never a half copy taken for a store
            if os.path.exists(leftover):
                os.remove(leftover)
        raise CliError(f"copying {source} into {target}: {exc}") from exc
    con.close()


def _need_key() -> None:
    if key_provider() is None:
        raise CliError(
            "this command needs the master key: --key-file PATH or $TURNKEEPER_MASTER_KEY "
            "(the current key first, the old ones after)"
        )


@click.command("rotate")
@db_option()
@click.option(
    "--batch-rows",
    type=click.IntRange(min=1),
    default=BATCH_ROWS,
    show_default=True,
    help="Data keys rewrapped per transaction.",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.pass_context
def keys_rotate_command(ctx: click.Context, db: str, batch_rows: int, as_json: bool) -> None:
    """Rewrap every session's data key, and the store's check value, under the
    current master key (the first line of the key text), without touching
    the payloads, under the lease keys:rotation; batch by batch, resumable
    (run again after a crash: keys already current are skipped). Once it
    reports 0 remaining, drop the old key lines. Exits 2 on a refusal (the
    provider lacks an old key: KeyUnavailableError naming the session and
    key id; another rotation holds the lease: BusyError), 1 when keys remain.
    """
    _need_key()
    with open_db(db, existing=True) as store:
        lease = store.leases.acquire(ROTATION_TARGET, _owner(), TTL_S)
        try:
            first = store.keys.rotate(lease, limit=0)
            rewrapped, remaining = 0, first.remaining
            with progress_bar("rewrapping data keys") as bar:
                task = bar.add_task("rotate", total=first.remaining)
                while remaining:
                    lease = store.leases.renew(lease, TTL_S)
                    step = store.keys.rotate(lease, limit=batch_rows, batch_rows=batch_rows)
                    rewrapped += step.rewrapped
                    remaining = step.remaining
                    bar.update(task, completed=rewrapped)
                    if not step.rewrapped:  # rewritten meanwhile by another writer: stop
                        break
        finally:
            store.leases.release(lease)
        key_id = getattr(store.db.keyring.provider, "key_id", None)
    out: dict[str, Any] = {
        "key_id": key_id,
        "rewrapped": rewrapped,
        "already_current": first.already_current,
        "remaining": remaining,
        "check_rewrapped": first.check_rewrapped,
    }
    if as_json:
        click.echo(dumps(out))
    else:
        click.echo(
            f"master key {key_id}: {rewrapped} data keys rewrapped, "
            f"{first.already_current} already current, {remaining} remaining; check value "
            + ("rewrapped" if first.check_rewrapped else "already current")
        )
    if remaining:
        ctx.exit(EXIT_FAILED)


def _seal_one(store: BaseStore, session_id: str, owner: str) -> str | None:
    """Seal clear session ``session_id`` under its lease (``sessions.encrypt``):
    ``None`` when sealed now, ``""`` when it was sealed already, else why it
    was skipped (it stays clear: a later run seals it). A session with a run
    not ended and no live holder (a queued run, a crashed worker's: its
    session lease refuses an idle-session purpose,
    ``SessionRecoveryRequiredError``) is sealed without a lease: the reseal
    refuses while anyone holds a live one, in its own transaction."""
    lease: Lease | None = None
    try:
        try:
            lease = store.leases.acquire(f"session:{session_id}", owner, TTL_S)
        except errors.SessionRecoveryRequiredError:
            lease = None
        try:
            return None if store.sessions.encrypt(session_id, lease=lease) else ""
        finally:
            if lease is not None:
                store.leases.release(lease)
    except errors.BusyError as busy:
        return f"held by another worker ({busy})"
    except (errors.SessionNotFoundError, errors.RuntimeSessionNotFoundError):
        return "deleted meanwhile"
    except errors.NotSupportedError as refused:
        return f"not sealed: {refused.detail}"


@click.command("encrypt")
@db_option()
@click.option(
    "--no-reclaim",
    is_flag=True,
    help="Do not run CHECKPOINT (DuckDB) / VACUUM (PostgreSQL) afterwards.",
)
@click.option(
    "--into",
    "into",
    type=click.Path(dir_okay=False),
    default=None,
    help="DuckDB: then copy the sealed store into this new file (no freed blocks).",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.pass_context
def encrypt_command(
    ctx: click.Context, db: str, no_reclaim: bool, into: str | None, as_json: bool
) -> None:
    """Seal an existing clear store in place: the store is marked encrypted,
    then each clear session gets a data key and its payloads sealed, one
    session per transaction under that session's lease (a session another
    worker holds is skipped and named: run again later; so is one this
    turnkeeper cannot seal: a ledger under several tenants, or with blobs
    outside the database). Resumable: sealed
    sessions are skipped. Then the engine's free pages are reclaimed (DuckDB
    CHECKPOINT, PostgreSQL VACUUM); see the README ("Encryption at rest")
    for the copies that may still hold clear payloads and how to leave none.
    With --into NEW (DuckDB), once every session is sealed, the store is
    copied into the new file NEW (COPY FROM DATABASE: live rows only, none of
    the old file's freed blocks); replace the old file with it. Exits 1 when
    a session was skipped (nothing copied), 2 on a refusal.
    """
    _need_key()
    if into is not None:
        _check_into(db, into)
    sealed: list[str] = []
    skipped: dict[str, str] = {}
    owner = _owner()
    with open_db(db, existing=True) as store:
        clear = [str(r["id"]) for r in store.query(_CLEAR).to_pylist()]
        total = store.query("SELECT count(*) AS n FROM sessions").to_pylist()[0]["n"]
        with progress_bar("sealing sessions") as bar:
            task = bar.add_task("encrypt", total=len(clear))
            for n, session_id in enumerate(clear, 1):
                why = _seal_one(store, session_id, owner)
                if why is None:
                    sealed.append(session_id)
                elif why:
                    skipped[session_id] = why
                bar.update(task, completed=n)
        reclaimed = [] if no_reclaim else store.keys.reclaim()
    copied = None
    if into is not None and not skipped:
        copy_database(db, into)
        copied = into
    out: dict[str, Any] = {
        "sealed": len(sealed),
        "already_sealed": int(total) - len(clear),
        "skipped": skipped,
        "reclaimed": reclaimed,
        "into": copied,
    }
    if as_json:
        click.echo(dumps(out))
    else:
        for session_id, why in skipped.items():
            click.echo(f"skipped {session_id}: {why}", err=True)
        click.echo(
            f"{len(sealed)} sessions sealed, {out['already_sealed']} already sealed, "
            f"{len(skipped)} skipped; reclaimed: {', '.join(reclaimed) or 'nothing'}"
            + (f"; copied into {copied}" if copied else "")
        )
        if into is not None and skipped:
            click.echo(f"not copied into {into}: sessions are still clear", err=True)
    if skipped:
        ctx.exit(EXIT_FAILED)
