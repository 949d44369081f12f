"""Two processes opening a new PostgreSQL store migrate one after the other.

The migration takes an advisory lock first (``Database.lock_migrations``), so
a second opener waits for the first one's migration to commit, then finds
the schema current. Four processes opening at once (``test_postgres.py``)
seldom interleave that way (and a duplicate key between two uncommitted
migrations is retried as a lost race), so that test passes without the lock
too. Here two openers are interleaved on
purpose: the first migrates everything and holds its transaction open until
the second is either waiting for a lock (the advisory lock: what must
happen) or has read the schema's tables (no lock: it sees none); the second
then goes on only once the first committed, so without the lock its
``CREATE TABLE schema_migrations`` meets the committed table
(``DuplicateTable``) and its open fails. The kill test patches the lock to
nothing and sees exactly that.

Hooks (test-only): ``BaseStore._migrate`` (the migration's body) and
``Database.tables`` (the schema read it starts with).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest
from conftest import new_pg_schema, pg_url

import turnkeeper
from turnkeeper.storage.postgres import db as pg_db
from turnkeeper.storage.store import BaseStore

pytestmark = pytest.mark.postgres

HANG_S = 120.0
"""A guard against a hang only: every wait below ends on an event."""


class Race:
    """The interleaving of the two openers (threads ``first`` and ``second``)."""

    def __init__(self) -> None:
        self.first_migrated = threading.Event()
        self.first_committed = threading.Event()
        self.second_pid: int | None = None
        self.second_has_pid = threading.Event()
        self.second_read_tables = threading.Event()
        self.released_by = ""

    def wait_for_the_second(self) -> None:
        """(In the first opener's open transaction.) Until the second opener
        waits for a lock or has read the tables; which one, in ``released_by``."""
        assert self.second_has_pid.wait(HANG_S), "the second opener never began its migration"
        give_up = time.monotonic() + HANG_S
        with psycopg.connect(pg_url(), autocommit=True) as watcher:
            while time.monotonic() < give_up:
                if self.second_read_tables.is_set():
                    self.released_by = "the second read the tables"
                    return
                row = watcher.execute(
                    "SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s",
                    [self.second_pid],
                ).fetchone()
                if row is not None and row[0] == "Lock":
                    self.released_by = "the second waited for a lock"
                    return
                time.sleep(0.005)
        raise AssertionError("the second opener neither waited for a lock nor read the tables")


@contextmanager
def interleaved(mp: pytest.MonkeyPatch) -> Iterator[Race]:
    race = Race()
    migrate, tables = BaseStore._migrate, pg_db.Database.tables

    def hooked_migrate(self: BaseStore, tx: Any) -> None:
        role = threading.current_thread().name
        if role == "second":
            race.second_pid = tx.one("SELECT pg_backend_pid()")[0]
            race.second_has_pid.set()
        migrate(self, tx)
        if role == "first":
            race.first_migrated.set()
            race.wait_for_the_second()

    def hooked_tables(self: pg_db.Database, tx: Any) -> set[str]:
        found = tables(self, tx)
        if threading.current_thread().name == "second" and not race.second_read_tables.is_set():
            race.second_read_tables.set()
            assert race.first_committed.wait(HANG_S), "the first opener never committed"
        return found

    mp.setattr(BaseStore, "_migrate", hooked_migrate)
    mp.setattr(pg_db.Database, "tables", hooked_tables)
    yield race


def race_two_openers(url: str, mp: pytest.MonkeyPatch) -> tuple[str, list[Any]]:
    """Open ``url`` twice, interleaved as the module docstring says; how the
    first opener was let go, and each opener's schema version (or error)."""
    outcomes: list[Any] = [None, None]

    def open_(i: int, race: Race) -> None:
        try:
            with turnkeeper.open_store(url) as store:
                if i == 0:
                    race.first_committed.set()
                outcomes[i] = store.schema_version()
        except Exception as exc:
            outcomes[i] = exc
        finally:
            race.first_committed.set()  # (the first failed: never leave the second waiting)

    with interleaved(mp) as race:
        first = threading.Thread(target=open_, args=(0, race), name="first")
        second = threading.Thread(target=open_, args=(1, race), name="second")
        first.start()
        assert race.first_migrated.wait(HANG_S), f"the first opener never migrated: {outcomes}"
        second.start()
        for t in (first, second):
            t.join(HANG_S)
            assert not t.is_alive(), f"an opener hung: {outcomes}"
    return race.released_by, outcomes


def check_a_second_opener_waits_for_the_first_migration(url: str, mp: pytest.MonkeyPatch) -> None:
    released_by, outcomes = race_two_openers(url, mp)
    current = turnkeeper.SCHEMA_VERSION
    assert outcomes == [current, current], f"an opener failed: {outcomes!r}"
    assert released_by == "the second waited for a lock", released_by
    with turnkeeper.open_store(url) as store:
        rows = store.query("SELECT version FROM schema_migrations ORDER BY version").to_pylist()
        assert [r["version"] for r in rows] == list(range(1, current + 1))


def test_a_second_opener_waits_for_the_first_openers_migration(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    check_a_second_opener_waits_for_the_first_migration(new_pg_schema(), monkeypatch)


def test_without_the_migration_lock_the_second_opener_fails_on_the_first_ones_tables(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(pg_db.Database, "lock_migrations", lambda self, tx: None)
    url = new_pg_schema()
    with pytest.raises(AssertionError, match="an opener failed") as failed:
        check_a_second_opener_waits_for_the_first_migration(url, monkeypatch)
    # the second opener fails on the first one's objects: creating them again
    # ("already exists"), or finding them (its committed tables' names) as foreign
    text = str(failed.value)
    assert ("ProgrammingError" in text and "already exists" in text) or (
        "ForeignDatabaseError" in text
    ), text
