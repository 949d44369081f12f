"""A full disk under a DuckDB store, for real: ENOSPC from a small tmpfs
(``small_disk.py``). A checkpoint that meets it invalidates the database
(DuckDB refuses every call until the file is opened again); the store reopens
the file by itself, acknowledges a commit DuckDB made durable before its
checkpoint failed, says ``DiskFullError`` or ``StoreInvalidatedError`` (never a
bare ``DatabaseError``), and loses nothing it acknowledged."""

from __future__ import annotations

from pathlib import Path

import pytest
from small_disk import run

TYPED = {"DiskFullError", "StoreInvalidatedError"}


@pytest.mark.slow
def test_a_full_disk_at_a_checkpoint_loses_nothing_and_the_store_goes_on(tmp_path: Path) -> None:
    seen = run("full_disk", tmp_path / "disk", 40)
    report = {k: v for k, v in seen.items() if k != "refused"}
    # the write whose commit ran the checkpoint: not committed, and it says why
    assert seen["crossing"].get("error") == "DiskFullError", report
    assert "not committed" in seen["crossing"]["message"], seen["crossing"]
    # every call after it goes on, on both store objects sharing the file
    for read in ("other_read", "store_read", "read_after_group", "full_read", "query"):
        assert "ok" in seen[read], (read, seen[read])
    # a group commit DuckDB reports durable although the checkpoint after it
    # failed: each caller is acknowledged (not told it failed, nor run twice)
    assert all(g.get("ok") == "Entry" for g in seen["group"]), seen["group"]
    # a write refused for space is typed, and absent
    assert seen["full"].get("error") == "DiskFullError", seen["full"]
    # renewals (each a transaction) until one fails: the ones whose COMMIT
    # DuckDB reported durable as the checkpoint after it failed were
    # acknowledged; the one that failed is typed and says whether it
    # committed, and what is stored is exactly the committed ones
    assert "ok" in seen["acquire"], seen["acquire"]
    renew = seen["renew"]
    assert renew.get("error") in TYPED, renew
    committed = "this write committed and is durable" in renew["message"]
    assert committed or "not committed" in renew["message"], renew
    assert seen["renewals"] == seen["renewals_tried"] - (0 if committed else 1), report
    last = seen["renewed_expiry"] if committed else seen["previous_expiry"]
    assert seen["expires_at"] == last, report
    assert "ok" in seen["validate"], seen["validate"]
    # space again: writes go on, and close checkpoints cleanly
    assert "ok" in seen["after_free"], seen["after_free"]
    assert seen["close"] == {"ok": "NoneType", "id": None}, seen["close"]
    assert seen["close_other"] == {"ok": "NoneType", "id": None}, seen["close_other"]
    assert seen["wal_left"] == 0
    assert seen["generation"] >= 2  # it reopened the file by itself
    # a later open: every acknowledged write once, no refused one
    assert seen["missing"] == [] and seen["twice"] == 0, report
    assert seen["refused_kept"] == [], report
    assert seen["acked"] > 200
    errors = [v["error"] for v in seen.values() if isinstance(v, dict) and "error" in v] + [
        g["error"] for g in seen["group"] if "error" in g
    ]
    assert set(errors) <= TYPED, errors
