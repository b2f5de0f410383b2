"""Notebooks read like lessons: no copied blocks, and ruff checks them.

For every notebook in notebooks/:
* no block of COPY_MIN or more identical code lines (stripped, blank lines ignored) appears in
  two notebooks;
* ruff checks the notebooks (pyproject.toml does not exclude them).
Each failure names the notebook, the cell (index and id) and the line. There is no rule on the
length of a cell or of a function in it: an experiment is as long as the code it teaches (a
line-count rule made lessons split one scenario into pieces, and moved the code a learner should
read into the package).
"""

from __future__ import annotations

import subprocess
import sys
from collections import defaultdict
from itertools import combinations

import nbformat
from support import nbutil

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

NOTEBOOKS_DIR = nbutil.REPO / "notebooks"
NOTEBOOKS = nbutil.find_notebooks((NOTEBOOKS_DIR,))
COPY_MIN = 6


# --- reading cells ---------------------------------------------------------------------------
def code_cells(nb):
    """(index in the notebook, cell) for every code cell."""
    return [(i, c) for i, c in enumerate(nb.cells) if c.cell_type == "code"]


def where(name: str, index: int, cell, line: int | None = None) -> str:
    at = f"{name} cell {index} (id {cell.get('id', '?')})"
    return at if line is None else f"{at} line {line}"


# --- the checks (each returns one line per problem) ------------------------------------------
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


def test_the_check_catches_a_copied_block():
    block = "\n\n".join(f"b{i} = {i}" for i in range(7))  # 7 lines, blank lines between
    one, two = _nb("print(1)", block), _nb(f"  {block}\n".replace("\n", "\n  "))
    (problem,) = copied_block_problems({"one.ipynb": one, "two.ipynb": two})
    assert problem.startswith(f"one.ipynb cell 1 (id {one.cells[1].id}) line 1 and "
                              f"two.ipynb cell 0 (id {two.cells[0].id}) line 1: 7 identical")
    assert copied_block_problems({"one.ipynb": one, "three.ipynb": _nb("b0 = 0\nb1 = 1")}) == []
