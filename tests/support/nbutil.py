"""Notebook helpers for the test suite: find, execute and inspect notebooks.

Used by test_notebooks.py and test_harness.py, and meant for later tests too (claim coverage,
lab grading). Notebooks run headless with nbclient in the `python3` kernel, which is this
interpreter's ipykernel (jupyter_client swaps the kernelspec's bare `python` for sys.executable,
and inside a virtual environment jupyter_core prefers the environment's kernelspec).
"""

from __future__ import annotations

import datetime
import fcntl
import json
import os
import resource
import subprocess
import sys
import time
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
# Each notebook's headless budget on a quiet 2-core machine: 60 s, the two training
# notebooks 90 s. Not a timed test — the machine is shared and noisy — but every headless run
# is written to TIMES_FILE and the end of the run prints a table that marks what went over.
BUDGET_S = 60
BUDGETS_S = {"06_hogwild_training": 90, "07_beyond_one_machine": 90}
TIMES_FILE = ARTIFACTS / "notebook-times.json"
SLOWEST_CELLS = 5  # how many of each notebook's slowest cells the record keeps
TIMES: dict[str, dict] = {}  # this pytest run's records, by rel(path); read by conftest.py


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


def execute_notebook(path, timeout: int = CELL_TIMEOUT, save_failed_to=None, timed=False):
    """Execute the notebook at `path` in its own folder; return the executed notebook.

    `timeout` is per cell. On failure, the partly executed notebook is written to
    `save_failed_to/<name>` (if given) before the error propagates. With `timed`, the run's
    wall time (kernel start-up included) and its slowest cells are recorded (`record_time`),
    whether it passes or not.
    """
    path = Path(path)
    nb = read_notebook(path)
    load, start, passed = os.getloadavg()[0], time.monotonic(), False
    cpu = _children_cpu()
    try:
        execute(nb, cwd=path.parent, timeout=timeout)
        passed = True
        return nb
    except Exception:
        if save_failed_to is not None:
            Path(save_failed_to).mkdir(parents=True, exist_ok=True)
            nbformat.write(nb, str(Path(save_failed_to) / path.name))
        raise
    finally:
        if timed:
            cpu = _children_cpu() - cpu
            record_time(path, nb, time.monotonic() - start, passed, load, cpu)


def budget_s(path) -> int:
    """The headless budget of the notebook at `path`, in seconds."""
    return BUDGETS_S.get(Path(path).stem, BUDGET_S)


def _when(stamp: str) -> datetime.datetime:
    return datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00"))  # 3.10 reads no "Z"


def cell_seconds(nb) -> list[dict]:
    """Each executed code cell's kernel time (nbclient's timing metadata), slowest first."""
    cells = []
    for i, cell in enumerate(nb.cells):
        t = cell.get("metadata", {}).get("execution", {})
        began = t.get("iopub.execute_input") or t.get("iopub.status.busy")
        ended = t.get("shell.execute_reply") or t.get("iopub.status.idle")
        if cell.cell_type == "code" and began and ended:
            seconds = (_when(ended) - _when(began)).total_seconds()
            cells.append({"index": i, "id": cell.get("id"), "seconds": round(seconds, 2)})
    return sorted(cells, key=lambda c: -c["seconds"])


def _children_cpu() -> float:
    """User + system CPU seconds of this process's reaped descendants: the kernel, once shut
    down, with every child it waited for (subprocesses, Process children, torchrun's ranks)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def record_time(path, nb, seconds, passed, load_before, cpu_seconds=None) -> dict:
    """Note one headless run in TIMES and merge it into TIMES_FILE (other notebooks' last
    records stay). The budget is for a quiet machine, so the record says how busy this one
    was (1-minute load average) and how much CPU the run used (kernel and the children it
    reaped: much less sensitive to other programs than the wall time; daemons it started,
    such as a manager, are not counted)."""
    record = {
        "seconds": round(seconds, 1),
        "budget_s": budget_s(path),
        "over": seconds > budget_s(path),
        "passed": passed,
        "measured_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "cpu_seconds": None if cpu_seconds is None else round(cpu_seconds, 1),
        "load_1min": {"before": round(load_before, 2), "after": round(os.getloadavg()[0], 2)},
        "cpus": os.cpu_count(),
        # pytest-xdist workers sharing those CPUs (1: a run without workers); more workers than
        # cores stretch the wall time, not the CPU time
        "workers": int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")),
        "slowest_cells": cell_seconds(nb)[:SLOWEST_CELLS],
    }
    TIMES[rel(path)] = record
    TIMES_FILE.parent.mkdir(parents=True, exist_ok=True)
    # Locked: xdist workers finishing notebooks at once must not drop each other's records.
    with open(TIMES_FILE.with_name(TIMES_FILE.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            saved = json.loads(TIMES_FILE.read_text())["notebooks"]
        except (OSError, ValueError, KeyError, TypeError):
            saved = {}
        saved[rel(path)] = record
        TIMES_FILE.write_text(
            json.dumps({"notebooks": dict(sorted(saved.items()))}, indent=1) + "\n")
    return record


def times_table(records: dict[str, dict]) -> list[str]:
    """The terminal summary's lines: per notebook its time, budget, verdict and slowest cell."""
    head = f"{'notebook':40} {'time':>7} {'budget':>6}  {'verdict':11} {'cpu':>6} {'load':>9}"
    lines = [head + "  slowest cell"]
    for name, r in sorted(records.items()):
        verdict = ("OVER BUDGET" if r["over"] else "ok") + ("" if r["passed"] else " (failed)")
        cell = r["slowest_cells"][0] if r["slowest_cells"] else None
        slowest = f"{cell['id']} {cell['seconds']:.1f} s" if cell else "-"
        cpu = "-" if r.get("cpu_seconds") is None else f"{r['cpu_seconds']:.1f}s"
        load = f"{r['load_1min']['before']:.1f}→{r['load_1min']['after']:.1f}"
        lines.append(
            f"{Path(name).stem:40} {r['seconds']:>6.1f}s {r['budget_s']:>5}s  "
            f"{verdict:11} {cpu:>6} {load:>9}  {slowest}"
        )
    over = [n for n, r in records.items() if r["over"]]
    workers = max((r.get("workers", 1) for r in records.values()), default=1)
    lines.append(
        f"{len(over)} of {len(records)} over budget. Budgets are for a quiet machine: load is "
        f"the 1-minute load average on {os.cpu_count()} CPUs, cpu the CPU time of the kernel "
        f"and the children it reaped. Record: {rel(TIMES_FILE)}"
    )
    if workers > 1:
        lines.append(f"{workers} pytest-xdist workers shared the CPUs: compare a time over "
                     f"budget with its cpu (the work itself) before calling the notebook slow.")
    return lines


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
