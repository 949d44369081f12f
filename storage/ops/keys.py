"""``store.keys``: the store's master key, rotated (issue 23, "rotation"),
and the pages an in-place encryption left reclaimed.

Master-key rotation rewraps each session's data key (``session_keys``
rows whose ``key_id`` is not the provider's current one) and the marker's
check value under the provider's current master key; the payloads are not
touched. It runs in batches of :data:`BATCH_ROWS` rows: each batch is read,
unwrapped with the master key that wrapped it and wrapped with the current
one outside any transaction (a KMS call never holds locks), then written
in one transaction fenced by the caller's lease, each row by a
compare-and-set on the ``key_id`` and wrapped bytes it was read with (a row
a session's delete or data-key rotation changed meanwhile is left alone:
it is gone or already current). Rows already current are never read again,
so a rotation stopped anywhere (a crash, a lost lease, ``limit``) is
finished by the next run.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial

from turnkeeper.spec import errors
from turnkeeper.spec.records import KeyRotationReport, Lease

from ..backend import Tx
from ..crypto.columns import SEALED
from ..crypto.keyring import CHECK_CONTEXT, CHECK_PLAIN
from ..crypto.keys import KeyProvider
from ..crypto.seal import wrap_context
from ..validate import check_int, check_lease
from . import leases
from .base import Area

BATCH_ROWS = 500
"""Data keys one rotation transaction rewraps at most."""

ROTATION_TARGET = "keys:rotation"
"""The lease target ``turnkeeper keys rotate`` takes (one rotation at a time)."""

_STALE = (
    "SELECT session_id, version, key_id, wrapped FROM session_keys WHERE key_id <> ? "
    "AND (session_id > ? OR (session_id = ? AND version > ?)) "
    "ORDER BY session_id, version LIMIT ?"
)
_COUNT = (
    "SELECT count(*) FILTER (WHERE key_id = ?), count(*) FILTER (WHERE key_id <> ?) "
    "FROM session_keys"
)
_CHECK = "SELECT check_key_id, check_wrapped FROM store_encryption WHERE id = 1"

Row = tuple[str, int, str, bytes]
"""A ``session_keys`` row as rotation reads it: session id, version, key id, wrapped."""


def rewrap_batch(tx: Tx, lease: Lease, key_id: str, rows: Sequence[tuple[Row, bytes]]) -> int:
    """Fence ``lease`` and write each row's new wrapped key (by ``key_id``)
    where the row still holds the key id and bytes it was read with; returns
    how many rows were rewrapped.

    Raises:
        LeaseLostError: ``lease`` is not the held, unexpired one.
    """
    leases.fence(tx, lease)
    if not rows:
        return 0
    d = tx.dialect
    return tx.count(
        "UPDATE session_keys SET key_id = ?, wrapped = v.new FROM (SELECT "
        f"unnest({d.typed('VARCHAR[]')}) AS sid, unnest({d.typed('BIGINT[]')}) AS ver, "
        f"unnest({d.typed('VARCHAR[]')}) AS old_id, unnest({d.typed('BYTEA[]')}) AS old, "
        f"unnest({d.typed('BYTEA[]')}) AS new) AS v "
        "WHERE session_keys.session_id = v.sid AND session_keys.version = v.ver "
        "AND session_keys.key_id = v.old_id AND session_keys.wrapped = v.old",
        [
            key_id,
            [r[0] for r, _ in rows],
            [r[1] for r, _ in rows],
            [r[2] for r, _ in rows],
            [r[3] for r, _ in rows],
            [new for _, new in rows],
        ],
    )


def rewrap_check(tx: Tx, lease: Lease, read: tuple[str, bytes], key_id: str, new: bytes) -> bool:
    """Fence ``lease`` and write the marker's new check value where it still
    holds the one ``read``; whether it was written."""
    leases.fence(tx, lease)
    return (
        tx.count(
            "UPDATE store_encryption SET check_key_id = ?, check_wrapped = ? "
            "WHERE id = 1 AND check_key_id = ? AND check_wrapped = ?",
            [key_id, new, read[0], read[1]],
        )
        == 1
    )


class Keys(Area):
    """``store.keys``: master-key rotation and page reclaiming (see the module docstring)."""

    def rotate(
        self, lease: Lease, *, limit: int | None = None, batch_rows: int = BATCH_ROWS
    ) -> KeyRotationReport:
        """Rewrap every session's data key, and the store's check value, under
        the key provider's current master key (``provider.key_id``) without
        touching the payloads (issue 23, "rotation"; ``turnkeeper keys
        rotate``), under ``lease`` (any target; the CLI takes
        :data:`ROTATION_TARGET`), in batches of ``batch_rows`` data keys,
        each one transaction fenced by ``lease``. The provider must hold the
        master keys that wrapped them (``LocalKeyProvider``: the current key
        first, the old ones after). ``limit``: rewrap at most this many data
        keys in this call (``None``: all); the report says how many remain.
        Resumable: a rotation stopped anywhere is finished by another run
        (rows already current are skipped). Once ``remaining`` is 0 the old
        master keys can be retired (dropped from the provider).

        Returns:
            :class:`~turnkeeper.KeyRotationReport`: ``rewrapped`` (data
            keys), ``already_current`` (data keys current before this call),
            ``remaining`` (data keys not current after it), ``check_rewrapped``.

        Raises:
            KeyUnavailableError: the store object was opened without
                ``encryption=`` (``session_id`` ``""``, ``key_id`` ``None``);
                the provider cannot unwrap a data key (its session and
                ``key_id`` named, the provider's ``KeyUnwrapError`` as
                ``__cause__``) or the check value (``session_id`` ``""``).
                Batches written before stay written.
            LeaseLostError: ``lease`` was lost (at the start or between
                batches); batches written before stay written.
            InvalidInputError: a bad lease, ``limit`` or ``batch_rows``.
        """
        check_lease(lease)
        if limit is not None:
            check_int(limit, "limit", 0)
        check_int(batch_rows, "batch_rows", 1)
        provider = self.db.keyring.provider
        if provider is None:
            raise errors.KeyUnavailableError(
                "", None, detail="rotating the master key needs the store opened with encryption="
            )
        current = provider.key_id
        self._fenced("validate_rotation_lease", lease, lambda tx: leases.fence(tx, lease))
        counted = self.db.read("count_data_keys", lambda tx: tx.one(_COUNT, [current, current]))
        already = 0 if counted is None else int(counted[0])
        check = self._rotate_check(lease, provider)
        rewrapped = 0
        after: tuple[str, int] = ("", 0)
        while limit is None or rewrapped < limit:
            size = batch_rows if limit is None else min(batch_rows, limit - rewrapped)
            rows = self._stale(current, after, size)
            if not rows:
                break
            pairs = [(row, _rewrap(provider, row)) for row in rows]
            rewrapped += self._write_batch(lease, current, pairs)
            after = (rows[-1][0], rows[-1][1])
        left = self.db.read("count_data_keys", lambda tx: tx.one(_COUNT, [current, current]))
        remaining = 0 if left is None else int(left[1])
        return KeyRotationReport(rewrapped, already, remaining, check)

    def reclaim(self) -> list[str]:
        """Give back the pages that held values before they were sealed
        (after ``sessions.encrypt`` / ``turnkeeper encrypt``) where the engine
        can: DuckDB ``CHECKPOINT`` (its freed blocks are reused, not wiped:
        the file can keep old bytes until then); PostgreSQL ``VACUUM`` of
        each table holding a sealed column, ``replay_snapshots`` and
        ``session_keys`` (dead row versions freed for reuse, not wiped).
        Returns the statements run, in order. The README's "Encryption at
        rest" says what copies may remain and how to leave none.

        Raises:
            DatabaseError: the engine refused (a read-only store: ``ReadOnlyError``).
        """
        if self.db.dialect.name == "duckdb":
            done = ["CHECKPOINT"]
        else:  # (each table named with the store's schema: behind a pooler, VACUUM is unpinned)
            schema = self.db.read("store_schema", lambda tx: tx.one("SELECT current_schema()"))
            at = "" if schema is None or schema[0] is None else _quoted(str(schema[0])) + "."
            tables = dict.fromkeys([c.table for c in SEALED] + ["replay_snapshots", "session_keys"])
            done = [f"VACUUM {at}{t}" for t in tables]
        for sql in done:
            self.db.write("reclaim_pages", partial(_run, sql=sql), transaction=False)
        return done

    # -- steps (a test stops a rotation between them) ------------------------------

    def _rotate_check(self, lease: Lease, provider: KeyProvider) -> bool:
        rows = self.db.read("read_check_value", lambda tx: tx.rows(_CHECK, binary=True))
        found = rows[0] if rows else None
        if found is None or found[1] is None or found[0] == provider.key_id:
            return False
        read = (str(found[0]), bytes(found[1]))
        try:
            plain = provider.unwrap(read[1], read[0], CHECK_CONTEXT)
        except errors.KeyUnwrapError as exc:
            raise errors.KeyUnavailableError(
                "", read[0], detail=f"cannot unwrap the store's check value: {exc}"
            ) from exc
        if plain != CHECK_PLAIN:
            raise errors.KeyUnavailableError(
                "", read[0], detail="the key provider's unwrap of the check value gave other bytes"
            )
        new = provider.wrap(CHECK_PLAIN, CHECK_CONTEXT)
        return self._fenced(
            "rotate_check_value",
            lease,
            lambda tx: rewrap_check(tx, lease, read, provider.key_id, new),
        )

    def _stale(self, current: str, after: tuple[str, int], size: int) -> list[Row]:
        rows = self.db.read(
            "read_stale_data_keys",
            lambda tx: tx.rows(_STALE, [current, after[0], after[0], after[1], size], binary=True),
        )
        return [(str(r[0]), int(r[1]), str(r[2]), bytes(r[3])) for r in rows]

    def _write_batch(self, lease: Lease, current: str, pairs: list[tuple[Row, bytes]]) -> int:
        return self._fenced(
            "rotate_data_keys", lease, lambda tx: rewrap_batch(tx, lease, current, pairs)
        )


def _quoted(name: str) -> str:
    """``name`` as an SQL identifier (double quotes, a quote doubled)."""
    return '"' + name.replace('"', '""') + '"'


def _run(tx: Tx, *, sql: str) -> None:
    tx.exec(sql)


def _rewrap(provider: KeyProvider, row: Row) -> bytes:
    """``row``'s data key unwrapped with the master key that wrapped it and
    wrapped with the current one.

    Raises:
        KeyUnavailableError: the provider cannot unwrap it.
    """
    session_id, version, key_id, wrapped = row
    context = wrap_context(session_id, version)
    try:
        plain = provider.unwrap(wrapped, key_id, context)
    except errors.KeyUnwrapError as exc:
        raise errors.KeyUnavailableError(session_id, key_id, detail=str(exc)) from exc
    return provider.wrap(plain, context)
