"""``turnkeeper sessions show`` of a big session: its entries listed in append
order, read and printed a page at a time.

A tree needs every entry before its first line (a fork's branches are drawn
one after another), so a session of more than :data:`TREE_MAX` entries, or a
``show`` given ``--offset``, ``--limit`` or ``--flat``, is listed instead:
one line per entry, ``seq kind id summary``, read :data:`PAGE` entries at a
time (``store.sessions.entries_after``) and each page printed as soon as it
is read, so the first lines come at once and memory holds one page,
whatever the session's size. An entry whose parent is not the entry printed
just before it says so (``↳ under <parent>``: a fork, or a root); the leaf
and the labels are marked as in the tree. Short ids tell apart the entries
of a page and the parents they name (:func:`~.entry_summary.short_ids`).
While it prints, a progress bar counts the entries on stderr when stderr is
a terminal and stdout is not (printing to a file or a pipe); it never
writes to stdout.
"""

from __future__ import annotations

from collections.abc import Mapping

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.text import Text

from turnkeeper.spec.records import Entry, Session
from turnkeeper.storage import BaseStore

from .common import stderr_console, stdout_console, visible
from .entry_summary import short_ids, summarize_entry

TREE_MAX = 2000
"""Most entries ``sessions show`` draws as a tree; a bigger session is listed."""

PAGE = 1000
"""Entries read (``sessions.entries_after``) and printed at a time."""


def _progress(total: int) -> Progress:
    console = stderr_console()
    stdout = stdout_console()
    return Progress(
        TextColumn("[bold]showing"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        disable=not console.is_terminal or stdout.is_terminal,
        transient=True,
        redirect_stdout=False,
        redirect_stderr=False,
    )


def _line(
    entry: Entry,
    shown: Mapping[str, str],
    after: str | None,
    leaf_id: str | None,
    label: str | None,
) -> Text:
    line = Text()
    line.append(f"{entry.seq} ", style="dim")
    line.append(entry.kind, style="cyan")
    line.append(f" {shown[entry.id]} ", style="dim")
    line.append(summarize_entry(entry, shown))
    if entry.parent_id != after:
        under = "a root" if entry.parent_id is None else shown[entry.parent_id]
        line.append(f"  ↳ under {under}", style="magenta")
    if label is not None:
        line.append(f" [{visible(label)}]", style="bold yellow")
    if entry.id == leaf_id:
        line.append("  ◀ leaf", style="bold green")
    return line


def print_pages(
    store: BaseStore,
    session: Session,
    labels: Mapping[str, str],
    offset: int,
    limit: int | None,
) -> int:
    """Print ``session``'s entries from the ``offset``-th (0-based, in append
    order), at most ``limit`` (all without), a :data:`PAGE` at a time (see the
    module docstring); returns the entries printed.

    Raises:
        SessionNotFoundError: the session was deleted meanwhile.
    """
    out = stdout_console()
    title = Text(f"session {session.id}", style="bold")
    if session.title:
        title.append(f"  {visible(session.title)}", style="italic")
    title.append(f"  cwd={visible(session.cwd)}  {session.entry_count} entries", style="dim")
    out.print(title)
    want = max(session.entry_count - offset, 0) if limit is None else limit
    printed, after_seq, previous = 0, 0, None
    skip = offset
    with _progress(min(want, max(session.entry_count - offset, 0))) as bar:
        task = bar.add_task("", total=min(want, max(session.entry_count - offset, 0)))
        while limit is None or printed < limit:
            size = PAGE if limit is None else min(PAGE, limit - printed)
            page = store.sessions.entries_after(session.id, after_seq, offset=skip, limit=size)
            skip = 0
            if not page:
                break
            ids = [e.id for e in page]
            ids += [e.parent_id for e in page if e.parent_id is not None]
            ids += [t for t in labels if t in ids]
            shown = short_ids(ids)
            lines = []
            for e in page:
                lines.append(_line(e, shown, previous, session.leaf_id, labels.get(e.id)))
                previous = e.id
            out.print(Text("\n").join(lines), soft_wrap=True)
            printed += len(page)
            after_seq = page[-1].seq
            bar.advance(task, len(page))
            if len(page) < size:
                break
    end = offset + printed
    if printed == 0:
        out.print(
            Text(f"no entries at offset {offset} ({session.entry_count} in all)", style="dim")
        )
    elif end < session.entry_count:
        out.print(Text(f"entries {offset + 1}–{end} of {session.entry_count}", style="dim"))
    return printed
