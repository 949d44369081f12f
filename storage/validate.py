"""Argument checks shared by every backend: bad input is refused before any I/O.

Each check raises ``InvalidInputError`` naming the field; nothing is written
when one fails.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

from turnkeeper.spec import LeasePurpose, errors
from turnkeeper.spec.delivery import DeliveryPlan, DeliveryStep
from turnkeeper.spec.lease import session_target
from turnkeeper.spec.records import ANY_LEAF, FinalizeRequest, Lease

from .codec import MAX_TARGET_BYTES, check_id, check_text, to_json

MAX_TTL_S = 10 * 365 * 86400.0
"""The longest lease (or delay) accepted, in seconds (ten years)."""

MAX_INT = 2**63 - 1
"""The largest sequence number, epoch or cursor accepted (a BIGINT)."""

MAX_LIMIT = 1_000_000
"""The largest page size accepted."""


def check_bool(value: object, field: str) -> bool:
    """``value`` if it is a real ``bool`` (``"no"`` or ``1`` are refused)."""
    if not isinstance(value, bool):
        raise errors.InvalidInputError(field, f"expected True or False, got {value!r}")
    return value


def check_ttl(ttl_s: object) -> float:
    """A lease duration in seconds: a finite number in (0, ten years]."""
    return check_seconds(ttl_s, "ttl_s", allow_zero=False)


def check_seconds(value: object, field: str, *, allow_zero: bool = True) -> float:
    """A duration in seconds: a finite number in [0, ten years] (``(0, …]`` when
    ``allow_zero`` is false)."""
    low_ok = isinstance(value, int | float) and (value >= 0 if allow_zero else value > 0)
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or not low_ok
        or value > MAX_TTL_S
    ):
        low = "0 <=" if allow_zero else "0 <"
        raise errors.InvalidInputError(
            field, f"must be finite seconds, {low} seconds <= ten years, got {value!r}"
        )
    return float(value)


def check_int(value: object, field: str, minimum: int) -> int:
    """An ``int`` (not a ``bool``) in [``minimum``, 2**63 - 1]: what a BIGINT holds."""
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= MAX_INT:
        raise errors.InvalidInputError(
            field, f"must be an integer from {minimum} to 2**63 - 1, got {value!r}"
        )
    return value


def check_limit(limit: object) -> int:
    """A page size: an ``int`` from 1 to :data:`MAX_LIMIT`."""
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
        raise errors.InvalidInputError(
            "limit", f"must be an integer from 1 to {MAX_LIMIT:,}, got {limit!r}"
        )
    return limit


def check_purpose(purpose: object) -> str:
    """One of the seed's lease purposes (``LeasePurpose``)."""
    try:
        return LeasePurpose(str(purpose) if isinstance(purpose, str) else "").value
    except ValueError:
        allowed = ", ".join(p.value for p in LeasePurpose)
        raise errors.InvalidInputError("purpose", f"must be one of {allowed}") from None


def check_target(target: object, field: str = "target") -> str:
    """A lease target: an id (:func:`~.codec.check_id`) of up to
    :data:`~.codec.MAX_TARGET_BYTES` (a kind prefix and an id); a ``session:``
    target names a session id that is one too (``"session:"`` alone names none)."""
    text = check_id(target, field, max_bytes=MAX_TARGET_BYTES)
    if text.startswith("session:"):
        check_id(text.removeprefix("session:"), f"{field} (its session id)")
    return text


def check_lease(lease: object, field: str = "lease") -> Lease:
    """A :class:`Lease` whose identifying fields are well-typed storable text and
    whose epoch is an ``int`` from 1 to 2**63 - 1 (what the epoch column holds)."""
    if not isinstance(lease, Lease):
        raise errors.InvalidInputError(field, f"expected a Lease, got {type(lease).__name__}")
    check_target(lease.target, f"{field}.target")
    for name in ("owner", "token"):
        check_id(getattr(lease, name), f"{field}.{name}")
    check_int(lease.epoch, f"{field}.epoch", 1)
    return lease


def check_list(value: object, field: str, what: str) -> Sequence[Any]:
    """``value`` as a sequence of items (a list or tuple, not text or a mapping).

    Raises:
        InvalidInputError: anything else (``what`` names the items expected).
    """
    if isinstance(value, str | bytes | Mapping) or not isinstance(value, Sequence):
        raise errors.InvalidInputError(field, f"expected a list of {what}")
    return value


def check_session_leases(given: object, field: str = "leases") -> dict[str, Lease]:
    """A list of leases on sessions (``session:<id>``), by target: the leases
    a write over several sessions is given (a later one of a target wins).

    Raises:
        InvalidInputError: not a list, a malformed lease, or one on another target.
    """
    held: dict[str, Lease] = {}
    for i, lease in enumerate(check_list(given, field, "leases")):
        check_lease(lease, f"{field}[{i}]")
        if not lease.target.startswith("session:"):
            raise errors.InvalidInputError(
                f"{field}[{i}]", f"a lease on {lease.target!r} is no session's"
            )
        held[lease.target] = lease
    return held


def check_session_lease(session_id: str, lease: Lease | None) -> Lease | None:
    """``lease`` must be a lease on ``session:<session_id>`` (or ``None``).

    A lease is authority over its own target only: a lease on another
    session (or any other target) never fences a write to this one.
    """
    if lease is None:
        return None
    check_lease(lease)
    expected = session_target(session_id)
    if lease.target != expected:
        raise errors.InvalidInputError(
            "lease", f"a lease on {lease.target!r} cannot write to {expected!r}"
        )
    return lease


def check_expected_leaf(expected_leaf: object) -> Any:
    """``ANY_LEAF``, ``None`` or an entry id."""
    if expected_leaf is ANY_LEAF or expected_leaf is None:
        return expected_leaf
    return check_id(expected_leaf, "expected_leaf")


def check_header(header: object) -> dict[str, Any]:
    """Extra header fields: a mapping with string keys (or ``None`` for none)."""
    if header is None:
        return {}
    if not isinstance(header, Mapping) or not all(isinstance(k, str) for k in header):
        raise errors.InvalidInputError("header", "must be a mapping with string keys")
    return dict(header)


def check_request(request: object) -> FinalizeRequest:
    """A :class:`FinalizeRequest` with real booleans and a sequence of leases."""
    if not isinstance(request, FinalizeRequest):
        raise errors.InvalidInputError("request", "expected a FinalizeRequest")
    for name in ("archive_old", "rebind_active", "require_key_absent"):
        check_bool(getattr(request, name), name)
    held = request.held_leases
    if not isinstance(held, Sequence) or isinstance(held, str | Lease):
        raise errors.InvalidInputError("held_leases", "must be a list of leases")
    for i, lease in enumerate(held):
        check_lease(lease, f"held_leases[{i}]")
    return request


def check_path(path: object) -> str:
    """A database path: ``":memory:"``, or a str/PathLike without NUL characters."""
    if not isinstance(path, str | os.PathLike):
        raise errors.InvalidInputError("path", f"expected a path, got {type(path).__name__}")
    text = os.fspath(path)
    if not isinstance(text, str):
        raise errors.InvalidInputError("path", "expected a text path")
    check_text(text, "path", allow_empty=False)
    if "\x00" in text:
        raise errors.InvalidInputError("path", "must not contain NUL")
    return text


def check_plan(plan: object) -> DeliveryPlan:
    """A :class:`DeliveryPlan`: storable text, at least one step, step keys
    unique, and each dependency naming an earlier step."""
    if not isinstance(plan, DeliveryPlan):
        raise errors.InvalidInputError(
            "plan", f"expected a DeliveryPlan, got {type(plan).__name__}"
        )
    check_text(plan.platform, "plan.platform", allow_empty=False)
    check_text(plan.target_id, "plan.target_id", allow_empty=False)
    check_text(plan.reply_message_id, "plan.reply_message_id")
    if not isinstance(plan.transport_context, Mapping):
        raise errors.InvalidInputError("plan.transport_context", "expected a mapping")
    to_json(dict(plan.transport_context), "plan.transport_context")
    if not isinstance(plan.steps, Sequence) or isinstance(plan.steps, str | bytes):
        raise errors.InvalidInputError("plan.steps", "expected a sequence of DeliveryStep")
    if not plan.steps:
        raise errors.InvalidInputError("plan.steps", "a plan has at least one step")
    seen: set[str] = set()
    for i, step in enumerate(plan.steps):
        where = f"plan.steps[{i}]"
        if not isinstance(step, DeliveryStep):
            raise errors.InvalidInputError(where, "expected a DeliveryStep")
        check_id(step.key, f"{where}.key")
        check_text(step.kind, f"{where}.kind", allow_empty=False)
        for name in ("artifact_id", "idempotency_key", "payload_digest"):
            check_text(getattr(step, name), f"{where}.{name}")
        if step.entry_id is not None:
            check_id(step.entry_id, f"{where}.entry_id")
        if step.key in seen:
            raise errors.InvalidInputError(f"{where}.key", f"duplicate step key {step.key!r}")
        if step.depends_on is not None and step.depends_on not in seen:
            raise errors.InvalidInputError(
                f"{where}.depends_on", f"{step.depends_on!r} is not an earlier step"
            )
        seen.add(step.key)
    return plan
