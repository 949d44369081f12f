"""``turnkeeper sessions``: list stored sessions, or show one as a tree.

``turnkeeper sessions [--search TEXT] [--limit N] [--json]`` (also
``sessions list``) prints a table of sessions newest first: id, title, cwd,
entry count and creation time (UTC), paging through ``sessions.list`` with
its cursor. ``turnkeeper sessions show ID`` prints the session's entry tree:
each entry's kind, short id (:func:`short_ids`: a prefix that tells the
session's entries apart, plus the suffix of ids derived from a run, such as
``01a23082-e5a4:turn-start``) and a one-line summary, with the current leaf
and labels marked. Linear stretches of the tree are printed flat; where the
tree forks, each child branch is an indented ``branch i/n`` node. A session
of more than 2,000 entries (or ``show --offset/--limit/--flat``) is listed a
page at a time instead (:mod:`.sessions_pages`).
``sessions delete`` and ``sessions retain`` are in :mod:`.sessions_delete`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import click
from rich.table import Table
from rich.text import Text
from rich.tree import Tree

from turnkeeper.spec.errors import ProjectNotFoundError, SessionNotFoundError
from turnkeeper.spec.records import Entry, Session
from turnkeeper.storage import BaseStore
from turnkeeper.storage.ops.listing import STATUSES

from .common import F, cell, db_option, dumps, open_db, stdout_console, visible
from .entry_summary import short_ids, summarize_entry
from .sessions_delete import delete_command, retain_command
from .sessions_pages import TREE_MAX, print_pages

PAGE_SIZE = 100
"""Sessions fetched per ``sessions.list`` call."""


@dataclass(frozen=True, slots=True)
class Filters:
    """What ``turnkeeper sessions`` selects: ``store.sessions.list``'s filters
    (``cwd``, ``status``, ``messages_only``, ``include_sub_agents``, ``search``,
    ``project_id``, ``channel_type``, ``channel_id``), or with ``parent`` that
    session's sub-agents (``store.sessions.sub_agents``)."""

    search: str | None = None
    cwd: str | None = None
    status: str | None = None
    messages_only: bool = False
    include_sub_agents: bool = False
    parent: str | None = None
    project_id: str | None = None
    channel_type: str | None = None
    channel_id: str | None = None

    def listing(self) -> dict[str, Any]:
        return {
            "search": self.search,
            "cwd": self.cwd,
            "status": self.status,
            "messages_only": self.messages_only,
            "include_sub_agents": self.include_sub_agents,
            "project_id": self.project_id,
            "channel_type": self.channel_type,
            "channel_id": self.channel_id,
        }


def fetch_sessions(
    store: BaseStore,
    limit: int,
    search: str | None,
    *,
    offset: int = 0,
    filters: Filters | None = None,
) -> list[Session]:
    """Up to ``limit`` sessions newest first after skipping ``offset``, following
    ``next_cursor`` page by page (the offset applies to the first page only)."""
    kw = (filters or Filters()).listing() | {"search": search}
    found: list[Session] = []
    cursor: str | None = None
    while len(found) < limit:
        page = store.sessions.list(
            limit=min(PAGE_SIZE, limit - len(found)),
            cursor=cursor,
            offset=0 if cursor else offset,
            **kw,
        )
        found.extend(page.sessions)
        cursor = page.next_cursor
        if cursor is None:
            break
    return found


def _session_dict(s: Session) -> dict[str, Any]:
    return {
        "id": s.id,
        "title": s.title,
        "cwd": s.cwd,
        "entries": s.entry_count,
        "created_at": s.created_at,
        "updated_at": s.updated_at,
        "leaf_id": s.leaf_id,
        "sub_agent_of": s.sub_agent_of,
        "channel_type": s.channel_type,
        "channel_id": s.channel_id,
    }


def list_sessions(
    db: str,
    search: str | None,
    limit: int,
    as_json: bool,
    *,
    offset: int = 0,
    filters: Filters | None = None,
) -> None:
    """Print the session listing (table, or one JSON object with ``total`` and
    ``sessions``): ``filters`` select them, ``offset`` and ``limit`` page them;
    ``total`` counts every session the filters select."""
    f = filters or Filters()
    with open_db(db, read_only=True) as store:
        if f.project_id is not None and store.projects.get(f.project_id) is None:
            raise ProjectNotFoundError(f.project_id)
        if f.parent is not None:
            if store.sessions.get(f.parent) is None:
                raise SessionNotFoundError(f.parent)
            every = store.sessions.sub_agents(f.parent)
            total = len(every)
            sessions = every[offset : offset + limit]
        else:
            sessions = fetch_sessions(store, limit, search, offset=offset, filters=f)
            total = store.sessions.count(**(f.listing() | {"search": search}))
    if as_json:
        click.echo(dumps({"total": total, "sessions": [_session_dict(s) for s in sessions]}))
        return
    table = Table(title=f"{len(sessions)} of {total} sessions", title_justify="left")
    table.add_column("id", no_wrap=True, overflow="fold")
    table.add_column("title", overflow="fold")
    table.add_column("cwd", overflow="fold")
    bound = any(s.channel_type is not None for s in sessions)
    if bound:
        table.add_column("channel", overflow="fold")
    table.add_column("entries", justify="right")
    table.add_column("created (UTC)", no_wrap=True)
    for s in sessions:
        channel = (
            []
            if not bound
            else [cell(f"{s.channel_type}:{s.channel_id}" if s.channel_type else "")]
        )
        table.add_row(
            cell(s.id),
            cell(s.title or ""),
            cell(s.cwd),
            *channel,
            f"{s.entry_count:,}",
            s.created_at.strftime("%Y-%m-%d %H:%M:%S"),
        )
    stdout_console().print(table)


# -- one session as a tree ------------------------------------------------------


def _label(
    entry: Entry, shown: Mapping[str, str], on_path: bool, is_leaf: bool, label: str | None
) -> Text:
    line = Text()
    line.append(entry.kind, style="cyan" if on_path else "dim cyan")
    line.append(f" {shown[entry.id]} ", style="dim")
    line.append(summarize_entry(entry, shown), style="" if on_path else "dim")
    if label is not None:
        line.append(f" [{visible(label)}]", style="bold yellow")
    if is_leaf:
        line.append("  ◀ leaf", style="bold green")
    return line


def build_tree(session: Session, entries: Sequence[Entry], labels: Mapping[str, str]) -> Tree:
    """The session as a rich Tree (see the module docstring for the layout)."""
    by_id = {e.id: e for e in entries}
    shown_ids = short_ids(by_id)
    children: dict[str | None, list[Entry]] = {}
    for e in entries:  # in seq order, so siblings keep their append order
        parent = e.parent_id if e.parent_id in by_id else None
        children.setdefault(parent, []).append(e)
    path: set[str] = set()
    node_id = session.leaf_id
    while node_id is not None and node_id in by_id and node_id not in path:
        path.add(node_id)
        node_id = by_id[node_id].parent_id
    title = Text(f"session {session.id}", style="bold")
    if session.title:
        title.append(f"  {visible(session.title)}", style="italic")
    title.append(f"  cwd={visible(session.cwd)}  {session.entry_count} entries", style="dim")
    root = Tree(title)
    stack: list[tuple[Tree, Entry]] = []

    def fork(node: Tree, kids: list[Entry], what: str) -> None:
        for i, kid in enumerate(kids, 1):
            current = "  (current)" if kid.id in path else ""
            branch = node.add(Text(f"⎇ {what} {i}/{len(kids)}{current}", style="magenta"))
            stack.append((branch, kid))  # each branch fills its own node: order is free

    roots = children.get(None, [])
    if len(roots) == 1:
        stack.append((root, roots[0]))
    elif roots:
        fork(root, roots, "root")
    shown: set[str] = set()
    while stack:
        container, entry = stack.pop()
        while entry.id not in shown:
            shown.add(entry.id)
            node = container.add(
                _label(
                    entry,
                    shown_ids,
                    entry.id in path,
                    entry.id == session.leaf_id,
                    labels.get(entry.id),
                )
            )
            kids = children.get(entry.id, [])
            if len(kids) == 1:
                entry = kids[0]
            else:
                if kids:
                    fork(node, kids, "branch")
                break
    hidden = len(entries) - len(shown)
    if hidden:
        root.add(Text(f"{hidden} entries unreachable from a root (broken tree)", style="red"))
    return root


def show_session(
    db: str,
    session_id: str,
    *,
    offset: int = 0,
    limit: int | None = None,
    flat: bool = False,
) -> None:
    """Print one session: as a tree when it has at most :data:`TREE_MAX` entries
    and neither ``flat``, ``offset`` nor ``limit`` is given; otherwise as a
    list in append order (:func:`.sessions_pages.print_pages`), from entry
    ``offset`` (0-based), at most ``limit`` entries, read a page at a time.
    ``session_id`` is a whole id or a prefix of at least 8 characters
    (``store.sessions.open``).

    Raises:
        SessionNotFoundError: no session has this id.
        AmbiguousSessionIDError: more than one session's id starts with it.
    """
    with open_db(db, read_only=True) as store:
        session = store.sessions.open(session_id)
        labels = store.sessions.labels(session.id)
        paged = flat or offset or limit is not None or session.entry_count > TREE_MAX
        if paged:
            print_pages(store, session, labels, offset, limit)
            return
        entries = store.sessions.entries(session.id)
    stdout_console().print(build_tree(session, entries, labels))


def _list_options(f: F) -> F:
    f = click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")(f)
    f = click.option(
        "--sub-agents-of",
        "parent",
        default=None,
        metavar="ID",
        help="List the sub-agent sessions of session ID instead.",
    )(f)
    f = click.option(
        "--sub-agents", "include_sub_agents", is_flag=True, help="Include sub-agent sessions."
    )(f)
    f = click.option(
        "--messages-only", is_flag=True, help="Only sessions with at least one message."
    )(f)
    f = click.option(
        "--status",
        type=click.Choice(STATUSES),
        default=None,
        help="active: a run not yet ended; idle: none.",
    )(f)
    f = click.option(
        "--channel-id", default=None, help="Only sessions bound to a channel of this id."
    )(f)
    f = click.option(
        "--channel-type", default=None, help="Only sessions bound to a channel of this type."
    )(f)
    f = click.option(
        "--project", "project_id", default=None, metavar="ID", help="Only project ID's sessions."
    )(f)
    f = click.option("--cwd", default=None, help="Only this working directory's sessions.")(f)
    f = click.option(
        "--offset",
        type=click.IntRange(min=0),
        default=0,
        show_default=True,
        help="Sessions to skip first (paging).",
    )(f)
    f = click.option(
        "--limit",
        type=click.IntRange(min=1),
        default=50,
        show_default=True,
        help="Most sessions to list.",
    )(f)
    f = click.option(
        "--search", default=None, help="Match id, cwd, title, channel or message text."
    )(f)
    return f


@click.group("sessions", invoke_without_command=True)
@db_option()
@_list_options
@click.pass_context
def sessions_group(ctx: click.Context, /, db: str, **options: Any) -> None:
    """List sessions newest first (id, title, cwd, channel, entries, created), filtered
    by directory, project, channel, status and messages, paged with --offset and
    --limit; sub-agent
    sessions only with --sub-agents (or --sub-agents-of a parent). See also `show`."""
    ctx.ensure_object(dict)
    ctx.obj["db"] = db
    if ctx.invoked_subcommand is None:
        _list(db, **options)


@sessions_group.command("list")
@db_option(default=None)
@_list_options
@click.pass_context
def list_command(ctx: click.Context, /, db: str | None, **options: Any) -> None:
    """List sessions newest first (the default action of `sessions`)."""
    _list(db or ctx.obj["db"], **options)


def _list(
    db: str,
    *,
    search: str | None,
    limit: int,
    as_json: bool,
    offset: int,
    cwd: str | None,
    status: str | None,
    messages_only: bool,
    include_sub_agents: bool,
    parent: str | None,
    project_id: str | None,
    channel_type: str | None,
    channel_id: str | None,
) -> None:
    filters = Filters(
        search,
        cwd,
        status,
        messages_only,
        include_sub_agents,
        parent,
        project_id,
        channel_type,
        channel_id,
    )
    list_sessions(db, search, limit, as_json, offset=offset, filters=filters)


@sessions_group.command("show")
@click.argument("session_id")
@db_option(default=None)
@click.option(
    "--offset",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="Entries to skip first, in append order (lists them).",
)
@click.option(
    "--limit",
    type=click.IntRange(min=1),
    default=None,
    help="Most entries to print (lists them). Default: all.",
)
@click.option("--flat", is_flag=True, help="List the entries in append order, even a small tree.")
@click.pass_context
def show_command(
    ctx: click.Context,
    session_id: str,
    db: str | None,
    offset: int,
    limit: int | None,
    flat: bool,
) -> None:
    """Print session SESSION_ID: kind, short id and summary per entry, the leaf
    and labels marked. A session of at most 2,000 entries is drawn as a tree
    (entries off the current branch dimmed); a bigger one, or with --offset,
    --limit or --flat, is listed in append order, a page at a time, printing
    from the first page on (a progress bar on stderr when it is a terminal
    and stdout is not)."""
    show_session(db or ctx.obj["db"], session_id, offset=offset, limit=limit, flat=flat)


sessions_group.add_command(delete_command)
sessions_group.add_command(retain_command)
