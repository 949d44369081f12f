"""A damaged DuckDB write-ahead log: refused when the store opens, also where
DuckDB would drop transactions without a word, and ``turnkeeper repair``
keeps every transaction that ends before the damage, with the original
files copied beside the repaired ones and never changed.

The log is written by a real process that stops without closing (the writes
are in the ``.wal`` only); it prints each acknowledged entry with the log's
size after its commit, so the writes before a damage are known exactly.
Frames are found here by their own rule (an 8-byte length, an 8-byte
checksum, a payload starting with field 100), independently of the code
under test.
"""

from __future__ import annotations

import json
import struct
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import duckdb
import pytest
from click.testing import CliRunner, Result

import turnkeeper
from turnkeeper.cli.main import cli
from turnkeeper.spec import errors
from turnkeeper.storage.duck import repair as repair_module

CHILD = textwrap.dedent("""
    import json, os, sys, turnkeeper
    path = sys.argv[1]
    turnkeeper.open_store(path).close()  # the schema, checkpointed into the file
    store = turnkeeper.open_store(path)
    store.sessions.create("w")
    acked = []
    for i in range(30):
        text = f"m{i} " * (1 + 40 * (i % 4))
        message = {"message": {"role": "user", "content": text}}
        entry = store.sessions.append("w", "message", message)
        acked.append([entry.id, os.path.getsize(path + ".wal")])
    print(json.dumps(acked), flush=True)
    os._exit(0)  # no close, no checkpoint: the writes are in the .wal only
""")


class Crashed:
    """A database file and its log as a process left them, and what it acknowledged."""

    def __init__(self, folder: Path) -> None:
        path = folder / "crashed.duckdb"
        done = subprocess.run(
            [sys.executable, "-c", CHILD, str(path)], capture_output=True, text=True, timeout=300
        )
        assert done.returncode == 0, done.stderr
        self.acked: list[tuple[str, int]] = [(i, n) for i, n in json.loads(done.stdout)]
        self.db = path.read_bytes()
        self.wal = Path(f"{path}.wal").read_bytes()
        self.frames = frames(self.wal)

    def place(self, folder: Path, wal: bytes) -> Path:
        """The database file and ``wal`` as its log, in ``folder``."""
        path = folder / "store.duckdb"
        path.write_bytes(self.db)
        Path(f"{path}.wal").write_bytes(wal)
        return path

    def before(self, offset: int) -> list[str]:
        """The acknowledged entries whose commit ended at or before ``offset``."""
        return [i for i, end in self.acked if end <= offset]


def frames(wal: bytes) -> list[int]:
    """The offsets of the log's frames: the chain of lengths, from the header's
    end, that ends exactly at the end of the file with every payload starting
    with field 100 (``64 00``)."""
    for start in range(8, 200):
        at, found = start, []
        while at + 16 <= len(wal):
            (length,) = struct.unpack_from("<Q", wal, at)
            if wal[at + 16 : at + 18] != b"\x64\x00" or at + 16 + length > len(wal):
                break
            found.append(at)
            at += 16 + length
        if at == len(wal) and len(found) > 20:
            return found
    raise AssertionError("no chain of frames in the log")


@pytest.fixture(scope="module")
def crashed(tmp_path_factory: pytest.TempPathFactory) -> Crashed:
    return Crashed(tmp_path_factory.mktemp("crashed"))


def run(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def refused(result: Result) -> str:
    assert result.exit_code == 2, (result.exit_code, result.output)
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr, result.stderr
    return result.stderr


def flip(at: Callable[[Crashed], int], bit: int = 0x01) -> Callable[[Crashed], tuple[bytes, int]]:
    """A damage: one bit flipped at ``at(crashed)``; the log and the damaged
    entry's start (the frame holding that byte; 0 in the header)."""

    def damage(c: Crashed) -> tuple[bytes, int]:
        where = at(c)
        data = bytearray(c.wal)
        data[where] ^= bit
        start = max((f for f in c.frames if f <= where), default=0)
        return bytes(data), start

    return damage


def nth(fraction: float) -> Callable[[Crashed], int]:
    return lambda c: c.frames[int(len(c.frames) * fraction)]


DAMAGES = {
    # a payload byte, a checksum byte, the last byte: DuckDB refuses the log by itself
    "payload-early": flip(lambda c: nth(0.1)(c) + 18),
    "payload-middle": flip(lambda c: nth(0.5)(c) + 20, 0x80),
    "checksum-late": flip(lambda c: nth(0.9)(c) + 9),
    "length-low-bit": flip(lambda c: nth(0.6)(c)),
    "last-byte": flip(lambda c: len(c.wal) - 1),
    # a high byte of a length, or the header: DuckDB took it for a torn write and
    # dropped every later transaction without a word
    "length-high-early": flip(lambda c: nth(0.2)(c) + 5),
    "length-high-late": flip(lambda c: nth(0.8)(c) + 6, 0x10),
    "header-first-byte": flip(lambda c: 0),
    "header-type": flip(lambda c: 2),
}


@pytest.mark.parametrize("name", DAMAGES)
def test_a_damaged_log_is_refused_and_repair_keeps_every_write_before_the_damage(
    crashed: Crashed, tmp_path: Path, name: str
) -> None:
    wal, start = DAMAGES[name](crashed)
    path = crashed.place(tmp_path, wal)
    kept = crashed.before(start)
    assert len(crashed.acked) - len(kept) > 0  # the damage is before some acknowledged write
    for read_only in (False, True):
        with pytest.raises(errors.CorruptDatabaseError) as err:
            turnkeeper.open_store(str(path), read_only=read_only)
        assert err.value.file == f"{path}.wal" and err.value.offset == start, err.value
        assert f"turnkeeper repair --db {path}" in str(err.value)
    assert Path(f"{path}.wal").read_bytes() == wal and path.read_bytes() == crashed.db

    result = run("repair", "--db", str(path), "--json")
    assert result.exit_code == 0, result.output
    done = json.loads(result.stdout)["repair"]
    assert done["damage_at"] == start and done["wal_size"] == len(wal)
    ends = [end for _, end in crashed.acked if end <= start]
    assert done["kept_bytes"] <= start and (not ends or done["kept_bytes"] == max(ends))
    assert done["dropped_bytes"] == len(wal) - done["kept_bytes"]
    assert done["later_transactions"] >= len(crashed.acked) - len(kept) - 1
    db_copy, wal_copy = (Path(p) for p in done["copies"])
    assert db_copy.read_bytes() == crashed.db and wal_copy.read_bytes() == wal  # untouched
    assert done["rows"]["entries"] == [0, len(kept)]

    with turnkeeper.open_store(str(path)) as store:  # every write before the damage, no other
        session = store.sessions.get("w")
        assert ([e.id for e in store.sessions.entries("w")] if session else []) == kept
        assert store.schema_version() == turnkeeper.SCHEMA_VERSION
    line = refused(run("repair", "--db", str(path)))  # nothing left to repair
    assert "nothing to repair" in line
    assert db_copy.read_bytes() == crashed.db and wal_copy.read_bytes() == wal


def test_the_repair_report_says_what_it_kept_and_dropped(crashed: Crashed, tmp_path: Path) -> None:
    wal, start = DAMAGES["length-high-early"](crashed)
    path = crashed.place(tmp_path, wal)
    result = run("repair", "--db", str(path))
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].startswith(f"repaired {path}: its write-ahead log ({len(wal)} bytes)")
    assert f"at byte {start} (an entry's length runs past the end of the file)" in lines[0]
    assert lines[1].startswith("kept: ") and lines[2].startswith("dropped: ")
    assert "the damaged transaction and every later one" in lines[2]
    assert lines[3].startswith("originals kept: ") and ".before-repair-" in lines[3]
    entries = [line for line in lines if line.strip().startswith("entries:")]
    assert entries == [f"  entries: 0 -> {len(crashed.before(start))}"]


@pytest.mark.parametrize("cut", [0.0, 0.001, 0.1, 0.33, 0.5, 0.77, 0.999])
def test_a_log_torn_at_its_end_opens_with_every_whole_transaction_and_needs_no_repair(
    crashed: Crashed, tmp_path: Path, cut: float
) -> None:
    at = max(1, int(len(crashed.wal) * cut))
    for end in {at, *(f for f in crashed.frames if at - 40 < f <= at)}:  # mid-entry, and at one
        folder = tmp_path / str(end)
        folder.mkdir()
        path = crashed.place(folder, crashed.wal[:end])
        line = refused(run("repair", "--db", str(path)))
        assert "nothing to repair" in line
        assert sorted(p.name for p in folder.iterdir()) == ["store.duckdb", "store.duckdb.wal"]
        with turnkeeper.open_store(str(path), read_only=True) as store:
            session = store.sessions.get("w")
            got = [e.id for e in store.sessions.entries("w")] if session else []
        assert got == crashed.before(end)


HOLD = textwrap.dedent("""
    import sys, turnkeeper
    store = turnkeeper.open_store(sys.argv[1])
    print("open", flush=True)
    sys.stdin.readline()
    store.close()
""")


def test_a_file_held_open_is_never_repaired_nor_taken_for_damaged(
    crashed: Crashed, tmp_path: Path
) -> None:
    path = tmp_path / "held.duckdb"
    with turnkeeper.open_store(str(path)) as store:
        store.sessions.create("w")
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "open\n"
        # its log, as this process reads it while the holder writes, looks damaged
        Path(f"{path}.wal").write_bytes(DAMAGES["length-high-early"](crashed)[0])
        before = sorted(p.name for p in tmp_path.iterdir())
        line = refused(run("repair", "--db", str(path)))
        assert "StoreLockedError" in line and "another process" in line
        with pytest.raises(errors.StoreLockedError):  # held: never reported as corrupt
            turnkeeper.open_store(str(path))
        assert sorted(p.name for p in tmp_path.iterdir()) == before  # no copies, no change
    finally:
        assert holder.stdin is not None
        holder.stdin.write("\n")
        holder.stdin.close()
        holder.wait(120)


def test_repair_refuses_what_it_cannot_repair(crashed: Crashed, tmp_path: Path) -> None:
    path = crashed.place(tmp_path, crashed.wal)  # an intact log
    line = refused(run("repair", "--db", str(path)))
    assert "InvalidInputError" in line and "is intact" in line
    with turnkeeper.open_store(str(path)) as store:
        assert len(store.sessions.entries("w")) == len(crashed.acked)
        line = refused(run("repair", "--db", str(path)))  # this process has it open
        assert "StoreLockedError" in line and "this process" in line
    assert "no write-ahead log" in refused(run("repair", "--db", str(path)))  # checkpointed
    assert "StoreNotFoundError" in refused(run("repair", "--db", str(tmp_path / "no.duckdb")))
    text = tmp_path / "notes.txt"
    text.write_text("not a database, not at all")
    assert "ForeignDatabaseError" in refused(run("repair", "--db", str(text)))
    assert "DuckDB file" in refused(run("repair", "--db", "postgresql://u@h/db"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt", "store.duckdb"]


def test_a_repair_whose_replay_fails_puts_the_original_log_back(
    crashed: Crashed, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    wal, start = DAMAGES["payload-middle"](crashed)
    path = crashed.place(tmp_path, wal)

    def refuses(where: str) -> Any:
        raise duckdb.IOException("Could not write file: No space left on device")

    monkeypatch.setattr(repair_module, "_replay", refuses)
    with pytest.raises(errors.CorruptDatabaseError) as err:
        repair_module.repair(str(path))
    assert err.value.offset == start and "original log is back" in str(err.value)
    assert Path(f"{path}.wal").read_bytes() == wal and path.read_bytes() == crashed.db
    copies = sorted(p.name for p in tmp_path.iterdir() if ".before-repair-" in p.name)
    assert len(copies) == 2  # the copies stay
    monkeypatch.undo()
    done = repair_module.repair(str(path))  # and it can be run again
    assert done.damage_at == start
