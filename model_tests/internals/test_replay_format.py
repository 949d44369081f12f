"""Replay snapshots, format 3 (issue 21, the cold replay's decode): a part's
entry ids are stored as one string joined by newlines unless one holds a
newline (then they stay an array), and read back as written either way; a
part of format 2 (its ids an array) is not served (``test_replay_snapshots``).

Control: joining ids that hold a newline makes the round trip fail."""

from __future__ import annotations

from typing import Any

import ormsgpack
import pytest
import zstandard

from turnkeeper.spec.records import Replay
from turnkeeper.storage.ops import replay_snapshots


def _replay(ids: list[str]) -> Any:
    return Replay(tuple({"role": "user", "content": i} for i in ids), tuple(ids))


def _stored_ids(replay: Any) -> list[Any]:
    """The entry ids of each part ``_bodies`` makes of ``replay``, as stored."""
    return [ormsgpack.unpackb(zstandard.decompress(b))[0] for b in replay_snapshots._bodies(replay)]


@pytest.mark.parametrize(
    "ids",
    [["a", "b", "c"], ["only"], [], ["a\nb", "c"], ["x", "y\n"], ["", "z"]],
    ids=["plain", "one", "none", "a newline inside", "a newline at the end", "an empty id"],
)
def test_a_part_keeps_its_ids_whatever_they_hold(ids: list[str]) -> None:
    """Format 3 joins a part's ids into one string with newlines, unless one
    holds a newline (they stay an array); either way they read back as written
    (an empty replay is an empty array)."""
    stored_ids = _stored_ids(_replay(ids))
    assert stored_ids == ["\n".join(ids) if ids and not any("\n" in i for i in ids) else ids]
    (body,) = replay_snapshots._bodies(_replay(ids))
    assert replay_snapshots._unpacked(body) == (ids, [{"role": "user", "content": i} for i in ids])


def test_control_ids_joined_whatever_they_hold_come_back_wrong(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The newline check patched out (every part's ids joined): an id holding a
    newline splits in two, and the part no longer reads back (more ids than
    messages: damage, the replay would read the rows every time)."""
    real_packb = replay_snapshots.ormsgpack.packb

    def joined_always(value: Any) -> bytes:
        ids, messages = value
        return real_packb(["\n".join(ids) if not isinstance(ids, str) else ids, messages])

    monkeypatch.setattr(replay_snapshots.ormsgpack, "packb", joined_always)
    ids = ["a\nb", "c"]
    (body,) = replay_snapshots._bodies(_replay(ids))
    with pytest.raises(AssertionError):
        assert replay_snapshots._unpacked(body) == (ids, list(_replay(ids).messages))
