"""Generates ``api/aio/areas.py``: one class per area of ``storage/protocol.py``
whose methods are the area's, as ``async def``, each running the sync method
through the async store's runner (``api/aio/runner.py``).

The facade holds no domain logic, so it is written by this script from the
protocol rather than by hand: a method added to an area's protocol gets its
async twin from one command, and ``model_tests/adapters/test_aio.py`` fails while the
file is stale.

    .venv/bin/python model_tests/aio_facade.py          # rewrite api/aio/areas.py
    .venv/bin/python model_tests/aio_facade.py --check  # exit 1 if it is stale

Methods whose result is not a plain value (a writer to drive, an iterator to
page, another ledger view) are written by hand in ``api/aio/ledger.py``;
``HAND_WRITTEN`` names them, and the test checks every protocol method is
covered by one or the other.
"""

from __future__ import annotations

import ast
import enum
import inspect
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PROTOCOL = ROOT / "storage" / "protocol.py"
TARGET = ROOT / "api" / "aio" / "areas.py"

HAND_WRITTEN = {
    "LedgerAPI": {"with_tenant", "with_blobs", "open", "replay", "command_log"},
}
"""Methods of an area written by hand in ``api/aio/ledger.py`` (their results
are views, writers or iterators, not values)."""

AREA_ATTRIBUTES = {"LedgerAPI": ["tenant", "blobs", "offload_threshold", "max_body_bytes"]}
"""Plain attributes of an area's protocol, read through from the sync area."""

STORE_AREAS = "Store"
"""The protocol whose properties name the areas (``store.sessions`` …)."""


def _areas(tree: ast.Module) -> dict[str, str]:
    """Area attribute name → its protocol class, from ``Store``'s properties."""
    store = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == STORE_AREAS)
    areas: dict[str, str] = {}
    for node in store.body:
        if (
            isinstance(node, ast.FunctionDef)
            and any(isinstance(d, ast.Name) and d.id == "property" for d in node.decorator_list)
            and isinstance(node.returns, ast.Name)
            and node.returns.id.endswith("API")
        ):
            areas[node.name] = node.returns.id
    return areas


def _impl_defaults(store: Any, area: str) -> dict[str, inspect.Signature]:
    impl = type(getattr(store, area))
    return {
        name: inspect.signature(fn)
        for name, fn in inspect.getmembers(impl, inspect.isfunction)
        if not name.startswith("_")
    }


def _literal(value: object, where: str) -> str:
    if isinstance(value, enum.Enum) and isinstance(value.value, str):
        return repr(value.value)  # a StrEnum default, where the protocol takes ``str``
    if value is None or isinstance(value, bool | int | float | str):
        return repr(value)
    raise SystemExit(f"{where}: default {value!r} is not a literal; give it in the protocol")


def _method(fn: ast.FunctionDef, impl: inspect.Signature, proto: str, area: str) -> list[str]:
    args = fn.args
    if args.vararg is not None or args.kwarg is not None:
        raise SystemExit(f"{proto}.{fn.name}: *args/**kwargs are not generated")
    positional = args.posonlyargs + args.args
    defaults: list[ast.expr | None] = [None] * (len(positional) - len(args.defaults)) + list(
        args.defaults
    )
    params: list[str] = []
    call: list[str] = []
    for i, (arg, default) in enumerate(zip(positional, defaults, strict=True)):
        if i == 0:
            params.append("self")
            continue
        params.append(_param(arg, default, impl, f"{proto}.{fn.name}"))
        call.append(arg.arg)
        if args.posonlyargs and i == len(args.posonlyargs) - 1:
            params.append("/")
    if args.kwonlyargs:
        params.append("*")
        for arg, kw_default in zip(args.kwonlyargs, args.kw_defaults, strict=True):
            params.append(_param(arg, kw_default, impl, f"{proto}.{fn.name}"))
            call.append(f"{arg.arg}={arg.arg}")
    returns = ast.unparse(fn.returns) if fn.returns is not None else "None"
    head = f"    async def {fn.name}({', '.join(params)}) -> {returns}:"
    if len(head) > 100:
        head = "    async def " + fn.name + "(\n" + "".join(f"        {p},\n" for p in params)
        head += f"    ) -> {returns}:"
    doc = f'        """The sync ``{area}.{fn.name}``, awaited (same arguments and errors)."""'
    body = f"        return await self._run(self.sync.{fn.name}{''.join(', ' + c for c in call)})"
    if len(body) > 100:
        body = (
            f"        return await self._run(\n            self.sync.{fn.name},\n"
            + "".join(f"            {c},\n" for c in call)
            + "        )"
        )
    return [head, doc, body, ""]


def _param(arg: ast.arg, default: ast.expr | None, impl: inspect.Signature, where: str) -> str:
    annotation = f": {ast.unparse(arg.annotation)}" if arg.annotation is not None else ""
    if default is None:
        return f"{arg.arg}{annotation}"
    if isinstance(default, ast.Constant) and default.value is Ellipsis:
        value = impl.parameters[arg.arg].default
        if value is inspect.Parameter.empty:
            raise SystemExit(f"{where}: {arg.arg} has a default in the protocol only")
        text = _literal(value, f"{where}({arg.arg})")
    else:
        text = ast.unparse(default)
    return f"{arg.arg}{annotation} = {text}"


def _imports(tree: ast.Module, used: set[str]) -> list[str]:
    lines: list[str] = []
    for node in tree.body:
        if not isinstance(node, ast.ImportFrom) or node.module == "__future__":
            continue
        names = sorted(a.name for a in node.names if a.name in used)
        if not names:
            continue
        module = node.module or ""
        if node.level:  # protocol.py is turnkeeper.storage.protocol
            module = f"turnkeeper.storage.{module}" if module else "turnkeeper.storage"
        if len(names) == 1:
            lines.append(f"from {module} import {names[0]}")
        else:
            lines.append(f"from {module} import (\n" + "".join(f"    {n},\n" for n in names) + ")")
    return lines


def generate() -> str:
    import turnkeeper

    tree = ast.parse(PROTOCOL.read_text())
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    areas = _areas(tree)
    out: list[str] = []
    used: set[str] = set()
    with turnkeeper.open_store(":memory:") as store:
        for area, proto in sorted(areas.items()):
            node = classes[proto]
            impl = _impl_defaults(store, area)
            twin = "Async" + proto.removesuffix("API")
            out += [
                "",
                "",
                f"class {twin}{'Base' if proto in HAND_WRITTEN else ''}:",
                f'    """``store.{area}`` with ``async def`` methods (:class:`{proto}`)."""',
                "",
                f"    def __init__(self, area: {proto}, run: Call) -> None:",
                "        self.sync = area",
                f'        """The sync ``store.{area}`` this one awaits."""',
                "        self._run = run",
                "",
            ]
            used.add(proto)
            for attr in AREA_ATTRIBUTES.get(proto, []):
                ann = next(
                    ast.unparse(s.annotation)
                    for s in node.body
                    if isinstance(s, ast.AnnAssign)
                    and isinstance(s.target, ast.Name)
                    and s.target.id == attr
                )
                used |= {n.id for n in ast.walk(ast.parse(ann)) if isinstance(n, ast.Name)}
                out += [
                    "    @property",
                    f"    def {attr}(self) -> {ann}:",
                    f'        """``store.{area}.{attr}``."""',
                    f"        return self.sync.{attr}",
                    "",
                ]
            for fn in node.body:
                if not isinstance(fn, ast.FunctionDef) or fn.name.startswith("_"):
                    continue
                if fn.name in HAND_WRITTEN.get(proto, set()):
                    continue
                out += _method(fn, impl[fn.name], proto, area)
                defaults = [*fn.args.defaults, *fn.args.kw_defaults]
                for part in [fn.returns, *[a.annotation for a in _all_args(fn)], *defaults]:
                    if part is not None:
                        used |= {n.id for n in ast.walk(part) if isinstance(n, ast.Name)}
            while out[-1] == "":
                out.pop()
    header = [
        '"""The areas of the async store (generated: ``model_tests/aio_facade.py`` writes',
        "this file from ``storage/protocol.py``; do not edit it by hand).",
        "",
        "Each class is one area of :class:`~turnkeeper.aio.AsyncStore`; each method awaits",
        "the sync area's method of the same name through the store's runner, which runs",
        "it on a worker thread (see :mod:`turnkeeper.aio.runner`): same arguments, same",
        "result, same errors, one domain layer.",
        '"""',
        "",
        "from __future__ import annotations",
        "",
        "from collections.abc import Mapping, Sequence",
        "from datetime import datetime",
        "from typing import Any",
        "",
        *_imports(tree, used),
        "",
        "from turnkeeper.storage.protocol import (",
        *[f"    {p}," for p in sorted(set(areas.values()))],
        ")",
        "",
        "from .runner import Call",
    ]
    return _formatted("\n".join(header + out) + "\n")


def _formatted(text: str) -> str:
    """``text`` as ruff leaves it (imports sorted, then formatted), so that the
    file passes ``ruff check`` and ``ruff format --check`` as written."""
    ruff = Path(sys.executable).with_name("ruff")
    name = ["--stdin-filename", str(TARGET)]
    for args in (["check", "--fix", "--select", "I,F401", *name, "-"], ["format", *name, "-"]):
        done = subprocess.run(
            [str(ruff), *args], input=text, capture_output=True, text=True, check=False
        )
        if done.returncode not in (0, 1) or not done.stdout:
            raise SystemExit(f"ruff {args[0]} failed: {done.stderr}")
        text = done.stdout
    return text


def _all_args(fn: ast.FunctionDef) -> list[ast.arg]:
    a = fn.args
    return a.posonlyargs + a.args + a.kwonlyargs


def main() -> int:
    text = generate()
    if "--check" in sys.argv[1:]:
        if TARGET.read_text() != text:
            print(f"{TARGET} is stale: run {Path(__file__).name}", file=sys.stderr)
            return 1
        return 0
    TARGET.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
