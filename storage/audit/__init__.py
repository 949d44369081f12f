"""The audit: read-only checks over a stored database (``turnkeeper audit``).

Each check reads the stored history (leases and their events, entries,
runs, the outbox, tool records, bindings, the ledger …) and returns a
:class:`Check`: how many things it examined and the violations it found.
:func:`run_audit` runs every check over some sessions or the whole store,
in one snapshot (:mod:`.checks`, :mod:`.runs`, :mod:`.orphans`), then the
ledger checks that replay through ``store.ledger`` (:mod:`.ledger`,
:mod:`.verify`). Nothing here writes; the CLI's ``audit`` command, the demo
and the differential machines of :mod:`turnkeeper.fuzz` all call it.
"""

from .base import Check, Scope
from .checks import run_audit

__all__ = ["Check", "Scope", "run_audit"]
