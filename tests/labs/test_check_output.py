"""What a learner sees when a lab check fails in a Jupyter kernel: the hint, in a few lines.

Lab 2's own cells (the released copy) run in a real IPython kernel (nbclient): the check before
its answer cell, with the answer unfilled, and with an answer that raises. Each stays an error
(Run All stops there; the grader, which runs plain Python, is tests/labs/test_labs.py's), but
says what to do in at most MAX_LINES lines, with no traceback through shmlab's own files.
"""

from __future__ import annotations

import copy
import re

import nbformat
import pytest
from support.nbutil import REPO

LAB = REPO / "labs" / "lab2_file_descriptors.ipynb"
MAX_LINES = 10
ANSI = re.compile(r"\x1b\[[0-9;]*m")
RAISES = ("def create_unlinked_segment(size):\n"
          "    name = segment_name()\n"
          "    return os.open('/nonexistent/shmlab-lab2', os.O_RDONLY)\n")


def _cell(nb, needle: str):
    return copy.deepcopy(next(c for c in nb.cells if c.cell_type == "code" and needle in c.source))


def _shown(cell) -> tuple[str, list]:
    """The text the learner sees below the cell, and its error outputs."""
    text, errors = [], []
    for out in cell.outputs:
        if out.output_type == "stream":
            text.append(out.text)
        elif out.output_type == "error":
            errors.append(out)
            text.append("\n".join(out.traceback))
    return ANSI.sub("", "\n".join(text)).strip(), errors


@pytest.mark.timeout(120)
def test_a_failing_check_shows_the_hint_in_a_few_lines_without_a_traceback():
    from nbclient import NotebookClient

    lab = nbformat.read(LAB, as_version=4)
    setup = copy.deepcopy(next(c for c in lab.cells if c.cell_type == "code"))
    answer = _cell(lab, "def create_unlinked_segment")
    check = _cell(lab, "lab2.check_unlinked_segment(")
    wrong = nbformat.v4.new_code_cell(RAISES)
    cells = [setup, check, answer, copy.deepcopy(check), wrong, copy.deepcopy(check)]
    for i, c in enumerate(cells):  # the copies repeat an id: give each cell its own
        c["id"] = f"cell-{i}"
    nb = nbformat.v4.new_notebook(cells=cells)
    NotebookClient(nb, timeout=90, allow_errors=True, kernel_name="python3").execute()
    too_early, unfilled, raised = (_shown(nb.cells[i]) for i in (1, 3, 5))
    for text, errors in (too_early, unfilled, raised):
        assert errors, f"the check must stay an error (Run All stops there):\n{text}"
        assert len(text.splitlines()) <= MAX_LINES, f"{len(text.splitlines())} lines:\n{text}"
        assert "Traceback" not in text and "report.py" not in text, text
    assert too_early[1][0].ename == "NameError"
    assert "create_unlinked_segment" in too_early[0] and "run the answer cell" in too_early[0]
    assert unfilled[1][0].ename == "AssertionError" and "not implemented yet" in unfilled[0]
    assert raised[1][0].ename == "AssertionError"
    assert "FileNotFoundError" in raised[0] and "/nonexistent/shmlab-lab2" in raised[0]
    assert re.search(r"your cell In\[\d+\], line 3", raised[0]), raised[0]  # the learner's line
