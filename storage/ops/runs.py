"""``store.runs``: execution intents, runs and run events (session seed runs).

One area object assembled from parts, each in its own module beside this one:

- :mod:`.run_admission`: admit (intent, run, turn, user entry, ``admit``
  event and submission in one transaction);
- :mod:`.run_lifecycle`: start, wait, resume, finish and request_cancel;
- :mod:`.run_reads`: get, active, list and the run events by sequence cursor;
- :mod:`.run_records`: turns, intents, submissions and a run's event cursor;
- :mod:`.run_intents`: save_intent (an execution intent before its run);
- :mod:`.run_turns`: start_turn and end_turn (conversation turns on their own);
- :mod:`.run_errors`: error annotations;
- :mod:`.run_usage`: usage, progress and structured errors.

- :mod:`.run_events`: record_event (a runtime's own run event; the writer of
  every run event).
"""

from __future__ import annotations

from .run_admission import AdmissionPart
from .run_errors import RunErrorsPart
from .run_events import RunEventsPart
from .run_intents import IntentsPart
from .run_lifecycle import LifecyclePart
from .run_reads import RunReadsPart
from .run_records import RunRecordsPart
from .run_turns import TurnsPart
from .run_usage import RunUsagePart


class Runs(
    AdmissionPart,
    LifecyclePart,
    RunReadsPart,
    RunRecordsPart,
    TurnsPart,
    RunEventsPart,
    IntentsPart,
    RunErrorsPart,
    RunUsagePart,
):
    """``store.runs``: see the module docstring."""
