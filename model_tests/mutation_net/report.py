"""``reports/MUTATION_NET.json`` and ``reports/MUTATION_NET.md``: what the second net ran and found.

The JSON keeps, per module, the last run's figures (a run of some modules
replaces theirs and keeps the others'), and every survivor with its
classification from :data:`survivors.SURVIVORS`; the Markdown is made from it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict
from datetime import UTC, datetime
from importlib.metadata import version
from pathlib import Path
from typing import Any

from mutation_net.areas import AREAS, OPERATORS, Area, judging_tests
from mutation_net.run import Mutation
from mutation_net.survivors import SURVIVORS, Site

REPORTS = Path(__file__).resolve().parents[2] / "reports"
JSON_PATH = REPORTS / "MUTATION_NET.json"
MD_PATH = REPORTS / "MUTATION_NET.md"
VERDICTS = ("killed", "survived", "timeout", "incompetent")


def classification(m: dict[str, Any]) -> dict[str, Any] | None:
    """The survivor ``m``'s entry in :data:`SURVIVORS` (as a dict), or None."""
    got = SURVIVORS.get(Site(m["file"], m["operator"], m["source"]))
    return None if got is None else asdict(got)


def load(path: Path = JSON_PATH) -> dict[str, Any]:
    """The report so far (an empty one when there is none)."""
    if path.is_file():
        data: dict[str, Any] = json.loads(path.read_text())
        return data
    return {"modules": {}, "survivors": []}


def merge(
    data: dict[str, Any], area: Area, modules: Sequence[str], found: Sequence[Mutation],
    seconds: float, timeout_s: float,
) -> dict[str, Any]:  # fmt: skip
    """``data`` with ``modules``' figures and survivors replaced by this run's."""
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    for module in modules:
        mine = [m for m in found if m.file == module]
        counts = {v: sum(1 for m in mine if m.verdict == v) for v in VERDICTS}
        data["modules"][module] = {
            "area": area.name, "tests": list(judging_tests(area)), "run_at": when,
            "area_seconds": round(seconds, 1), "mutants": len(mine), **counts,
        }  # fmt: skip
    data["survivors"] = [s for s in data["survivors"] if s["file"] not in modules] + [
        asdict(m) for m in found if m.verdict == "survived"
    ]
    data["timeout_s"] = timeout_s
    return data


def finish(data: dict[str, Any]) -> dict[str, Any]:
    """``data`` with the tool, operators, modules not run and every survivor's
    classification filled in afresh."""
    everything = [m for a in AREAS for m in a.modules]
    data["tool"] = "cosmic-ray"
    data["version"] = version("cosmic-ray")
    data["operators"] = list(OPERATORS)
    data["modules"] = {m: data["modules"][m] for m in everything if m in data["modules"]}
    data["not_run"] = [m for m in everything if m not in data["modules"]]
    data["survivors"] = sorted(
        ({**s, "classification": classification(s)} for s in data["survivors"]),
        key=lambda s: (s["file"], s["line"], s["col"], s["operator"]),
    )
    totals = {k: sum(v[k] for v in data["modules"].values()) for k in ("mutants", *VERDICTS)}
    data["totals"] = totals
    data["unclassified"] = sum(1 for s in data["survivors"] if s["classification"] is None)
    return data


def markdown(data: dict[str, Any]) -> str:
    """The Markdown report of ``data`` (as :func:`finish` left it)."""
    t = data["totals"]
    out = [
        "# The second mutation net (cosmic-ray)",
        "",
        f"Made by `make mutation-net` (`model_tests/mutation_net/`): {data['tool']} "
        f"{data['version']} over a temporary copy of the installed package, each area's "
        "mutants judged by its fixed tests (DuckDB only, `-x`), "
        f"{data.get('timeout_s', 0):.0f} s per mutant at most. Survivors are classified in "
        "`model_tests/mutation_net/survivors.py`; the SQL fences are the fence-mutant "
        "catalog's (`make mutants`).",
        "",
        f"Mutants run: {t['mutants']}; killed {t['killed']}, survived {t['survived']}, "
        f"timed out {t['timeout']}, incompetent {t['incompetent']}; survivors unclassified: "
        f"{data['unclassified']}.",
        "",
        "Operators: " + ", ".join(f"`{o.removeprefix('core/')}`" for o in data["operators"]),
        "",
        "## Modules",
        "",
        "| module | area | run at | mutants | killed | survived | timeout | incompetent |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, m in data["modules"].items():
        out.append(
            f"| `{name}` | {m['area']} | {m['run_at']} | {m['mutants']} | {m['killed']} | "
            f"{m['survived']} | {m['timeout']} | {m['incompetent']} |"
        )
    out += ["", "Not run yet (`make mutation-net AREAS=...`): "
            + (", ".join(f"`{m}`" for m in data["not_run"]) or "none"), ""]  # fmt: skip
    out += ["## Survivors", ""]
    if not data["survivors"]:
        out.append("None.")
    for s in data["survivors"]:
        c = s["classification"]
        verdict = "UNCLASSIFIED" if c is None else c["kind"]
        out += [
            f"### `{s['file']}:{s['line']}` {s['operator'].removeprefix('core/')}: {verdict}",
            "",
        ]
        if c is not None:
            out.append(c["why"])
            if c["tests"]:
                out.append("Killed by: " + ", ".join(f"`{x}`" for x in c["tests"]))
            if c["catalog"]:
                out.append(f"Catalog entry: `{c['catalog']}`")
            out.append("")
        out += ["```diff", s["diff"].rstrip(), "```", ""]
    return "\n".join(out).rstrip() + "\n"


def write(data: dict[str, Any]) -> None:
    """Write both report files from ``data`` (as :func:`finish` left it)."""
    JSON_PATH.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    MD_PATH.write_text(markdown(data))
