"""Grade a learner's lab notebook against the instructor copy.

Mirrors: nbgrader's autograde (OverwriteCells + execution + point totals), in one command.

The learner's answers (solution cells, matched by ``grade_id``) are put into the instructor's
notebook; every other cell (instructions, set-up, and the test cells *with* their hidden
tests) comes from the instructor copy. So a learner who edited or deleted a test cell is graded
against the original test all the same. The merged notebook runs in a fresh kernel; a test
cell scores its points if it ran without an error.
"""

from __future__ import annotations

import copy
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import nbformat
from nbclient import NotebookClient

from . import release as _release
from .release import SOURCE, nbgrader_meta, release_cell


@dataclass
class Exercise:
    grade_id: str
    points: float
    score: float
    error: str  # the last line of the error the test cell raised, "" if it passed
    output: str = ""  # what the test cell printed: its ✅/❌ lines and hints


@dataclass
class Result:
    notebook: str
    exercises: list[Exercise]
    seconds: float

    @property
    def score(self) -> float:
        return sum(e.score for e in self.exercises)

    @property
    def max_score(self) -> float:
        return sum(e.points for e in self.exercises)

    def as_dict(self) -> dict:
        return {"notebook": self.notebook, "score": self.score, "max_score": self.max_score,
                "seconds": round(self.seconds, 2), "exercises": [asdict(e) for e in self.exercises]}


def merge(source_nb, learner_nb):
    """The instructor notebook with the learner's answers (and their helper cells) in it."""
    learner = list(learner_nb.cells)
    index = {nbgrader_meta(c).get("grade_id"): i for i, c in enumerate(learner)
             if nbgrader_meta(c).get("grade_id")}
    merged = copy.deepcopy(source_nb)
    cells = []
    for cell in source_nb.cells:
        meta = nbgrader_meta(cell)
        if not meta.get("solution"):
            cells.append(copy.deepcopy(cell))
            continue
        i = index.get(meta["grade_id"])
        if i is None or learner[i].cell_type != cell.cell_type:
            cells.append(release_cell(cell))  # answer deleted: grade the empty stub
            continue
        answer = copy.deepcopy(learner[i])
        answer.metadata["nbgrader"] = copy.deepcopy(meta)  # the learner can't relabel it
        cells.append(answer)
        for extra in learner[i + 1:]:  # the learner's own cells right after an answer stay
            if nbgrader_meta(extra):
                break
            cells.append(copy.deepcopy(extra))
    merged.cells = cells
    return merged


def grade(path, source_dir=SOURCE, timeout: int = 120) -> Result:
    """Score the notebook at ``path`` against the instructor copy of the same name.

    ``source_dir`` defaults to the instructor copies inside the package (a checkout's or an
    installed wheel's alike); the kernel runs in the learner notebook's folder.
    """
    path = Path(path)
    source = _release.source(path.name, source_dir)
    if not source.is_file():
        names = ", ".join(p.name for p in _release.sources(source_dir))
        raise FileNotFoundError(f"no instructor copy {source} for {path.name}: grade a notebook "
                                f"named like one in {source_dir} ({names})")
    nb = merge(_release.read(source), nbformat.read(path, as_version=4))
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    start = time.perf_counter()
    NotebookClient(nb, timeout=timeout, kernel_name="python3", allow_errors=True,
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    seconds = time.perf_counter() - start
    exercises = []
    for cell in nb.cells:
        meta = nbgrader_meta(cell)
        if cell.cell_type != "code" or not meta.get("grade"):
            continue
        errors = [o for o in cell.outputs if o.get("output_type") == "error"]
        error = f"{errors[0].ename}: {errors[0].evalue}"[:300] if errors else ""
        points = float(meta.get("points", 0))
        printed = "".join(o.get("text", "") for o in cell.outputs if o.get("name") == "stdout")
        exercises.append(Exercise(meta["grade_id"], points, 0.0 if errors else points, error,
                                  printed))
    return Result(str(path), exercises, seconds)


def print_table(result: Result) -> None:
    print(f"{result.notebook}  ({result.seconds:.1f} s)")
    for e in result.exercises:
        mark = "✅" if e.score == e.points else "❌"
        print(f"  {mark} {e.grade_id:<28} {e.score:g}/{e.points:g}"
              + (f"   {e.error}" if e.error else ""))
    print(f"  total {result.score:g}/{result.max_score:g}")
