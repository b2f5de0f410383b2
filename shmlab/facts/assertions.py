"""What asserts a claim: notebooks' hidden test cells and tests marked ``@pytest.mark.claim``.

Mirrors: nothing in torch; the project's fact base.

A hidden test cell (a code cell tagged ``hidden-test``, its source hidden) names its claims on
its first line and, if it runs its experiment under several start methods itself, says so on its
second::

    # claim C12.1, C25.3
    # under: fork, spawn, forkserver

It covers the start methods its notebook is run under by tests/notebooks/test_claims.py (every
notebook under the default, fork; SPAWN_NOTEBOOKS under spawn too) plus its ``under`` line, on
the suite's Python.

A test names its claims with a marker, found here by reading tests/**/*.py (nothing is imported)::

    @pytest.mark.claim("C25.3", start_methods=("fork", "spawn"), pythons="all")

start_methods defaults to () (start-method independent); pythons to "suite". Only a test in
tests/pythons (which runs its check on every installed Python) may say pythons="all".
"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass
from pathlib import Path

from shmlab.facts.registry import ID, PYTHONS, START_METHODS

REPO = Path(__file__).resolve().parents[2]
NOTEBOOKS = REPO / "notebooks"
TESTS = REPO / "tests"
TAG = "hidden-test"
# Notebooks tests/notebooks/test_claims.py also runs with SHMLAB_START_METHOD=spawn; every
# notebook runs under the default (fork on Linux before Python 3.14) in tests/notebooks.
# Not 14: each of its experiments picks its start method itself (its cells say
# `under: fork, spawn`), so a spawn run would repeat its fork run.
SPAWN_NOTEBOOKS = ("01_what_is_torch_multiprocessing.ipynb", "02_sharing_strategy_api.ipynb",
                   "15_dataloader_workers.ipynb",
                   "16_sharing_without_a_queue.ipynb",
                   "17_autograd_across_processes.ipynb",
                   "18_cuda_ipc_in_depth.ipynb")
ALL_PYTHONS_DIR = "tests/pythons"

_IDS = rf"{ID.pattern}(?:\s*,\s*{ID.pattern})*"
CLAIM_LINE = re.compile(rf"#\s*claim\s+({_IDS})\s*")
UNDER_LINE = re.compile(r"#\s*under:\s*(.*?)\s*")


@dataclass(frozen=True)
class Assertion:
    claims: tuple[str, ...]
    where: str                      # "notebooks/04_x.ipynb:cell-id" or "tests/a/test_b.py::test_c"
    start_methods: frozenset[str]
    pythons: str                    # "suite" or "all"


def split_ids(text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(","))


def notebook_methods(name: str) -> frozenset[str]:
    """The start methods tests/notebooks runs notebook ``name`` under."""
    return frozenset({"fork", "spawn"} if name in SPAWN_NOTEBOOKS else {"fork"})


def is_hidden_test(cell: dict) -> bool:
    return cell.get("cell_type") == "code" and TAG in cell.get("metadata", {}).get("tags", [])


def cell_source(cell: dict) -> str:
    source = cell.get("source", "")
    return "".join(source) if isinstance(source, list) else source


def cell_lines(cell: dict) -> list[str]:
    return [line.strip() for line in cell_source(cell).lstrip("\n").split("\n")]


def cell_assertion(cell: dict, notebook: str, where: str) -> tuple[Assertion | None, list[str]]:
    """A hidden cell's Assertion, or None and the problems that keep it from being one."""
    lines = cell_lines(cell) + [""]
    m = CLAIM_LINE.fullmatch(lines[0])
    problems = []
    if not m:
        problems.append(f"{where}: first line {lines[0]!r} is not '# claim <id>[, <id>...]'")
    if cell.get("metadata", {}).get("jupyter", {}).get("source_hidden") is not True:
        problems.append(f"{where}: metadata.jupyter.source_hidden is not true")
    methods = set(notebook_methods(notebook))
    under = UNDER_LINE.fullmatch(lines[1])
    if under:
        named = split_ids(under.group(1))
        bad = [x for x in named if x not in START_METHODS]
        if bad:
            problems.append(f"{where}: '# under:' names {bad}; start methods are {START_METHODS}")
        methods |= set(named) - set(bad)
    if problems:
        return None, problems
    return Assertion(split_ids(m.group(1)), where, frozenset(methods), "suite"), []


def notebook_assertions(notebooks_dir: Path = NOTEBOOKS) -> tuple[list[Assertion], list[str]]:
    """Every hidden test cell of notebooks_dir/*.ipynb as an Assertion, and malformed ones."""
    found, problems = [], []
    for path in sorted(notebooks_dir.glob("*.ipynb")):
        nb = json.loads(path.read_text(encoding="utf-8"))
        for cell in nb.get("cells", []):
            if is_hidden_test(cell):
                where = f"notebooks/{path.name}:{cell.get('id')}"
                assertion, bad = cell_assertion(cell, path.name, where)
                problems += bad
                if assertion:
                    found.append(assertion)
    return found, problems


def _is_claim_marker(func: ast.expr) -> bool:
    """``pytest.mark.claim`` or ``mark.claim`` (from pytest import mark)."""
    if not (isinstance(func, ast.Attribute) and func.attr == "claim"):
        return False
    mark = func.value
    return (isinstance(mark, ast.Attribute) and mark.attr == "mark") or (
        isinstance(mark, ast.Name) and mark.id == "mark")


def _calls(node: ast.AST, test: str | None):
    """(call, name of the def or class it marks or sits in) for every call under node."""
    for child in ast.iter_child_nodes(node):
        inner = child.name if isinstance(
            child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) else test
        if isinstance(child, ast.Call):
            yield child, test
        yield from _calls(child, inner)


def marker_assertions_in(source: str, rel: str) -> tuple[list[Assertion], list[str]]:
    """The ``pytest.mark.claim(...)`` markers of one test file's source (``rel``: its path)."""
    found, problems = [], []
    for node, test in _calls(ast.parse(source, filename=rel), None):
        if not _is_claim_marker(node.func):
            continue
        where = f"{rel}::{test}" if test else rel
        try:
            ids = tuple(ast.literal_eval(a) for a in node.args)
            kwargs = {k.arg: ast.literal_eval(k.value) for k in node.keywords}
        except ValueError:
            problems.append(f"{where}:{node.lineno}: claim marker arguments must be literals")
            continue
        unknown = set(kwargs) - {"start_methods", "pythons"}
        methods = tuple(kwargs.get("start_methods", ()))
        pythons = kwargs.get("pythons", "suite")
        if (not ids or any(not isinstance(i, str) or not ID.fullmatch(i) for i in ids)
                or unknown or any(m not in START_METHODS for m in methods)
                or pythons not in PYTHONS):
            problems.append(
                f"{where}:{node.lineno}: write claim(\"C1.2\", ..., start_methods=(...), "
                f"pythons=\"suite\"|\"all\") with start methods from {START_METHODS}")
            continue
        if pythons == "all" and not rel.startswith(ALL_PYTHONS_DIR + "/"):
            problems.append(f"{where}:{node.lineno}: pythons=\"all\" only in {ALL_PYTHONS_DIR}/, "
                            "whose tests run on every installed Python")
            pythons = "suite"
        found.append(Assertion(ids, where, frozenset(methods), pythons))
    return found, problems


def marker_assertions(tests_dir: Path = TESTS) -> tuple[list[Assertion], list[str]]:
    """Every claim marker in tests_dir/**/*.py, read with ast (no test module is imported)."""
    found, problems = [], []
    for path in sorted(tests_dir.rglob("*.py")):
        source = path.read_text(encoding="utf-8")
        if "claim" not in source:
            continue
        rel = path.relative_to(tests_dir.parent).as_posix()
        a, p = marker_assertions_in(source, rel)
        found += a
        problems += p
    return found, problems


def all_assertions(repo: Path = REPO) -> tuple[list[Assertion], list[str]]:
    """Cells and markers together, and every malformed one as a problem line."""
    cells, p1 = notebook_assertions(repo / "notebooks")
    marks, p2 = marker_assertions(repo / "tests")
    return cells + marks, p1 + p2


def by_claim(assertions: list[Assertion]) -> dict[str, list[Assertion]]:
    out: dict[str, list[Assertion]] = {}
    for a in assertions:
        for cid in a.claims:
            out.setdefault(cid, []).append(a)
    return out
