"""Differential stateful fuzzing of turnkeeper stores (``turnkeeper fuzz``).

Simulated writers race against a plain-Python oracle on an injected clock,
with ambiguous commits (the write committed, the caller saw an error), each
machine on stores from an injected opener: the test suite's, or the scratch
stores ``turnkeeper fuzz`` makes beside a user's configuration.

The machines (:mod:`.leases`, :mod:`.runs`, :mod:`.outbox`,
:mod:`.bindings`, :mod:`.tools`, :mod:`.sessions`, :mod:`.ledger`,
:mod:`.deletes`), the ambiguous commits (:mod:`.ambiguous`), the runner and
its report need Hypothesis (``pip install 'turnkeeper[fuzz]'``); this
package's own names do not.
"""

from .clock import FakeClock
from .opener import StoreOpener
from .oracle import Oracle, OracleLease, Outcome

__all__ = ["FakeClock", "Oracle", "OracleLease", "Outcome", "StoreOpener"]
