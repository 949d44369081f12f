"""Ambiguous commits for the differential machines (issue 22): the write
happened, but the caller saw an error, so a runtime retries it.

:func:`ambiguous_commits` patches the store's backend ``write`` (every area
shares one backend object, ``store.db``; the patch is an instance attribute
of that one store's backend, removed on exit: ``turnkeeper fuzz`` applies it
to its scratch stores only): each write runs and commits as usual, then the
caller gets ``OperationalError``, the PEP 249 class the store raises for a
lost connection (``turnkeeper.spec.errors``). A write whose body refuses
(a typed domain error) commits nothing and raises that error unchanged.
Only the block's first write is made ambiguous: one call, one lost reply.

:func:`ambiguously` runs one store call that way and says what the caller
saw: ``("ambiguous", operations)`` (the call's writes that committed before
the injected error: the first one, since the error ends the call) or the
typed error :func:`attempt` would give. A machine's "X, ambiguously" rule
applies the write to its oracle on ``"ambiguous"`` (it happened), retries
the same call normally and compares the retry with the oracle.

:func:`replayable` formats a step as the line that replays it with
``model_tests/by_hand.py``'s ``Steps`` (``m.rule(arg=value, …)``), for ``hypothesis.note``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from hypothesis import currently_in_test_context, note

import turnkeeper
from turnkeeper import OperationalError

INJECTED = "connection lost after the write committed (injected by the test)"
"""The injected error's detail: :func:`ambiguously` tells it from a real one."""


@contextmanager
def ambiguous_commits(store: turnkeeper.BaseStore) -> Iterator[list[str]]:
    """Within the block, the first write of ``store`` commits and then raises
    ``OperationalError`` (detail :data:`INJECTED`) to its caller; a refused
    first write raises its own error, and the writes after it (a refusal's
    ``fence_events`` row …) run as usual. Yields the list of the operations
    that committed and raised so (at most one)."""
    db: Any = store.db
    real = db.write
    committed: list[str] = []

    calls: list[str] = []

    def write(operation: str, body: Callable[..., Any], **kwargs: Any) -> Any:
        calls.append(operation)
        if len(calls) > 1:  # the call's own bookkeeping after its refused write
            return real(operation, body, **kwargs)
        real(operation, body, **kwargs)
        committed.append(operation)
        raise OperationalError(detail=INJECTED)

    own = vars(db).get("write")  # an instance attribute already there (another patch)
    db.write = write
    try:
        yield committed
    finally:
        if own is None:
            del db.write  # the class's method again
        else:
            db.write = own


def ambiguously(
    store: turnkeeper.BaseStore,
    attempt: Callable[..., tuple[Any, ...]],
    fn: Callable[..., Any],
    *args: Any,
    **kwargs: Any,
) -> tuple[Any, ...]:
    """Run ``attempt(fn, *args, **kwargs)`` under :func:`ambiguous_commits`.

    Returns ``("ambiguous", operations)`` when the call committed a write and
    the caller saw the injected ``OperationalError`` (``operations``: the
    writes committed, exactly one), else what ``attempt`` returned (a typed
    refusal: nothing committed). A success is impossible under the patch and
    fails the step, as does any other error."""
    with ambiguous_commits(store) as committed:
        try:
            got = attempt(fn, *args, **kwargs)
        except OperationalError as error:
            assert error.detail == INJECTED, f"a real backend failure: {error!r}"
            assert len(committed) == 1, f"one call, several writes: {committed}"
            return ("ambiguous", tuple(committed))
    assert got[0] != "ok", f"{fn} returned without writing: {got}"
    assert committed == [], f"a refused call committed {committed}: {got}"
    return got


def replayable(rule: str, **args: Any) -> str:
    """The ``model_tests/by_hand.py``'s ``Steps`` line that replays ``rule(**args)``, noted for a
    shrunk failure (``hypothesis.note``; outside a Hypothesis test, only
    returned)."""
    line = f"m.{rule}(" + ", ".join(f"{k}={v!r}" for k, v in args.items()) + ")"
    if currently_in_test_context():  # a by-hand replay has no Hypothesis test to note in
        note(line)
    return line
