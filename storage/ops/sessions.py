"""``store.sessions``: sessions and their transcripts (session seed Store/Manager).

One area object assembled from parts, each in its own module beside this one:

- :mod:`.session_rows`: create, get, branch, entries, labels (and the entry
  chain every transcript write uses);
- :mod:`.appends`: append, append_many, set_label, set_title;
- :mod:`.replays`: replay, through the store object's replay cache;
- :mod:`.listing`: list, list_detailed, count and continue_recent;
- :mod:`.open_ids`: open (by id, prefix or file), new_sub_agent and sub_agents;
- :mod:`.session_reads`: message paging, latest, header and execution_facts;
- :mod:`.branch_reads`: path_after, path_latest, custom_entry, custom_entries;
- :mod:`.imports`: import_batch and opaque records;
- :mod:`.deletes`: delete, deleted, retain;
- :mod:`.metadata`: get_metadata, set_metadata;
- :mod:`.rekeying`: rotate_key, encrypt (encryption at rest).
"""

from __future__ import annotations

from .appends import AppendsPart
from .base import Shared
from .branch_reads import BranchReadsPart
from .deletes import DeletesPart
from .imports import ImportsPart
from .listing import ListingPart
from .metadata import MetadataPart
from .open_ids import OpenIdsPart
from .rekeying import RekeyingPart
from .replays import BranchCache, ReplaysPart
from .session_reads import SessionReadsPart
from .session_rows import SessionRecordsPart


class Sessions(
    SessionRecordsPart,
    AppendsPart,
    ReplaysPart,
    ListingPart,
    ImportsPart,
    DeletesPart,
    MetadataPart,
    OpenIdsPart,
    SessionReadsPart,
    BranchReadsPart,
    RekeyingPart,
):
    """``store.sessions``: see the module docstring; ``branches`` is the store
    object's replay cache."""

    def __init__(self, shared: Shared, branches: BranchCache) -> None:
        super().__init__(shared)
        self._branches = branches
