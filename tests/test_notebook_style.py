"""Notebooks read like lessons: short first cells, no long helpers in cells, no copied blocks.

The rules of issue 11 (3), for every notebook in notebooks/:
* the first code cell is at most FIRST_CELL_MAX lines;
* no function or class defined in a cell is longer than DEF_MAX lines, counted from its `def` /
  `class` line to its last line (helpers of that size belong in the package, in shmlab.lessons);
* no block of COPY_MIN or more identical code lines (stripped, blank lines ignored) appears in
  two notebooks;
* ruff checks the notebooks (pyproject.toml does not exclude them).
IPython magics are blanked before parsing (`%%` cell magics skip the whole cell); a cell that
still does not parse is left to ruff, which reports it. Each failure names the notebook, the
cell (index and id) and the line, so the message says where to cut.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections import defaultdict
from itertools import combinations

import nbformat
import pytest
from support import nbutil

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

NOTEBOOKS_DIR = nbutil.REPO / "notebooks"
NOTEBOOKS = nbutil.find_notebooks((NOTEBOOKS_DIR,))
FIRST_CELL_MAX = 15
DEF_MAX = 10
COPY_MIN = 6


# --- reading cells ---------------------------------------------------------------------------
def code_cells(nb):
    """(index in the notebook, cell) for every code cell."""
    return [(i, c) for i, c in enumerate(nb.cells) if c.cell_type == "code"]


def where(name: str, index: int, cell, line: int | None = None) -> str:
    at = f"{name} cell {index} (id {cell.get('id', '?')})"
    return at if line is None else f"{at} line {line}"


def python_source(source: str) -> str | None:
    """The cell as plain Python, magics blanked (line numbers kept); None for a %% cell."""
    if source.lstrip().startswith("%%"):
        return None
    return "\n".join("" if line.lstrip().startswith(("%", "!")) else line
                     for line in source.splitlines())


def parse(source: str):
    """The cell's AST, or None if it is a cell magic or does not parse (ruff reports that)."""
    src = python_source(source)
    if src is None:
        return None
    try:
        return compile(src, "<cell>", "exec", ast.PyCF_ONLY_AST | ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    except SyntaxError:
        return None


# --- the checks (each returns one line per problem) ------------------------------------------
def first_cell_problems(name: str, nb) -> list[str]:
    cells = code_cells(nb)
    if not cells:
        return []
    index, cell = cells[0]
    n = len(cell.source.rstrip().splitlines())
    if n <= FIRST_CELL_MAX:
        return []
    return [f"{where(name, index, cell)}: the first code cell is {n} lines "
            f"(at most {FIRST_CELL_MAX}): move the set-up into the package"]


def long_definition_problems(name: str, nb) -> list[str]:
    problems = []
    for index, cell in code_cells(nb):
        tree = parse(cell.source)
        if tree is None:
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                n = node.end_lineno - node.lineno + 1
                if n > DEF_MAX:
                    kind = "class" if isinstance(node, ast.ClassDef) else "def"
                    problems.append(f"{where(name, index, cell, node.lineno)}: {kind} "
                                    f"{node.name} is {n} lines (at most {DEF_MAX})")
    return problems


def code_lines(nb) -> list[tuple[int, object, int, str]]:
    """(cell index, cell, line number in the cell, stripped text) of every non-blank line."""
    lines = []
    for index, cell in code_cells(nb):
        for number, text in enumerate(cell.source.splitlines(), start=1):
            if text.strip():
                lines.append((index, cell, number, text.strip()))
    return lines


def _windows(lines) -> dict[tuple[str, ...], list[int]]:
    """Every run of COPY_MIN consecutive lines within one cell -> where it starts."""
    found = defaultdict(list)
    for k in range(len(lines) - COPY_MIN + 1):
        run = lines[k:k + COPY_MIN]
        if run[0][0] == run[-1][0]:  # a block does not span two cells
            found[tuple(text for *_, text in run)].append(k)
    return found


def copied_block_problems(notebooks: dict[str, object]) -> list[str]:
    """One line per maximal block of >= COPY_MIN identical lines found in two notebooks."""
    lines = {name: code_lines(nb) for name, nb in notebooks.items()}
    windows = {name: _windows(ls) for name, ls in lines.items()}
    problems = []
    for a, b in combinations(sorted(notebooks), 2):
        starts = sorted((ka, kb) for key, kas in windows[a].items() if key in windows[b]
                        for ka in kas for kb in windows[b][key])
        shared = set(starts)
        for ka, kb in starts:
            if (ka - 1, kb - 1) in shared:
                continue  # inside a block already reported from its first line
            n = COPY_MIN
            while (ka + n - COPY_MIN + 1, kb + n - COPY_MIN + 1) in shared:
                n += 1
            ia, ca, la, text = lines[a][ka]
            ib, cb, lb, _ = lines[b][kb]
            problems.append(f"{where(a, ia, ca, la)} and {where(b, ib, cb, lb)}: {n} identical "
                            f"lines (at most {COPY_MIN - 1}), starting {text[:60]!r}")
    return problems


def _read(path):
    return nbutil.read_notebook(path)


# --- the rules, on the real notebooks -----------------------------------------------------------
def test_there_are_notebooks_to_check():
    assert len(NOTEBOOKS) >= 10, [p.name for p in NOTEBOOKS]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem[:2])
def test_first_code_cell_is_at_most_15_lines(path):
    problems = first_cell_problems(path.name, _read(path))
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem[:2])
def test_no_function_or_class_longer_than_10_lines_in_a_cell(path):
    problems = long_definition_problems(path.name, _read(path))
    assert not problems, "\n".join(problems)


def test_no_block_of_6_identical_lines_in_two_notebooks():
    problems = copied_block_problems({p.name: _read(p) for p in NOTEBOOKS})
    assert not problems, f"{len(problems)} copied block(s):\n" + "\n".join(problems)


def test_ruff_checks_the_notebooks():
    config = tomllib.loads((nbutil.REPO / "pyproject.toml").read_text())["tool"]["ruff"]
    excluded = config.get("exclude", []) + config.get("extend-exclude", [])
    assert not [p for p in excluded if p.split("/")[0] == "notebooks"], excluded
    out = subprocess.run([sys.executable, "-m", "ruff", "check", "--output-format", "concise",
                          "notebooks"], cwd=nbutil.REPO, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr


# --- the checks can fail (so a pass above means something) -------------------------------------
def _nb(*sources):
    return nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(s) for s in sources])


def test_checks_catch_a_long_first_cell_a_long_def_and_a_copied_block():
    long_def = "x = 1\n\ndef helper():\n" + "    y = 1\n" * 10 + "\n%matplotlib inline\n"
    nb = _nb("\n".join(f"a{i} = {i}" for i in range(16)), long_def, "%%bash\necho hi")
    assert first_cell_problems("n.ipynb", nb) == [
        f"n.ipynb cell 0 (id {nb.cells[0].id}): the first code cell is 16 lines (at most 15): "
        "move the set-up into the package"]
    assert long_definition_problems("n.ipynb", nb) == [
        f"n.ipynb cell 1 (id {nb.cells[1].id}) line 3: def helper is 11 lines (at most 10)"]
    block = "\n\n".join(f"b{i} = {i}" for i in range(7))  # 7 lines, blank lines between
    one, two = _nb("print(1)", block), _nb(f"  {block}\n".replace("\n", "\n  "))
    (problem,) = copied_block_problems({"one.ipynb": one, "two.ipynb": two})
    assert problem.startswith(f"one.ipynb cell 1 (id {one.cells[1].id}) line 1 and "
                              f"two.ipynb cell 0 (id {two.cells[0].id}) line 1: 7 identical")
    assert copied_block_problems({"one.ipynb": one, "three.ipynb": _nb("b0 = 0\nb1 = 1")}) == []
