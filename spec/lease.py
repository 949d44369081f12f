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
``reacquire`` returns the held token and epoch with a new expiry."""

GRANTING_EDGES = frozenset({"grant", "regrant", "takeover"})
"""Edges that issue a new token under a strictly higher epoch."""
