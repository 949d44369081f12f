"""How ADK's sessions sit in turnkeeper: ids, the event entry, state scopes.

An ADK session is addressed by ``(app_name, user_id, session_id)``; a turnkeeper
session by one id. Each part is percent-encoded (``urllib.parse.quote`` with no
safe characters), so ``/`` and ``:`` inside a part cannot make two addresses
meet:

- the session: ``adk:<app>/<user>/<session>``, with working directory
  (``cwd``) ``adk:<app>/<user>`` so that one user's sessions are one
  directory listing (``sessions.list(cwd=…)``);
- the app's state: the thread record keyed ``adk-app:<app>``, and a user's
  state the one keyed ``adk-user:<app>/<user>`` (see :mod:`._scoped`).

An ADK ``Event`` is one ``custom`` entry (``customType`` :data:`EVENT_TYPE`)
whose ``data`` holds the event as ``Event.model_dump(mode="json")`` (read back
with ``Event.model_validate``, ADK's own serializer both ways, as its
``DatabaseSessionService`` stores it) and the session-scoped state after the
event, so the newest entry alone gives the session's state.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from google.adk.events.event import Event
from google.adk.sessions.state import State
from pydantic_core import PydanticSerializationError, to_jsonable_python

from turnkeeper.spec import errors

EVENT_TYPE = "adk.event"
"""The ``customType`` of an entry that holds one ADK event."""

HEADER_KEY = "adk"
"""The session header's key for the ADK address and the state given at creation."""

_MARKER = "turnkeeper-leaf:"


def _q(part: str) -> str:
    return quote(part, safe="")


def user_dir(app_name: str, user_id: str) -> str:
    """The ``cwd`` of a user's sessions: ``adk:<app>/<user>``."""
    return f"adk:{_q(app_name)}/{_q(user_id)}"


def app_search(app_name: str) -> str:
    """The text every session id of ``app_name`` starts with: ``adk:<app>/``."""
    return f"adk:{_q(app_name)}/"


def session_key(app_name: str, user_id: str, session_id: str) -> str:
    """The turnkeeper session id of an ADK session: ``adk:<app>/<user>/<session>``."""
    return f"{user_dir(app_name, user_id)}/{_q(session_id)}"


def app_state_key(app_name: str) -> str:
    """The thread-record key of an app's state."""
    return f"adk-app:{_q(app_name)}"


def user_state_key(app_name: str, user_id: str) -> str:
    """The thread-record key of a user's state in an app."""
    return f"adk-user:{_q(app_name)}/{_q(user_id)}"


def split_state(
    state: dict[str, Any], field: str
) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """``state`` split by ADK's scopes into (app, user, session) parts, as JSON.

    ``app:`` and ``user:`` keys lose their prefix; ``temp:`` keys are dropped
    (ADK never persists them); values become JSON data by pydantic's
    ``to_jsonable_python``, as ADK's database services store them.

    Raises:
        InvalidInputError: ``field`` (the argument ``state`` came from) holds a
            value with no JSON form (a function, say). ADK's database services
            store such a value's ``repr`` instead; here it is refused.
    """
    app: dict[str, Any] = {}
    user: dict[str, Any] = {}
    session: dict[str, Any] = {}
    for key, value in state.items():
        if key.startswith(State.APP_PREFIX):
            app[key.removeprefix(State.APP_PREFIX)] = value
        elif key.startswith(State.USER_PREFIX):
            user[key.removeprefix(State.USER_PREFIX)] = value
        elif not key.startswith(State.TEMP_PREFIX):
            session[key] = value
    try:
        jsonable: tuple[dict[str, Any], dict[str, Any], dict[str, Any]] = to_jsonable_python(
            (app, user, session)
        )
    except PydanticSerializationError as exc:
        raise errors.InvalidInputError(field, f"a value has no JSON form: {exc}") from None
    return jsonable


def merged(session: dict[str, Any], app: dict[str, Any], user: dict[str, Any]) -> dict[str, Any]:
    """Session state with the app's and the user's state under their prefixes."""
    out = dict(session)
    out.update({State.APP_PREFIX + k: v for k, v in app.items()})
    out.update({State.USER_PREFIX + k: v for k, v in user.items()})
    return out


def event_payload(event: Event, session_state: dict[str, Any]) -> dict[str, Any]:
    """The ``custom`` entry payload of ``event`` with the session state after it.

    Raises:
        InvalidInputError: the event has no JSON form (``field="event"``).
    """
    try:
        dumped = event.model_dump(mode="json")
    except PydanticSerializationError as exc:
        raise errors.InvalidInputError("event", f"no JSON form: {exc}") from None
    return {"customType": EVENT_TYPE, "data": {"event": dumped, "state": session_state}}


def is_event(payload: Any) -> bool:
    """Whether an entry payload holds an ADK event."""
    return isinstance(payload, dict) and payload.get("customType") == EVENT_TYPE


def event_of(payload: Any) -> Event:
    """The ADK event an entry payload holds."""
    return Event.model_validate(payload["data"]["event"])


def state_of(payload: Any) -> dict[str, Any]:
    """The session-scoped state an event entry recorded after its event."""
    state: dict[str, Any] = dict(payload["data"]["state"])
    return state


def timestamp_of(payload: Any) -> float:
    """The ADK timestamp (seconds since the epoch) of the event an entry holds."""
    return float(payload["data"]["event"]["timestamp"])


def marker(leaf_id: str | None) -> str:
    """ADK's storage revision marker (``Session._storage_update_marker``) for a leaf."""
    return _MARKER + (leaf_id or "")


def leaf_of(value: str | None) -> tuple[bool, str | None]:
    """``(known, leaf id)`` from a marker: ``known`` is false for a session this
    service did not load (no marker, or another service's)."""
    if value is None or not value.startswith(_MARKER):
        return False, None
    return True, value.removeprefix(_MARKER) or None
