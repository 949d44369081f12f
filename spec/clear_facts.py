"""What an entry's payload tells analytics, kept in clear columns beside it.

An entry's payload may be stored sealed (encryption at rest, issue 23); what
``turnkeeper report`` reads of it is stored a second time in columns of
``entries`` that stay clear: the message's ``role``, and the ``provider`` and
``model`` of an assistant message or a ``model_change`` entry (pi's
``provider`` and ``modelId``; ``model`` where an entry has no ``modelId``).
:func:`clear_facts` derives them from the decoded payload, the one place that
decides; the migration that added the columns (schema 33) backfilled the rows
already stored with the same rule in SQL, and a test holds the two equal.

A fact is text or ``None``: a field that is absent, JSON ``null`` or not a
JSON string (a number, an object …) gives ``None``; so does every field of
another kind of entry. A value is at most :data:`NAME_MAX` characters (code
points): a longer one is cut to ``NAME_MAX - 1`` characters followed by
:data:`CUT` (U+2026), so that a clear column never holds more of a payload
than a name needs, and a cut value shows that it was cut.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

NAME_MAX = 200
"""Most characters a clear fact holds (a model id such as a Bedrock inference
profile ARN is about 100)."""

CUT = "\u2026"
"""What ends a value cut to :data:`NAME_MAX` characters."""

MESSAGE = "message"
MODEL_CHANGE = "model_change"
ASSISTANT = "assistant"


class ClearFacts(NamedTuple):
    """The clear columns of one entry, in table order (``role``, ``provider``, ``model``)."""

    role: str | None = None
    provider: str | None = None
    model: str | None = None


NONE = ClearFacts()
"""An entry that tells analytics nothing."""


def bounded(value: Any) -> str | None:
    """``value`` as a clear fact: ``None`` unless it is a string; cut to
    :data:`NAME_MAX` characters (the last one :data:`CUT`) when longer.

    pre: type(value) in (str, int, float, bool, list, dict, type(None))
    post: (__return__ is None) == (not isinstance(value, str))
    post: __return__ is None or len(__return__) <= NAME_MAX
    post: __return__ in (None, value) or len(value) > NAME_MAX == len(__return__)
    post: __return__ in (None, value) or value.startswith(__return__[:-1]) and __return__[-1] == CUT
    """
    if not isinstance(value, str):
        return None
    if len(value) <= NAME_MAX:
        return value
    return value[: NAME_MAX - 1] + CUT


def clear_facts(kind: str, payload: Mapping[str, Any]) -> ClearFacts:
    """The clear columns of an entry of ``kind`` whose decoded payload is ``payload``.

    - ``message``: ``role`` is ``payload["message"]["role"]``; for an
      assistant message (role ``"assistant"``) also its ``provider`` and
      ``model``.
    - ``model_change``: ``provider``, and ``model`` from ``modelId`` (pi), or
      ``model`` when ``modelId`` is absent or ``null``.
    - any other kind: nothing.

    Each value as :func:`bounded` keeps it. Pure; never raises.

    pre: type(payload) is dict and type(payload.get(MESSAGE, {})) in (str, int, dict, type(None))
    post: kind in (MESSAGE, MODEL_CHANGE) or __return__ == NONE
    post: __return__.role == ASSISTANT or __return__[1:] == (None, None) or kind == MODEL_CHANGE
    post: kind != MODEL_CHANGE or __return__.role is None
    post: all(v is None or len(v) <= NAME_MAX for v in __return__)
    """
    if kind == MESSAGE:
        message = payload.get("message")
        if not isinstance(message, Mapping):
            return NONE
        role = bounded(message.get("role"))
        if role != ASSISTANT:
            return ClearFacts(role)
        return ClearFacts(role, bounded(message.get("provider")), bounded(message.get("model")))
    if kind == MODEL_CHANGE:
        model_id = payload.get("modelId")
        return ClearFacts(
            None,
            bounded(payload.get("provider")),
            bounded(payload.get("model") if model_id is None else model_id),
        )
    return NONE
