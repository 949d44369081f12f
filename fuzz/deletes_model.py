"""The deletes machine's model (:mod:`.deletes`): each live session as plain
Python, and store calls expressed as outcomes the model predicts.

A :class:`SessionModel` is what the store must show for one session (its
last-write time, transcript, metadata, lineage version, response archives,
tool records and active run); :func:`attempt` runs a store call and names
its refusal the way the machine's expectations do (``"busy"``, ``"lost"``,
``"missing"`` …).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from turnkeeper import (
    BusyError,
    ChannelBoundError,
    ForkNoCompletedTurnError,
    ForkSessionActiveError,
    ForkSessionNotFoundError,
    InvalidTransitionError,
    LeaseLostError,
    RunNotFoundError,
    RuntimeSessionNotFoundError,
    SessionBoundError,
    SessionIDExistsError,
    SessionNotFoundError,
    SessionRecoveryRequiredError,
    SessionRunActiveError,
)

SESSIONS = ("s1", "s2", "s3")
"""The sessions every example starts with (each with one completed turn)."""

CHANNELS = ("c1", "c2")
"""Channel ids (type ``"chat"``) sessions are bound to."""

OWNERS = ("W1", "W2")
"""The workers that take session leases."""

REPLY = {"role": "assistant", "content": [{"type": "text", "text": "done"}]}
"""The assistant message a succeeded run appends."""


@dataclass
class SessionModel:
    """One live session as the store must show it: ``updated`` (the store's
    clock at its last write), ``messages`` (its transcript), ``turn_end``
    (messages up to the last succeeded turn's end: what a fork copies), its
    ``active_run`` id, ``lineage`` version, ``archived`` response runs,
    ``tools`` records and ``pinned`` metadata flag."""

    updated: datetime
    messages: list[Any] = field(default_factory=list)
    turn_end: int = 0
    active_run: str | None = None
    lineage: int = 0
    archived: int = 0
    tools: int = 0
    pinned: bool = False


def attempt(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[Any, ...]:
    """Run ``fn(*args, **kwargs)``: ``("ok", result)``, or the refusal's kind
    as a 1-tuple (``"no_session"``, ``"recovery"``, ``"busy"``, ``"lost"``,
    ``"active"``, ``"missing"``, ``"exists"``, ``"no_turn"``, ``"bound"``,
    ``"transition"``); any other error propagates (it fails the step)."""
    try:
        return ("ok", fn(*args, **kwargs))
    except RuntimeSessionNotFoundError:
        return ("no_session",)
    except SessionRecoveryRequiredError:
        return ("recovery",)
    except BusyError:  # ForkSessionBusyError included
        return ("busy",)
    except LeaseLostError:
        return ("lost",)
    except (SessionRunActiveError, ForkSessionActiveError):
        return ("active",)
    except (SessionNotFoundError, RunNotFoundError, ForkSessionNotFoundError):
        return ("missing",)
    except SessionIDExistsError:
        return ("exists",)
    except ForkNoCompletedTurnError:
        return ("no_turn",)
    except (ChannelBoundError, SessionBoundError):
        return ("bound",)
    except InvalidTransitionError:
        return ("transition",)
