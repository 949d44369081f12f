"""The usage a pi session file's assistant messages carry, computed from the
file's JSON here, independently of turnkeeper's reader (its own splitting of
glued lines, its own reading of each figure), for the import and report tests.

A figure is what the file says when it is a whole number from 0 to 10**12
(tokens) or a finite number from 0 to 10**9 (cost, US dollars), else unknown
(``None``): the rule the README states for odd figures.
"""

from __future__ import annotations

import json
import math
import re
from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

TOKEN_KEYS = ("input", "output", "cacheRead", "cacheWrite", "totalTokens")


@dataclass(frozen=True)
class Expected:
    """One assistant message's usage: where it is and what it says."""

    entry_id: str | None  # None for a version 1 file (ids are derived)
    provider: str
    protocol: str
    model: str
    tokens: tuple[int | None, ...]  # input, output, cache read, cache write, total
    cost: float | None
    at: datetime


def _count(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if isinstance(value, float) and (not math.isfinite(value) or value != int(value)):
        return None
    return int(value) if 0 <= value <= 10**12 else None


def _cost(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) and 0 <= value <= 10**9 else None


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def records(text: str) -> list[dict[str, Any]]:
    """Every JSON object record of a pi file's text, glued lines split apart."""
    out: list[dict[str, Any]] = []
    for line in text.split("\n"):
        if not line.strip():
            continue
        try:
            parts = [json.loads(line)]
        except json.JSONDecodeError:
            parts = [json.loads(p) for p in re.split(r'(?<=\})(?=\{"type":)', line)]
        out.extend(p for p in parts if isinstance(p, dict))
    return out


def expected_usage(text: str) -> list[Expected]:
    """The usage of every assistant message of a pi file's text, in file order."""
    recs = records(text)
    v1 = "version" not in recs[0]
    out: list[Expected] = []
    for rec in recs[1:]:
        msg = rec.get("message")
        if rec.get("type") != "message" or not isinstance(msg, dict):
            continue
        usage = msg.get("usage")
        if msg.get("role") != "assistant" or not isinstance(usage, dict):
            continue
        if not any(k in usage for k in (*TOKEN_KEYS, "cost")):
            continue
        cost = usage.get("cost")
        at = datetime.fromisoformat(rec["timestamp"]).astimezone(UTC)
        out.append(
            Expected(
                None if v1 else rec["id"],
                _text(msg.get("provider")),
                _text(msg.get("api")),
                _text(msg.get("model")),
                tuple(_count(usage.get(k)) for k in TOKEN_KEYS),
                _cost(cost.get("total")) if isinstance(cost, dict) else None,
                at,
            )
        )
    return out


def expected_file(path: Path) -> list[Expected]:
    return expected_usage(path.read_text(encoding="utf-8"))


def sums(found: list[Expected], key: Any) -> dict[Any, tuple[int, ...]]:
    """Per ``key(e)``: (records, input, output, cache read, cache write, total)
    token sums, unknown figures counting 0."""
    out: dict[Any, list[int]] = defaultdict(lambda: [0] * 6)
    for e in found:
        row = out[key(e)]
        row[0] += 1
        for i, v in enumerate(e.tokens, start=1):
            row[i] += v or 0
    return {k: tuple(v) for k, v in out.items()}


def cost_sums(found: list[Expected], key: Any) -> dict[Any, float]:
    """Per ``key(e)``: the summed known cost (US dollars)."""
    out: dict[Any, float] = defaultdict(float)
    for e in found:
        out[key(e)] += e.cost or 0.0
    return dict(out)
