"""``docs/seed-map.md`` against the seeds themselves (issue 18).

The map has one section per seed file of ``../shared/seeds`` and a row per
exported name the seed documents, saying which Python name implements it,
why it is left out, or which issue builds it. These tests read the seed files,
extract their exported names with :func:`exported_names`, and fail when

- a seed name has no row (every missing one is listed), or a row names
  something no seed declares, or a name has two rows;
- a row does not say how it is covered, or leaves a name out without a reason;
- a Python name the map claims (a backticked ``store.…`` or ``turnkeeper.…``
  path anywhere in a row) does not resolve on an open store or the package,

so the map cannot go stale in either direction. The seeds folder is
``../shared/seeds`` beside the checkout, or ``$TURNKEEPER_SEEDS``; without it
the tests that read the seeds skip (and fail under ``CI=true``), as the corpus
tests do.
"""

from __future__ import annotations

import importlib
import os
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

import turnkeeper

ROOT = Path(__file__).resolve().parents[2]

SEEDS_ENV = "TURNKEEPER_SEEDS"
"""Where the seed files are, when not ``../shared/seeds`` beside the checkout."""

SEEDS = Path(os.environ.get(SEEDS_ENV) or ROOT.parent / "shared" / "seeds")
"""The seed documents (Go package docs), read in place."""

MAP = ROOT / "docs" / "seed-map.md"

SEED_GLOB = "[0-9][0-9][0-9]_*.txt"
"""The seed files (``README.md`` beside them describes them and is no seed)."""

FLOORS = {"threadstore": 20, "session": 300, "sessionstore": 150}
"""The fewest exported names the parser may find in each seed (by the package
name on the seed's first line; 10 for a package not listed): the seeds hold
26, 354 and 173. Fewer means the parser broke on the seed's format."""

DEFAULT_FLOOR = 10


# --- the seeds' exported names ---------------------------------------------------

_FUNC = re.compile(r"^func (?:\((?:\w+ )?\*?(\w+)(?:\[[^\]]*\])?\) )?(\w+)")
"""``func Name(…``, ``func (r *T) Name(…``, and the page's headings ``func Name added in``."""
_TYPE = re.compile(r"^type (\w+)")
_BODY = re.compile(r"^type (\w+)(?:\[[^\]]*\])? (struct|interface) \{$")
"""A type whose body follows on the next lines, up to a ``}`` in column 0."""
_GROUP = re.compile(r"^(const|var|type) \($")
"""A grouped declaration, up to a ``)`` in column 0."""
_SINGLE = re.compile(r"^(const|var) (\w+)")
_MEMBER = re.compile(r"^\t(\w+)")
"""A name declared in a group (one tab in; comments and continuations are deeper or ``//``)."""
_INTERFACE_METHOD = re.compile(r"^\t(\w+)\(")
_SENTINEL = re.compile(r"\bErr[A-Z]\w*")
"""An error variable, also where only the prose names it (``Unwrap returns ErrBusy``)."""
_DECLARATION = re.compile(r"^(func|type|const|var) ")


@dataclass
class Declared:
    """What one seed file declares: exported name → kind, plus the lines that
    look like declarations but no rule understood (the parser's blind spots)."""

    package: str
    names: dict[str, str] = field(default_factory=dict)
    unparsed: list[str] = field(default_factory=list)

    def add(self, name: str, kind: str) -> None:
        if all(part[:1].isupper() for part in name.split(".")):
            self.names.setdefault(name, kind)


def exported_names(text: str) -> Declared:
    """Every exported Go identifier a seed documents, by kind: ``func``,
    ``method`` (``Type.Method``, interface methods included), ``type``,
    ``const``, ``var`` and ``sentinel`` (an ``Err…`` variable only the prose
    names). Struct fields are not names of the package and are left out."""
    lines = text.replace("\r\n", "\n").split("\n")
    found = Declared(package=next((x.strip() for x in lines if x.strip()), ""))
    block: tuple[str, str] | None = None  # (kind, owner type)
    for line in lines:
        if block is not None:
            kind, owner = block
            if line.startswith((")", "}")):
                block = None
            elif kind == "interface":
                if m := _INTERFACE_METHOD.match(line):
                    found.add(f"{owner}.{m[1]}", "method")
            elif kind != "struct" and (m := _MEMBER.match(line)):
                found.add(m[1], kind)
            continue
        if m := _GROUP.match(line):
            block = (m[1], "")
        elif m := _BODY.match(line):
            found.add(m[1], "type")
            block = (m[2], m[1])
        elif m := _FUNC.match(line):
            owner, name = m[1], m[2]
            found.add(f"{owner}.{name}" if owner else name, "method" if owner else "func")
        elif m := _TYPE.match(line):
            found.add(m[1], "type")
        elif m := _SINGLE.match(line):
            found.add(m[2], m[1])
        elif _DECLARATION.match(line):
            found.unparsed.append(line)
    for name in _SENTINEL.findall(text):
        found.add(name, "sentinel")
    return found


def seed_files(folder: Path) -> dict[str, str]:
    """The seed files of ``folder``: file name → text."""
    return {p.name: p.read_text(encoding="utf-8") for p in sorted(folder.glob(SEED_GLOB))}


@pytest.fixture(scope="module")
def seeds() -> dict[str, Declared]:
    """Each seed file's declared names. Without the seeds folder: skip, or fail
    under ``CI=true`` (CI must check the map against the real seeds)."""
    found = seed_files(SEEDS) if SEEDS.is_dir() else {}
    if not found:
        why = f"no seed files in {SEEDS} (set {SEEDS_ENV})"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI=true and {why}")
        pytest.skip(f"seed-map tests skipped: {why}")
    return {name: exported_names(text) for name, text in found.items()}


# --- the map -----------------------------------------------------------------------

_SECTION = re.compile(r"^## .*?`?(\d{3}_[0-9a-f]+\.txt)`?.*?\((\d+) names\)")
_PATH = r"(?:store|turnkeeper)(?:\.[A-Za-z]\w*)+"
_IMPLEMENTED = re.compile(rf"^`{_PATH}`(?:, `{_PATH}`)*$")
_PARTIAL = re.compile(rf"^`{_PATH}`(?:, `{_PATH}`)* \(partial; rest planned: issue (\d+)\)$")
_PLANNED = re.compile(r"^planned: issue (\d+)$")
_LEFT_OUT = "—"
_SUMMARY = re.compile(r"^\| `(\d{3}_[0-9a-f]+\.txt)` \| \w+ \|((?: \d+ \|){5})$")
STATUSES = ("implemented", "partial", "planned", "left out")
_CLAIMED = re.compile(rf"`({_PATH})`")
"""A Python name the map claims, anywhere in a row (which must therefore resolve)."""


@dataclass
class Row:
    seed: str
    name: str
    status: str  # implemented, partial, planned, left out
    cell: str
    notes: str
    line: int


@dataclass
class SeedMap:
    sections: dict[str, tuple[int, list[Row]]]  # seed file → (stated count, rows)
    problems: list[str]
    summary: dict[str, tuple[int, ...]] = field(default_factory=dict)
    """The summary table: seed file → (names, implemented, partial, planned, left out)."""


def status_of(cell: str) -> str | None:
    """How a row's turnkeeper cell covers its seed name, or ``None`` when it
    follows none of the forms the map's introduction states."""
    if cell == _LEFT_OUT:
        return "left out"
    if _PLANNED.match(cell):
        return "planned"
    if _PARTIAL.match(cell):
        return "partial"
    if _IMPLEMENTED.match(cell):
        return "implemented"
    return None


def parse_map(text: str) -> SeedMap:
    """The map's sections and rows, and what is malformed in it."""
    parsed = SeedMap({}, [])
    seed: str | None = None
    for number, line in enumerate(text.split("\n"), start=1):
        if line.startswith("## "):
            m = _SECTION.match(line)
            seed = m[1] if m else None
            if m:
                if seed in parsed.sections:
                    parsed.problems.append(f"line {number}: a second section for {seed}")
                parsed.sections[m[1]] = (int(m[2]), [])
            continue
        if (m := _SUMMARY.match(line)) is not None:
            parsed.summary[m[1]] = tuple(int(n) for n in m[2].strip(" |").split(" | "))
            continue
        if seed is None or not line.startswith("|"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells[0] in ("seed name", "") or set(cells[0]) <= {"-", ":"}:
            continue  # the table's header and its rule
        if len(cells) != 3:
            parsed.problems.append(f"line {number}: {len(cells)} cells, not 3: {line}")
            continue
        name, cell, notes = cells
        if not re.fullmatch(r"`[A-Z]\w*(?:\.[A-Z]\w*)?`", name):
            parsed.problems.append(f"line {number}: the seed name is not one `Name`: {name}")
            continue
        status = status_of(cell)
        if status is None:
            parsed.problems.append(
                f"line {number}: `{name}`: the turnkeeper cell {cell!r} is none of: "
                "backticked Python names, '… (partial; rest planned: issue N)', "
                "'planned: issue N', '—'"
            )
            continue
        if status == "left out" and not notes:
            parsed.problems.append(f"line {number}: {name} is left out without a reason")
        parsed.sections[seed][1].append(Row(seed, name.strip("`"), status, cell, notes, number))
    return parsed


def map_problems(seed_map: SeedMap, declared: dict[str, Declared]) -> list[str]:
    """Every disagreement between the map and the seeds' declared names."""
    problems = list(seed_map.problems)
    for seed in sorted(set(declared) - set(seed_map.sections)):
        problems.append(f"{seed}: no section in the map")
    for seed, (stated, rows) in sorted(seed_map.sections.items()):
        if seed not in declared:
            problems.append(f"{seed}: a section for a file that is no seed")
            continue
        names = declared[seed].names
        if stated != len(names):
            problems.append(f"{seed}: the heading says {stated} names, the seed has {len(names)}")
        counts = Counter(row.status for row in rows)
        summed = (len(rows), *(counts[status] for status in STATUSES))
        if seed_map.summary.get(seed) != summed:
            problems.append(
                f"{seed}: the summary says {seed_map.summary.get(seed)} (names, "
                f"{', '.join(STATUSES)}), the rows make {summed}"
            )
        mapped = Counter(row.name for row in rows)
        problems += [f"{seed}: {n} has {k} rows" for n, k in sorted(mapped.items()) if k > 1]
        problems += [
            f"{seed}: {n} ({names[n]}) is missing from the map"
            for n in sorted(set(names) - set(mapped))
        ]
        problems += [
            f"{seed}: line {row.line}: {row.name} is not a name the seed declares"
            for row in rows
            if row.name not in names
        ]
    return problems


def claimed_names(seed_map: SeedMap) -> Iterator[tuple[Row, str]]:
    """Each Python name a row claims, with its row."""
    for _, rows in seed_map.sections.values():
        for row in rows:
            for path in _CLAIMED.findall(f"{row.cell} {row.notes}"):
                yield row, path


def resolves(path: str, store: object) -> bool:
    """Whether ``path`` names something: ``store.area.method`` (or a store-level
    name) on an open store, ``turnkeeper.X.Y`` in the package (the longest
    importable module prefix, then attributes). Private segments never count."""
    parts = path.split(".")
    if any(part.startswith("_") for part in parts):
        return False
    obj: object
    if parts[0] == "store":
        obj, rest = store, parts[1:]
    else:
        for end in range(len(parts), 0, -1):
            try:
                obj = importlib.import_module(".".join(parts[:end]))
            except ModuleNotFoundError:
                continue
            rest = parts[end:]
            break
        else:
            return False
    for part in rest:
        if not hasattr(obj, part):
            return False
        obj = getattr(obj, part)
    return True


def unresolved(seed_map: SeedMap) -> list[str]:
    """The claimed Python names that do not resolve, with where they are claimed."""
    with turnkeeper.open_store(":memory:") as store:
        return [
            f"{row.seed}: line {row.line}: {row.name}: `{path}` does not resolve"
            for row, path in claimed_names(seed_map)
            if not resolves(path, store)
        ]


@pytest.fixture(scope="module")
def seed_map() -> SeedMap:
    return parse_map(MAP.read_text(encoding="utf-8"))


# --- the tests ------------------------------------------------------------------------


def test_the_parser_finds_plausibly_many_names(seeds: dict[str, Declared]) -> None:
    """The parser understands every declaration line of every seed and finds at
    least its floor of names (a parser broken by a format change finds few).
    The counts are printed (``pytest -s``) for a reader to check by eye."""
    for seed, found in seeds.items():
        kinds = Counter(found.names.values())
        print(
            f"{seed} ({found.package}): {len(found.names)} exported names: "
            + ", ".join(f"{k} {kind}" for kind, k in sorted(kinds.items()))
        )
        floor = FLOORS.get(found.package, DEFAULT_FLOOR)
        assert len(found.names) >= floor, f"{seed}: only {len(found.names)} names (floor {floor})"
        assert kinds["type"] and kinds["func"] + kinds["method"], f"{seed}: {dict(kinds)}"
        assert not found.unparsed, f"{seed}: declaration lines not understood: {found.unparsed}"


def test_the_map_names_every_seed_name_and_only_those(
    seed_map: SeedMap, seeds: dict[str, Declared]
) -> None:
    problems = map_problems(seed_map, seeds)
    assert not problems, f"{len(problems)} problems:\n" + "\n".join(problems)


def test_every_row_says_how_its_name_is_covered(seed_map: SeedMap) -> None:
    """Needs no seeds: each row follows one of the stated forms, and the map
    has rows at all."""
    assert seed_map.sections, f"{MAP} has no seed sections"
    assert all(rows for _, rows in seed_map.sections.values())
    assert not seed_map.problems, "\n".join(seed_map.problems)


def test_every_claimed_python_name_resolves(seed_map: SeedMap) -> None:
    """Needs no seeds: every ``store.…``/``turnkeeper.…`` name in the map exists."""
    claimed = list(claimed_names(seed_map))
    assert len(claimed) > 100, "implausibly few Python names claimed: is the map parsed?"
    problems = unresolved(seed_map)
    assert not problems, "\n".join(problems)


# --- the checks can fail ---------------------------------------------------------------

SAMPLE = """\
sample

const CurrentVersion = 3

var (
\tErrOne = errors.New("one")
\tErrTwo = errors.New(
\t\t"two")
)

var ErrThree = errors.New("three")

const (
\t// ModeA is a.
\tModeA Mode = "a"
\tmodeHidden Mode = "h"
)

type Thing struct {
\tField string
\tNested struct {
\t\tInner int
\t}
}

Thing does things. Unwrap returns ErrFour.

func (t *Thing) Do(x int) error

func (*Thing) Undo added in v1.2.3

type Doer interface {
\t// Run runs.
\tRun(ctx context.Context) error
}

type Mode string

func New() *Thing
func helper()
"""


def test_the_parser_reads_each_form() -> None:
    found = exported_names(SAMPLE)
    assert found.package == "sample"
    assert found.names == {
        "CurrentVersion": "const",
        "ErrOne": "var",
        "ErrTwo": "var",
        "ErrThree": "var",
        "ModeA": "const",
        "Thing": "type",
        "Thing.Do": "method",
        "Thing.Undo": "method",
        "Doer": "type",
        "Doer.Run": "method",
        "Mode": "type",
        "New": "func",
        "ErrFour": "sentinel",
    }
    assert not found.unparsed
    assert exported_names("x\nfunc\nvar = 1\n").unparsed == ["var = 1"]


def _sample_map(rows: str, counts: str = "2 | 1 | 0 | 0 | 1") -> str:
    summary = f"| `001_00ff.txt` | sample | {counts} |\n"
    head = "| seed name | turnkeeper | notes |\n| --- | --- | --- |\n"
    return f"# map\n\n{summary}\n## `001_00ff.txt` — sample (2 names)\n\n{head}{rows}"


def test_the_checks_fail_on_a_broken_map() -> None:
    """Each check reports what it is for, on a map broken on purpose (and the
    real map with one row deleted reports exactly that name missing)."""
    declared = {"001_00ff.txt": Declared("sample", {"New": "func", "Thing": "type"})}
    good = "| `New` | `store.sessions.create` | |\n| `Thing` | — | a reason |\n"
    assert map_problems(parse_map(_sample_map(good)), declared) == []

    missing = map_problems(parse_map(_sample_map(good.split("\n", 1)[1])), declared)
    assert any("New (func) is missing" in p for p in missing), missing
    extra = map_problems(
        parse_map(_sample_map(good + "| `Old` | planned: issue 18 | |\n")), declared
    )
    assert any("Old is not a name the seed declares" in p for p in extra), extra
    twice = map_problems(
        parse_map(_sample_map(good + "| `New` | planned: issue 18 | |\n")), declared
    )
    assert any("New has 2 rows" in p for p in twice), twice
    no_reason = parse_map(_sample_map(good.replace("a reason", "")))
    assert any("left out without a reason" in p for p in no_reason.problems)
    vague = parse_map(_sample_map(good.replace("`store.sessions.create`", "sessions.create")))
    assert any("is none of" in p for p in vague.problems)
    miscounted = map_problems(parse_map(_sample_map(good, "2 | 2 | 0 | 0 | 0")), declared)
    assert any("the summary says (2, 2, 0, 0, 0)" in p for p in miscounted), miscounted
    other = {"001_00ff.txt": declared["001_00ff.txt"], "002_00ff.txt": Declared("x")}
    assert "002_00ff.txt: no section in the map" in map_problems(
        parse_map(_sample_map(good)), other
    )

    bogus = parse_map(_sample_map(good.replace("store.sessions.create", "store.sessions.creat")))
    assert unresolved(bogus) and not unresolved(parse_map(_sample_map(good)))
    with turnkeeper.open_store(":memory:") as store:
        assert resolves("turnkeeper.spec.run.TERMINAL", store)
        assert resolves("store.path", store)
        assert not resolves("turnkeeper.spec.run.TERMINUS", store)
        assert not resolves("turnkeeper.nowhere.Thing", store)
        assert not resolves("store.sessions._area", store)


def test_deleting_a_row_of_the_real_map_is_caught(seeds: dict[str, Declared]) -> None:
    text = MAP.read_text(encoding="utf-8")
    row = next(line for line in text.split("\n") if line.startswith("| `AcquireFork` |"))
    problems = map_problems(parse_map(text.replace(row + "\n", "")), seeds)
    assert [p for p in problems if "missing" in p] == [
        "001_cea11511c48eedc2.txt: AcquireFork (func) is missing from the map"
    ]
