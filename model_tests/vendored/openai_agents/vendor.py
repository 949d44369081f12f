"""Writes this folder's vendored files from an unpacked openai-agents sdist (our own
tool, not vendored): ``python vendor.py SDIST_DIR`` writes test_sdk_session.py and
test_sdk_session_limit.py; ``python vendor.py SDIST_DIR more EXCLUDED_V EXCLUDED_C``
writes the helpers and the two compaction test files. The only change to a test is
``SQLiteSession(`` → ``make_session(`` and the ``session_backend`` fixture mark."""

import ast, re, sys
from pathlib import Path

SRC = sys.argv.pop(1)
OUT = str(Path(__file__).resolve().parent)
LICENSE_HDR = '''# Vendored from the OpenAI Agents SDK, openai-agents {ver} (its PyPI sdist,
# openai_agents-{ver}/{path}; github.com/openai/openai-agents-python).
# Copyright (c) 2025 OpenAI. MIT License: permission is hereby granted, free of charge, to
# any person obtaining a copy of this software and associated documentation files (the
# "Software"), to deal in the Software without restriction, including without limitation the
# rights to use, copy, modify, merge, publish, distribute, sublicense, and/or sell copies of
# the Software, and to permit persons to whom the Software is furnished to do so, subject to
# the following conditions: The above copyright notice and this permission notice shall be
# included in all copies or substantial portions of the Software. THE SOFTWARE IS PROVIDED
# "AS IS", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR IMPLIED, INCLUDING BUT NOT LIMITED TO THE
# WARRANTIES OF MERCHANTABILITY, FITNESS FOR A PARTICULAR PURPOSE AND NONINFRINGEMENT. IN NO
# EVENT SHALL THE AUTHORS OR COPYRIGHT HOLDERS BE LIABLE FOR ANY CLAIM, DAMAGES OR OTHER
# LIABILITY, WHETHER IN AN ACTION OF CONTRACT, TORT OR OTHERWISE, ARISING FROM, OUT OF OR IN
# CONNECTION WITH THE SOFTWARE OR THE USE OR OTHER DEALINGS IN THE SOFTWARE.
#
# Adapted for turnkeeper, in the construction of the session only: each
# ``SQLiteSession(...)`` call is ``make_session(...)``, which the ``session_backend``
# fixture (sdk_session_factory.py) parametrizes over the SDK's SQLiteSession (the
# control) and turnkeeper's TurnkeeperSession on DuckDB and on PostgreSQL; the imports
# of the SDK repository's ``tests`` package name the vendored modules. {extra}
# ruff: noqa
'''

def vendor(path, out, keep, extra, import_map):
    text = open(f"{SRC}/{path}").read()
    tree = ast.parse(text)
    lines = text.splitlines(keepends=True)
    body_start = min(n.lineno for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)))
    # header: module docstring + imports (everything before the first def), minus decorators
    first = [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))][0]
    first_line = min([first.lineno] + [d.lineno for d in first.decorator_list])
    head = "".join(lines[: first_line - 1])
    for a, b in import_map:
        head = head.replace(a, b)
    chunks = []
    for n in tree.body:
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name in keep:
            start = min([n.lineno] + [d.lineno for d in n.decorator_list])
            chunks.append("".join(lines[start - 1 : n.end_lineno]))
    missing = set(keep) - {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    assert not missing, missing
    body = "\n\n".join(chunks)
    body = re.sub(r"\bSQLiteSession\(", "make_session(", body)
    hdr = LICENSE_HDR.format(ver="0.24.0", path=path, extra=extra)
    usefix = "\nfrom sdk_session_factory import make_session, session_backend\n\npytestmark = pytest.mark.usefixtures(\"session_backend\")\n\n\n"
    open(f"{OUT}/{out}", "w").write(hdr + head.rstrip() + "\n" + usefix + body + "\n")

S_KEEP = """_run_sync_wrapper run_agent_async
test_session_memory_basic_functionality_parametrized
test_session_memory_with_explicit_instance_parametrized
test_session_memory_different_sessions_parametrized
test_sqlite_session_memory_direct
test_sqlite_session_memory_pop_item
test_session_memory_pop_different_sessions
test_sqlite_session_get_items_with_limit
test_session_memory_appends_list_input_by_default
test_session_callback_prepared_input
test_session_callback_repeating_history_does_not_grow_session
test_sqlite_session_unicode_content
test_sqlite_session_special_characters_and_sql_injection
test_sqlite_session_concurrent_access
test_session_add_items_exception_propagates_in_streamed
test_session_settings_default
test_session_settings_constructor
test_session_settings_constructor_normalizes_dictionary
test_session_settings_rejects_unknown_dictionary_fields
test_get_items_uses_session_settings_limit
test_get_items_explicit_limit_overrides_session_settings
test_session_settings_resolve
test_runner_with_session_settings_override""".split()
if len(sys.argv) == 1: vendor("tests/memory/test_session.py", "test_sdk_session.py", S_KEEP,
  "Left out: the tests of SQLiteSession's own internals (its connections, worker threads, file locks, rows written with raw SQL, its rollback and close paths) and of the SDK's _await_mutation helper, which construct no Session or reach past it.",
  [("from tests.test_responses import get_text_message", "from sdk_test_responses import get_text_message")])
L_KEEP = """test_session_limit_parameter test_session_limit_drops_unmatched_history_function_call_output
test_session_limit_zero test_session_limit_none_gets_all_history test_session_limit_larger_than_history""".split()
if len(sys.argv) == 1: vendor("tests/memory/test_session_limit.py", "test_sdk_session_limit.py", L_KEEP, "Nothing left out.",
  [("from tests.memory.test_session import run_agent_async", "from test_sdk_session import run_agent_async"),
   ("from tests.test_responses import get_text_message", "from sdk_test_responses import get_text_message")])

def vendor_all(path, out, exclude, extra, import_map, substitute=True, only_constructing=False):
    text = open(f"{SRC}/{path}").read()
    tree = ast.parse(text)
    if only_constructing:
        tlines = text.splitlines(keepends=True)
        exclude = list(exclude) + [
            n.name for n in ast.walk(tree)
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name.startswith("test_")
            and "SQLiteSession(" not in "".join(tlines[n.lineno - 1 : n.end_lineno])
            and n.name not in exclude
        ]
    names = []
    for n in tree.body:
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.append(n.name)
    lines = text.splitlines(keepends=True)
    # drop excluded top-level defs and methods of classes
    drop = []
    for n in ast.walk(tree):
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name in exclude:
            start = min([n.lineno] + [d.lineno for d in n.decorator_list])
            drop.append((start, n.end_lineno))
    found = set()
    for n in ast.walk(tree):
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name in exclude:
            found.add(n.name)
    assert found == set(exclude), set(exclude) - found
    dropped_tests = sorted(set(exclude))
    ex = set(exclude)
    for n in tree.body:
        if isinstance(n, ast.ClassDef):
            fns = [m for m in n.body if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))]
            tests = [m for m in fns if m.name.startswith("test_")]
            if tests and all(m.name in ex for m in tests):
                start = min([n.lineno] + [d.lineno for d in n.decorator_list])
                drop.append((start, n.end_lineno))
    keep = [True] * len(lines)
    for a, b in drop:
        for i in range(a - 1, b):
            keep[i] = False
    body = "".join(l for l, k in zip(lines, keep) if k)
    for a, b in import_map:
        assert a in body, a
        body = body.replace(a, b)
    if substitute:
        body = re.sub(r"(?<![\w.])SQLiteSession\(", "make_session(", body)
        # after the last top-level import: the factory
        idx = [n for n in ast.parse(body).body if isinstance(n, (ast.Import, ast.ImportFrom))][-1].end_lineno
        bl = body.splitlines(keepends=True)
        had = "\npytestmark = " in body
        use = "pytest.mark.usefixtures(\"session_backend\")"
        bl.insert(idx, "\nfrom sdk_session_factory import make_session, session_backend\n" + ("" if had else f"\npytestmark = {use}\n"))
        body = "".join(bl)
        if had:
            body += f"\n\n# turnkeeper: each test once per session backend (sdk_session_factory.py).\npytestmark = [pytestmark, {use}]\n"
    hdr = LICENSE_HDR.format(ver="0.24.0", path=path, extra=extra)
    if not substitute:
        hdr = re.sub(r"# Adapted for turnkeeper.*", "# A helper of the SDK's tests, unchanged. ", hdr, flags=re.S) + "\n"
    open(f"{OUT}/{out}", "w").write(hdr + body)

if len(sys.argv) > 1 and sys.argv[1] == "more":
    vendor_all("tests/test_responses.py", "sdk_test_responses.py", [], "", [], substitute=False)
    vendor_all("tests/model_test_helpers.py", "sdk_model_test_helpers.py", [], "", [], substitute=False)
    vendor_all("tests/utils/simple_session.py", "sdk_simple_session.py", [], "", [], substitute=False)
    HELP = [("from tests.model_test_helpers import", "from sdk_model_test_helpers import"),
            ("from tests.test_responses import", "from sdk_test_responses import"),
            ("from tests.utils.simple_session import", "from sdk_simple_session import")]
    EXC_V = [a for a in sys.argv[2].split(",") if a]
    EXC_C = [a for a in sys.argv[3].split(",") if a]
    WHY_V = ("Kept: the tests that construct a SQLiteSession (the others test the compaction "
             "session over the SDK's SimpleListSession, whatever the store). Left out: " + ", ".join(EXC_V) +
             " (they expect a compaction to delete expired encrypted rows through SQLiteSession's "
             "prune_prefix; TurnkeeperSession keeps them, and EncryptedSession skips them on read).")
    WHY_C = ("Kept: the tests that construct a SQLiteSession. Left out: " + ", ".join(EXC_C) +
             " (they patch SQLiteSession's own connection internals).")
    vendor_all("tests/memory/test_compaction_model_visibility.py", "test_sdk_compaction_model_visibility.py", EXC_V,
        WHY_V, HELP, only_constructing=True)
    vendor_all("tests/memory/test_openai_responses_compaction_session.py", "test_sdk_responses_compaction_session.py", EXC_C,
        WHY_C, HELP, only_constructing=True)
