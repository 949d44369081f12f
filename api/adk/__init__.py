"""Google ADK's session service on turnkeeper (``pip install turnkeeper[adk]``).

    import turnkeeper.aio
    from turnkeeper.adk import TurnkeeperSessionService

    store = await turnkeeper.aio.open_store("agents.duckdb")
    service = TurnkeeperSessionService(store, owner="worker-1")
    runner = Runner(agent=agent, app_name="app", session_service=service)

``TurnkeeperSessionService`` is a ``google.adk.sessions.BaseSessionService``:
``create_session``, ``get_session`` (``GetSessionConfig``), ``list_sessions``,
``delete_session``, ``get_user_state`` and ``append_event``, with ADK's state
scopes (``app:`` and ``user:`` shared, ``temp:`` never stored).

- An ADK session ``(app_name, user_id, session_id)`` is the turnkeeper session
  ``adk:<app>/<user>/<session>`` (each part percent-encoded), each event one
  ``custom`` entry holding ``Event.model_dump(mode="json")``; app and user
  state are thread records (``store.threads``), which outlive sessions as
  ADK's app and user state do.
- A stale ``Session`` (another writer appended since it was loaded) is
  refused with :class:`StaleSessionError`, both turnkeeper's
  ``SessionModifiedError`` and ADK's ``StaleSessionError``: the append is
  fenced on the entry the session was loaded at (``expected_leaf``), where
  ADK's ``DatabaseSessionService`` compares a revision marker.
- The writer holds a turnkeeper lease on the session: a second writer is
  refused (``BusyError``) while the first's lease lives, and a writer whose
  lease another took over is refused (``LeaseLostError``), nothing written.
"""

from .service import (
    SessionExistsError,
    SessionNotFoundError,
    StaleSessionError,
    TurnkeeperSessionService,
)

__all__ = [
    "SessionExistsError",
    "SessionNotFoundError",
    "StaleSessionError",
    "TurnkeeperSessionService",
]
