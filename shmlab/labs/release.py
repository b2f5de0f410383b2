"""Make learner copies from instructor copies, in nbgrader's text format.

Mirrors: nbgrader's ClearSolutions and ClearHiddenTests preprocessors
(``nbgrader generate_assignment``).

* In a solution cell, each ``### BEGIN SOLUTION`` ... ``### END SOLUTION`` region becomes
  ``# YOUR CODE HERE`` / ``raise NotImplementedError()`` at the region's indentation.
* In a test cell, each ``### BEGIN HIDDEN TESTS`` ... ``### END HIDDEN TESTS`` region is
  removed: those checks run only when the grader restores the cell from the source.
* Outputs and execution counts are cleared; metadata (nbgrader's included) is kept.
"""

from __future__ import annotations

import copy
import json
import os
import re
from importlib import resources
from pathlib import Path

import nbformat

# The instructor copies are package data (shmlab/labs/source/*.ipynb), found through
# importlib.resources, so `grade` works the same from a checkout and from an installed wheel.
SOURCE = resources.files(__package__) / "source"
# The learner copies: labs/ of the directory you run `release` in (the checkout's root, in the
# repository). Nothing here reaches from the package into a checkout.
LEARNER_DIR = Path("labs")


def _dir(where):
    """A Path for a str or path; an importlib.resources Traversable as it is."""
    return Path(where) if isinstance(where, (str, os.PathLike)) else where


def source(name: str, source_dir=SOURCE):
    """The instructor copy called ``name`` (it may not exist: check ``.is_file()``)."""
    return _dir(source_dir).joinpath(name)


def sources(source_dir=SOURCE) -> list:
    """The instructor notebooks in ``source_dir`` (default: the package's), sorted by name."""
    found = [p for p in _dir(source_dir).iterdir() if p.name.endswith(".ipynb") and p.is_file()]
    return sorted(found, key=lambda p: p.name)


def read(path) -> nbformat.NotebookNode:
    """A notebook from a path or a package resource."""
    return nbformat.reads(_dir(path).read_text(encoding="utf-8"), as_version=4)


def _region(begin: str, end: str) -> re.Pattern:
    """From a ``### BEGIN ...`` line to its ``### END ...`` line; group 1 = the indentation."""
    return re.compile(rf"^([ \t]*)### {begin}[^\n]*\n.*?^[ \t]*### {end}[^\n]*(\n|$)",
                      re.S | re.M)


_SOLUTION = _region("BEGIN SOLUTION", "END SOLUTION")
_HIDDEN = _region("BEGIN HIDDEN TESTS", "END HIDDEN TESTS")


def nbgrader_meta(cell) -> dict:
    return cell.get("metadata", {}).get("nbgrader", {})


def release_cell(cell):
    """The learner's version of one instructor cell."""
    cell = copy.deepcopy(cell)
    meta = nbgrader_meta(cell)
    if meta.get("solution"):
        cell.source = _SOLUTION.sub(
            lambda m: f"{m.group(1)}# YOUR CODE HERE\n{m.group(1)}raise NotImplementedError()"
                      f"{m.group(2)}", cell.source)
    if meta.get("grade"):
        cell.source = _HIDDEN.sub("", cell.source).rstrip("\n")
    if cell.cell_type == "code":
        cell.outputs, cell.execution_count = [], None
    return cell


def release_notebook(source_nb):
    nb = copy.deepcopy(source_nb)
    nb.cells = [release_cell(c) for c in source_nb.cells]
    return nb


def release(source_dir=SOURCE, out_dir=LEARNER_DIR) -> list[Path]:
    """Write ``out_dir/<name>.ipynb`` for every instructor notebook; return the paths."""
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    written = []
    for src in sources(source_dir):
        nb = release_notebook(read(src))
        out = Path(out_dir) / src.name
        nbformat.write(nb, out)
        written.append(out)
    return written


def out_of_date(source_dir=SOURCE, out_dir=LEARNER_DIR) -> list[str]:
    """Learner copies that differ from what ``release`` would write now (or are missing)."""
    stale = []
    for src in sources(source_dir):
        want = json.loads(nbformat.writes(release_notebook(read(src))))
        out = Path(out_dir) / src.name
        if not out.exists() or json.loads(out.read_text()) != want:
            stale.append(out.name)
    return stale
