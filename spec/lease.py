"""The lease lifecycle (threadstore AcquireLease / RenewLease / ReleaseLease).

A lease is owner + token + epoch + purpose + expiry on a target string
(``session:<id>``, ``thread-key:<key>`` …). Stored states are ``absent`` (no
row yet), ``held`` and ``released``; expiry is not a stored state but the
guard ``expired``, judged by the store's clock (``now >= expires_at``).

Facts the guards read, observed in the transaction that writes:

- ``expired``: the stored lease's expiry is at or before now;
- ``same_owner``: the caller's owner equals the stored owner;
- ``same_purpose``: the caller's purpose equals the stored purpose;
- ``token_matches``: the caller's token digest equals the stored digest
  (and its epoch equals the stored epoch).
"""

from __future__ import annotations

from enum import StrEnum

from .lifecycle import Edge, Lifecycle, fact


class LeasePurpose(StrEnum):
    """Why an owner holds a lease (session seed RuntimeLeasePurpose)."""

    ADMISSION = "admission"
    EXECUTION = "execution"
    RECOVERY = "recovery"
    MUTATION = "mutation"
    FORK = "fork"


LEASE = Lifecycle(
    name="lease",
    states=("absent", "held", "released"),
    initial="absent",
    edges=(
        Edge("grant", "acquire", "absent", "held"),
        Edge("regrant", "acquire", "released", "held"),
        Edge("takeover", "acquire", "held", "held", guards=("expired",)),
        Edge(
            "reacquire",
            "acquire",
            "held",
            "held",
            guards=("same_owner", "same_purpose", "token_matches"),
            unless=("expired",),
        ),
        Edge("renew", "renew", "held", "held", guards=("token_matches",), unless=("expired",)),
        Edge("bind", "bind_run", "held", "held", guards=("token_matches",), unless=("expired",)),
        Edge("release", "release", "held", "released", guards=("token_matches",)),
    ),
    guards={
        "expired": (fact("expired"), "the lease's expiry is at or before the store's now"),
        "same_owner": (fact("same_owner"), "the caller is the stored owner"),
        "same_purpose": (fact("same_purpose"), "the caller asks for the stored purpose"),
        "token_matches": (fact("token_matches"), "the caller's token digest and epoch match"),
    },
    invariants=(
        "per target, epochs strictly increase with each grant, regrant or takeover",
        "at any store time at most one unexpired holder per target",
        "an epoch is never granted twice (rows are kept after release)",
        "only a digest of the token is stored",
    ),
)
"""Edges ``grant``, ``regrant`` and ``takeover`` issue a fresh token and epoch + 1;
``reacquire`` returns the held token and epoch with a new expiry; ``bind``
(``leases.bind_run``) makes the held lease an ``execution`` lease bound to a
run, under a new token, same epoch and expiry."""

GRANTING_EDGES = frozenset({"grant", "regrant", "takeover"})
"""Edges that issue a new token under a strictly higher epoch."""


def acquire_decision(
    source: str,
    expired: bool,
    same_owner: bool,
    same_purpose: bool,
    token_matches: bool,
    epoch: int,
) -> tuple[str, int]:
    """What ``acquire`` does to a target's lease row: ``(outcome, epoch after)``.

    ``outcome`` is the edge taken (``grant``, ``regrant``, ``takeover``,
    ``reacquire``) or the refusal (``busy``, ``purpose``); ``epoch`` is the
    stored epoch (0 when ``absent``). Pure: the contracts below are checked by
    CrossHair, and the store's machine is checked against this function over
    every combination of facts.

    pre: source in ("absent", "held", "released")
    pre: epoch >= 0
    pre: (source == "absent") == (epoch == 0)
    post: __return__[0] in ("grant", "regrant", "takeover", "reacquire", "busy", "purpose")
    post: (__return__[0] in GRANTING_EDGES) == (__return__[1] == epoch + 1)
    post: __return__[0] in GRANTING_EDGES or __return__[1] == epoch
    post: not (source == "held" and not expired) or __return__[0] not in GRANTING_EDGES
    post: __return__[0] != "reacquire" or (same_owner and same_purpose and token_matches)
    post: __return__[0] != "busy" or (source == "held" and not expired)
    """
    facts = {
        "expired": expired,
        "same_owner": same_owner,
        "same_purpose": same_purpose,
        "token_matches": token_matches,
    }
    edge = LEASE.select("acquire", source, facts)
    if edge is None:
        refusal = "purpose" if same_owner and not same_purpose else "busy"
        return (refusal, epoch)
    return (edge.name, epoch + 1 if edge.name in GRANTING_EDGES else epoch)


def session_target(session_id: str) -> str:
    """The lease target that guards session ``session_id``: ``session:<id>``."""
    return f"session:{session_id}"
