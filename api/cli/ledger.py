"""``turnkeeper ledger``: a session's ledger from the command line
(``store.ledger``): ``append``, ``replay``, ``verify``, ``gc`` and ``repair``.

Every subcommand takes ``--db`` (a DuckDB file or a PostgreSQL URL) and
``--tenant`` (default ``""``, sessionstore WithTenant). Blobs are read from
and written to the database's own table (``ledger_blobs``) unless
``--blobs ROOT`` names an fsspec directory or URL (``FsspecBlobs``).
The commands that write (``append``, ``gc``) take the session's lease
``session:<id>`` as ``--owner`` for ``--ttl`` seconds, open the writer (its
fence record), do their work and release the lease; a lease another owner
holds is refused (``BusyError``, exit 2).

Exit statuses are the CLI's (``main``): 0 done; 1 ``verify`` found damage;
2 refused (one stderr line naming the error class); 130 interrupted.
"""

from __future__ import annotations

import base64
import hashlib
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict
from functools import partial
from typing import Any, TypeVar

import click
from rich.progress import Progress

from turnkeeper.spec import errors
from turnkeeper.spec.ledger import LedgerEntry
from turnkeeper.spec.records import Lease
from turnkeeper.storage import BaseStore
from turnkeeper.storage.audit.verify import Verified, describe_verified, verify_ledger
from turnkeeper.storage.ops.ledger import Ledger
from turnkeeper.storage.ops.ledger.blobs import (
    DEFAULT_OFFLOAD_THRESHOLD,
    DEFAULT_TEMP_GRACE_S,
    MAX_BODY_BYTES,
    BlobStore,
)
from turnkeeper.storage.validate import MAX_TTL_S as MAX_TEMP_GRACE_S

from .common import EXIT_FAILED, db_option, dumps, one_line, open_db, progress_bar, visible

F = TypeVar("F", bound=Callable[..., Any])

DEFAULT_OWNER = "turnkeeper-cli"
"""The lease owner ``append`` and ``gc`` take the session's lease as."""

DEFAULT_TTL_S = 30.0
"""The lease's time to live (seconds) ``append`` and ``gc`` ask for."""


def _options(*, blobs: bool, writes: bool) -> Callable[[F], F]:
    """The options every ledger subcommand shares: ``--db``, ``--tenant``, and
    ``--blobs`` (commands that read or write blobs), ``--owner``/``--ttl``
    (commands that write under the session's lease)."""

    def wrap(f: F) -> F:
        f = db_option()(f)
        f = click.option(
            "--tenant", default="", show_default=False, help="The ledger's tenant (default: none)."
        )(f)
        if blobs:
            f = click.option(
                "--blobs",
                "blobs_root",
                default=None,
                metavar="ROOT",
                help="Blobs in this fsspec directory or URL (FsspecBlobs) instead of the "
                "database's ledger_blobs table.",
            )(f)
        if writes:
            f = click.option(
                "--owner",
                default=DEFAULT_OWNER,
                show_default=True,
                help="Owner the session's lease is taken as.",
            )(f)
            f = click.option(
                "--ttl",
                type=click.FloatRange(min=0.001, max=3600),
                default=DEFAULT_TTL_S,
                show_default=True,
                help="Lease time to live, seconds.",
            )(f)
        return f

    return wrap


def _warn(failure: Exception) -> None:
    click.echo(
        f"turnkeeper: warning: the catalog entry was not updated: "
        f"{type(failure).__name__}: {one_line(str(failure))}",
        err=True,
    )


def _ledger(store: BaseStore, tenant: str, blobs_root: str | None, **kw: Any) -> Ledger:
    """``store``'s ledger for ``tenant``, with its blobs under ``blobs_root``
    (fsspec) or in the database; a catalog update that fails is a one-line
    warning on stderr (the library's default logs a traceback)."""
    store.ledger.catalog.configure(on_update_failed=_warn)
    ledger: Ledger = store.ledger.with_tenant(tenant)
    if blobs_root is None and not kw:
        return ledger
    blobs: BlobStore | None = None
    if blobs_root is not None:
        from turnkeeper.storage.ops.ledger.blob_files import FsspecBlobs

        blobs = FsspecBlobs(blobs_root)
    return ledger.with_blobs(blobs, **kw)


@contextmanager
def _writer(
    store: BaseStore, ledger: Ledger, session_id: str, owner: str, ttl: float
) -> Iterator[Any]:
    """The session's lease taken as ``owner`` and its ledger writer opened;
    the lease is released afterwards (whatever happened)."""
    if store.sessions.get(session_id) is None:
        raise errors.SessionNotFoundError(session_id)
    lease: Lease = store.leases.acquire(f"session:{session_id}", owner, ttl)
    try:
        yield ledger.open(session_id, lease)
    finally:
        store.leases.release(lease)  # idempotent: a lost or released lease is left alone


def _advance(bar: Progress, task: Any, base: int, n: int) -> None:
    """Show ``base + n`` records done on ``bar``."""
    bar.update(task, completed=base + n)


PROGRESS_EVERY = 256
"""Records between two updates of a progress bar."""


@click.group("ledger")
def ledger_group() -> None:
    """A session's ledger: append, replay, verify, gc, repair (see each --help)."""


@ledger_group.command("append")
@click.argument("session_id")
@click.option("--kind", required=True, help="The record's kind (not fence or blobptr).")
@click.option(
    "--id",
    "idempotency_id",
    default=None,
    help="Idempotency id (default: sha256 of the kind and payload, so re-running the "
    "same command is a duplicate).",
)
@click.option(
    "--file",
    "path",
    type=click.Path(exists=True, dir_okay=False, readable=True),
    default=None,
    help="Read the payload from this file (default: stdin).",
)
@click.option(
    "--offload-threshold",
    type=click.IntRange(min=0),
    default=DEFAULT_OFFLOAD_THRESHOLD,
    show_default=True,
    help="Payloads longer than this many bytes are stored as a blob and a pointer.",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@_options(blobs=True, writes=True)
def append_command(
    session_id: str,
    kind: str,
    idempotency_id: str | None,
    path: str | None,
    offload_threshold: int,
    as_json: bool,
    db: str,
    tenant: str,
    blobs_root: str | None,
    owner: str,
    ttl: float,
) -> None:
    """Append one record to SESSION_ID's ledger: its payload is the bytes of
    --file or of stdin, stored exactly.

    Takes the lease session:SESSION_ID as --owner, opens the ledger's writer
    (a fence record carrying the lease's epoch), appends, releases the lease.
    Prints the record's sequence, and whether it was a duplicate (an
    idempotency id already in the ledger with the same kind and payload: its
    original sequence, nothing written). A lease held by another owner is
    BusyError, an id already used for other content
    LedgerIdempotencyConflictError (exit 2, nothing written). The entry is
    checked before the lease is taken (a reserved kind or id, a catalog
    kind's payload the catalog cannot fold: InvalidInputError, exit 2, no
    fence record written).
    """
    if path is None:
        payload = _read_payload(sys.stdin.buffer, "stdin")
    else:
        with open(path, "rb") as f:
            payload = _read_payload(f, path)
    if idempotency_id is None:
        digest = hashlib.sha256(kind.encode() + b"\0" + payload).hexdigest()
        idempotency_id = f"sha256:{digest}"
    entry = LedgerEntry(kind, payload, idempotency_id)
    with open_db(db, existing=True) as store:
        ledger = _ledger(store, tenant, blobs_root, offload_threshold=offload_threshold)
        ledger.check_entries([entry])  # refused input: no lease taken, no fence record written
        with _writer(store, ledger, session_id, owner, ttl) as writer:
            result = writer.append(kind, payload, idempotency_id)
    if as_json:
        click.echo(
            dumps(
                {
                    "session_id": session_id,
                    "seq": result.seq,
                    "duplicate": result.duplicate,
                    "idempotency_id": idempotency_id,
                    "bytes": len(payload),
                }
            )
        )
        return
    dup = " (duplicate: already appended, nothing written)" if result.duplicate else ""
    click.echo(f"{session_id}: seq {result.seq}, id {idempotency_id}, {len(payload)} bytes{dup}")


def _read_payload(source: Any, name: str) -> bytes:
    """At most :data:`MAX_BODY_BYTES` bytes of ``source`` (a binary file).

    Raises:
        DurableBodyTooLargeError: there are more (read stops one byte past the
            ceiling: 400 MB on stdin used to be read whole first).
    """
    payload: bytes = source.read(MAX_BODY_BYTES + 1)
    if len(payload) > MAX_BODY_BYTES:
        raise errors.DurableBodyTooLargeError(
            0, name, len(payload), MAX_BODY_BYTES, detail="the payload is longer than the ceiling"
        )
    return payload


def record_json(record: Any) -> dict[str, Any]:
    """One replayed record as ``replay``'s JSON line: ``payload`` as UTF-8 text
    when it decodes, else base64 (``encoding`` says which)."""
    try:
        payload, encoding = record.payload.decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        payload, encoding = base64.b64encode(record.payload).decode("ascii"), "base64"
    return {
        "seq": record.seq,
        "kind": record.kind,
        "idempotency_id": record.idempotency_id,
        "epoch": record.epoch,
        "written_at": record.written_at,
        "encoding": encoding,
        "payload": payload,
    }


@ledger_group.command("replay")
@click.argument("session_id")
@click.option(
    "--from", "from_seq", type=click.IntRange(min=1), default=1, help="First sequence (1-based)."
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["jsonl", "text"]),
    default="jsonl",
    show_default=True,
    help="jsonl: one JSON object a record; text: one line a record.",
)
@_options(blobs=True, writes=False)
def replay_command(
    session_id: str, from_seq: int, fmt: str, db: str, tenant: str, blobs_root: str | None
) -> None:
    """Stream SESSION_ID's ledger from --from to its tip, verified, one record a line.

    jsonl: {"seq", "kind", "idempotency_id", "epoch", "written_at",
    "encoding", "payload"}: the payload as UTF-8 text ("encoding": "utf-8")
    or, when it is not UTF-8, base64 ("encoding": "base64"); offloaded
    records are resolved to their own kind and payload. text: "SEQ KIND ID
    epoch E: PAYLOAD" (control characters escaped; a payload that is not
    UTF-8 as base64:…). Reads one page of records at a time (bounded memory).
    A damaged record stops the stream at its sequence with the typed error
    (exit 2): nothing unverified is printed.
    """
    with open_db(db, read_only=True) as store:
        ledger = _ledger(store, tenant, blobs_root)
        total = max(0, ledger.tip(session_id) - from_seq + 1)
        with progress_bar("replay") as bar:
            task = bar.add_task("replay", total=total)
            for n, record in enumerate(ledger.replay(session_id, from_seq), 1):
                if fmt == "jsonl":
                    click.echo(dumps(record_json(record)))
                else:
                    r = record_json(record)
                    body = r["payload"]
                    shown = (
                        visible(one_line(body)) if r["encoding"] == "utf-8" else f"base64:{body}"
                    )
                    click.echo(
                        f"{r['seq']} {r['kind']} {r['idempotency_id']} epoch {r['epoch']}: {shown}"
                    )
                if n % PROGRESS_EVERY == 0:
                    bar.update(task, completed=n)


def verify_session(
    store: BaseStore,
    tenant: str,
    blobs_root: str | None,
    session_id: str,
    tick: Callable[[int], None] = lambda n: None,
) -> Verified:
    """Replay ``session_id``'s whole ledger, verifying every record (hash,
    sequence, fences, blob pointers and blobs); the damage found, if any, as
    a :class:`Verified` (never raised): :func:`verify_ledger` on the ledger
    of ``tenant`` with its blobs under ``blobs_root`` (or in the database).
    ``tick(n)`` is called every :data:`PROGRESS_EVERY` records.

    Raises:
        EmptySessionError, SessionNotFoundError: nothing to verify.
    """
    ledger = _ledger(store, tenant, blobs_root)
    keyless = store.db.keyring.provider is None
    return verify_ledger(ledger, session_id, keyless=keyless, tick=tick, every=PROGRESS_EVERY)


def ledger_sessions(store: BaseStore, tenant: str) -> list[str]:
    """Every session with a ledger for ``tenant``, by id: a tip or a record
    (a ledger whose tip row was lost is still verified, and fails)."""
    rows = store.query(
        "SELECT session_id FROM ledger_tips WHERE tenant = ? "
        "UNION SELECT session_id FROM ledger_records WHERE tenant = ? ORDER BY session_id",
        [tenant, tenant],
    ).to_pylist()
    return [str(r["session_id"]) for r in rows]


@ledger_group.command("verify")
@click.argument("session_ids", nargs=-1)
@click.option("--all", "every", is_flag=True, help="Verify every session with a ledger.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@_options(blobs=True, writes=False)
@click.pass_context
def verify_command(
    ctx: click.Context,
    session_ids: tuple[str, ...],
    every: bool,
    as_json: bool,
    db: str,
    tenant: str,
    blobs_root: str | None,
) -> None:
    """Replay each SESSION_ID's ledger (or, with --all, every session's) and
    verify every record: its payload against its sha256, the gapless sequence
    up to the tip, fence epochs and each record's epoch, each blob pointer and
    blob (present, its sha256, its idempotency id, the size ceiling).

    Prints one line a session: "ok SESSION: N records, B bytes, K blobs (KB
    bytes)", or "DAMAGED SESSION: ErrorClass at seq N (blob KEY): message"
    (ReplayDecodeError, ReplayReadError, BlobIntegrityError,
    BlobPointerIDMismatchError, BlobUnavailableError,
    DurableBodyTooLargeError). Exits 1 if any ledger is damaged; 2 for a
    session without a ledger (EmptySessionError) or an unknown one.
    """
    if every == bool(session_ids):
        raise click.UsageError("name SESSION_IDs or pass --all (not both)")
    found: list[Verified] = []
    with open_db(db, read_only=True) as store:
        ids = ledger_sessions(store, tenant) if every else list(session_ids)
        total = sum(store.ledger.with_tenant(tenant).tip(s) for s in ids)
        with progress_bar("verify") as bar:
            task = bar.add_task("verify", total=total)
            done = 0
            for sid in ids:
                v = verify_session(
                    store,
                    tenant,
                    blobs_root,
                    sid,
                    partial(_advance, bar, task, done),
                )
                done += v.records
                bar.update(task, completed=done)
                found.append(v)
                if not as_json:
                    click.echo(describe_verified(v))
    if as_json:
        body = [{**asdict(v), "ok": v.ok} for v in found]
        click.echo(dumps({"verify": body, "verified": all(v.ok for v in found)}))
    if not all(v.ok for v in found):
        ctx.exit(EXIT_FAILED)


@ledger_group.command("gc")
@click.argument("session_id")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option(
    "--temp-grace",
    "temp_grace_s",
    type=click.FloatRange(min=0, max=MAX_TEMP_GRACE_S),
    default=DEFAULT_TEMP_GRACE_S,
    show_default=True,
    help="Seconds a put's temporary file must be old before it is reclaimed.",
)
@_options(blobs=True, writes=True)
def gc_command(
    session_id: str,
    as_json: bool,
    temp_grace_s: float,
    db: str,
    tenant: str,
    blobs_root: str | None,
    owner: str,
    ttl: float,
) -> None:
    """Reclaim SESSION_ID's blobs that no pointer record references
    (store.ledger.gc), as its single writer.

    Takes the lease session:SESSION_ID as --owner, opens the ledger's writer
    (its fence record), runs GC, releases the lease. Prints scanned,
    referenced, deleted (scanned = referenced + deleted) with each deleted
    key, the puts' temporary files older than --temp-grace seconds deleted
    (a put killed mid-write), and the unreclaimable keys' count (other keys
    under the session's prefix, left alone). A failed scan, listing or delete is
    GCScanError, GCListError or GCDeleteError (exit 2; nothing deleted
    before a scan or listing failure).
    """
    with open_db(db, existing=True) as store:
        ledger = _ledger(store, tenant, blobs_root)
        with _writer(store, ledger, session_id, owner, ttl) as writer:
            result = ledger.gc(session_id, writer.lease, temp_grace_s=temp_grace_s)
    if as_json:
        click.echo(dumps({"session_id": session_id, "gc": asdict(result)}))
        return
    click.echo(
        f"{session_id}: scanned {result.scanned}, referenced {result.referenced}, "
        f"deleted {result.deleted}, temporary files deleted {result.temps_deleted}, "
        f"unreclaimable {result.unreclaimable}"
    )
    for key in result.deleted_keys + result.temps_deleted_keys:
        click.echo(f"  deleted {key}")


def meta_json(meta: Any) -> dict[str, Any]:
    """A catalog entry's summary fields, as ``repair`` prints them."""
    return {
        "session_id": meta.session_id,
        "title": meta.title,
        "status": meta.status,
        "state": meta.state,
        "residency": meta.residency,
        "created_at": meta.created_at,
        "last_active_at": meta.last_active_at,
        "last_journal_seq": meta.last_journal_seq,
        "loop_count": meta.loop_count,
        "active_turn_id": meta.active_turn_id,
        "waiting_gate_id": meta.waiting_gate_id,
        "last_turn": meta.last_turn.summary if meta.last_turn is not None else None,
        "last_step": meta.last_step.summary if meta.last_step is not None else None,
        "loops": len(meta.loops),
        "hustle_buckets": len(meta.hustles),
    }


@ledger_group.command("repair")
@click.argument("session_id")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@_options(blobs=True, writes=False)
def repair_command(
    session_id: str, as_json: bool, db: str, tenant: str, blobs_root: str | None
) -> None:
    """Rebuild SESSION_ID's catalog entry from its whole ledger
    (store.ledger.catalog.repair) and print it: title, status, state,
    residency, created and last active times, last sequence folded, loops,
    active turn, open gate, last turn and step summaries.

    A damaged ledger fails closed (its replay's error, exit 2) and leaves the
    entry as it was; a ledger without session_started is EmptySessionError.
    """
    with open_db(db, existing=True) as store:
        meta = _ledger(store, tenant, blobs_root).catalog.repair(session_id)
    data = meta_json(meta)
    if as_json:
        click.echo(dumps({"repair": data}))
        return
    click.echo(f"rebuilt the catalog entry of {session_id} from its ledger:")
    for name, value in data.items():
        if name != "session_id":
            click.echo(f"  {name}: {'-' if value in (None, '') else value}")
