"""Notebook helpers for the test suite: find, execute and inspect notebooks.

Used by test_notebooks.py and test_harness.py, and meant for later tests too (claim coverage,
lab grading). Notebooks run headless with nbclient in the `python3` kernel, which is this
interpreter's ipykernel (jupyter_client swaps the kernelspec's bare `python` for sys.executable,
and inside a virtual environment jupyter_core prefers the environment's kernelspec).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import nbformat
from nbclient import NotebookClient

REPO = Path(__file__).resolve().parents[2]
# Executed as tests: the step-by-step notebooks. The labs run through the grader in
# test_labs.py instead (instructor copies must score full marks, learner copies zero), so they
# are not executed twice.
NOTEBOOK_DIRS = (REPO / "notebooks",)
KERNEL = "python3"
CELL_TIMEOUT = int(os.environ.get("SHMLAB_CELL_TIMEOUT", "120"))  # seconds per cell
NOTEBOOK_TIMEOUT = int(os.environ.get("SHMLAB_NOTEBOOK_TIMEOUT", "300"))  # seconds per notebook
ARTIFACTS = REPO / "test-artifacts"  # executed copies of failing notebooks land here (ignored)
# nbstripout's notion of "stripped", keeping our meaningful cell ids.
NBSTRIPOUT_ARGS = ("--keep-id",)


def find_notebooks(dirs=NOTEBOOK_DIRS) -> list[Path]:
    """Every .ipynb directly in `dirs` (missing folders are skipped), sorted by path."""
    found = []
    for d in dirs:
        if d.is_dir():
            found.extend(p for p in d.glob("*.ipynb") if p.is_file())
    return sorted(found)


def tracked_notebooks() -> list[Path]:
    """The notebooks git tracks (what a fresh clone gets); without git, those in our folders."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "-z", "--", "*.ipynb"],
            cwd=REPO,
            capture_output=True,
            check=True,
            timeout=30,
        ).stdout
    except (OSError, subprocess.CalledProcessError):  # no git, or not a checkout git trusts
        return find_notebooks(
            (REPO / "notebooks", REPO / "labs", REPO / "shmlab" / "labs" / "source")
        )
    names = [n for n in out.decode().split("\0") if n]
    return sorted(REPO / n for n in names if (REPO / n).is_file())


def rel(path: Path) -> str:
    """A notebook's path relative to the repository, for test ids and messages."""
    try:
        return str(Path(path).resolve().relative_to(REPO))
    except ValueError:
        return str(path)


def read_notebook(path) -> nbformat.NotebookNode:
    return nbformat.read(str(path), as_version=4)


def execute(nb, cwd, timeout: int = CELL_TIMEOUT) -> nbformat.NotebookNode:
    """Run every cell of `nb` in a fresh kernel started in `cwd`; return `nb` with outputs.

    Raises nbclient's CellExecutionError on the first failing cell (the notebook object then
    holds the outputs up to that cell). The kernel is shut down either way.
    """
    client = NotebookClient(
        nb,
        timeout=timeout,
        kernel_name=KERNEL,
        allow_errors=False,
        resources={"metadata": {"path": str(cwd)}},
    )
    client.execute()
    return nb


def execute_notebook(path, timeout: int = CELL_TIMEOUT, save_failed_to=None):
    """Execute the notebook at `path` in its own folder; return the executed notebook.

    `timeout` is per cell. On failure, the partly executed notebook is written to
    `save_failed_to/<name>` (if given) before the error propagates.
    """
    path = Path(path)
    nb = read_notebook(path)
    try:
        return execute(nb, cwd=path.parent, timeout=timeout)
    except Exception:
        if save_failed_to is not None:
            Path(save_failed_to).mkdir(parents=True, exist_ok=True)
            nbformat.write(nb, str(Path(save_failed_to) / path.name))
        raise


def output_problems(nb) -> list[str]:
    """What makes `nb` not 'committed without outputs': one line per offending cell or key."""
    problems = []
    for i, cell in enumerate(nb.cells):
        where = f"cell {i} ({cell.get('id', 'no id')})"
        if cell.get("outputs"):
            problems.append(f"{where} has {len(cell['outputs'])} output(s)")
        if cell.get("execution_count") is not None:
            problems.append(f"{where} has execution_count {cell['execution_count']}")
    if "widgets" in nb.metadata:
        problems.append("notebook metadata carries saved widget state (metadata.widgets)")
    return problems


def notebook_has_outputs(nb) -> bool:
    return bool(output_problems(nb))


def nbstripout_verify(paths) -> subprocess.CompletedProcess:
    """Run `nbstripout --verify` on `paths`; returncode 0 means all of them are stripped."""
    return subprocess.run(
        [sys.executable, "-m", "nbstripout", "--verify", *NBSTRIPOUT_ARGS, *map(str, paths)],
        capture_output=True,
        text=True,
        timeout=120,
    )


def outputs_text(nb) -> str:
    """All stream and text/plain output of an executed notebook, joined (for content checks)."""
    parts = []
    for cell in nb.cells:
        for out in cell.get("outputs", ()):
            if out.get("output_type") == "stream":
                parts.append(out.get("text", ""))
            elif "data" in out:
                parts.append(out["data"].get("text/markdown") or out["data"].get("text/plain", ""))
    return "".join(parts)


def code_cell(source: str, **metadata) -> nbformat.NotebookNode:
    return nbformat.v4.new_code_cell(source, metadata=metadata)


def new_notebook(*cells) -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook(cells=list(cells))
    nb.metadata["kernelspec"] = {"name": KERNEL, "display_name": "Python 3", "language": "python"}
    return nb
