"""Every notebook runs headless, and every committed notebook carries no outputs."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from support import nbutil

# The Chinese edition's built notebooks (shmlab.i18n) run too: the same code and hidden cells,
# under the default start method only (the spawn runs of test_claims.py are English only).
NOTEBOOKS = nbutil.find_notebooks() + nbutil.find_notebooks((nbutil.REPO / "notebooks" / "zh",))
TRACKED = nbutil.tracked_notebooks()
START_HERE = nbutil.REPO / "notebooks" / "00_start_here.ipynb"
_executed: dict[Path, object] = {}  # path -> executed notebook, reused by content checks
# The content check reads the headless run's outputs; under pytest-xdist it sees them only on
# the worker that ran the notebook, so the two stay on one worker (else it runs 00 again).
START_HERE_GROUP = pytest.mark.xdist_group("start-here")


@pytest.mark.notebook
@pytest.mark.timeout(nbutil.NOTEBOOK_TIMEOUT)
@pytest.mark.parametrize("path", [pytest.param(p, marks=START_HERE_GROUP) if p == START_HERE else p
                                  for p in NOTEBOOKS], ids=nbutil.rel)
def test_notebook_runs_headless(path):
    """Run all cells in a fresh python3 kernel; any exception (a hidden test cell too) fails.

    The wall time is recorded against the notebook's budget (nbutil.budget_s), not asserted:
    the summary at the end of the run marks a notebook that went over."""
    nb = nbutil.execute_notebook(
        path, timeout=nbutil.CELL_TIMEOUT, save_failed_to=nbutil.ARTIFACTS, timed=True
    )
    _executed[path] = nb


@pytest.mark.parametrize("path", TRACKED, ids=nbutil.rel)
def test_committed_notebook_has_no_outputs(path):
    problems = nbutil.output_problems(nbutil.read_notebook(path))
    assert not problems, (
        f"{nbutil.rel(path)} must be committed without outputs; clear them with "
        f"`.venv/bin/nbstripout --keep-id {nbutil.rel(path)}`:\n  " + "\n  ".join(problems)
    )


@pytest.mark.skipif(not TRACKED, reason="no notebook is tracked by git yet")
def test_committed_notebooks_pass_nbstripout_verify():
    result = nbutil.nbstripout_verify(TRACKED)
    assert result.returncode == 0, (
        "nbstripout --verify --keep-id would change these notebooks; run "
        "`.venv/bin/nbstripout --keep-id <file>` on them:\n" + result.stdout + result.stderr
    )


@pytest.mark.parametrize("path", TRACKED, ids=nbutil.rel)
def test_committed_notebook_is_valid_nbformat_45(path):
    import nbformat

    nb = nbutil.read_notebook(path)
    nbformat.validate(nb)
    assert (nb.nbformat, nb.nbformat_minor) >= (4, 5), "write nbformat 4.5 (cells carry ids)"
    assert nb.metadata.get("kernelspec", {}).get("name") == nbutil.KERNEL


@pytest.mark.timeout(120)
def test_kernel_is_this_interpreter(tmp_path):
    """The python3 kernel the notebooks run in is the venv's own Python, not a system one."""
    nb = nbutil.new_notebook(nbutil.code_cell("import sys; print(sys.prefix)"))
    nbutil.execute(nb, cwd=tmp_path)
    assert nbutil.outputs_text(nb).strip() == sys.prefix


@pytest.mark.notebook
@pytest.mark.timeout(nbutil.NOTEBOOK_TIMEOUT)
@START_HERE_GROUP
def test_start_here_reports_every_check():
    nb = _executed.get(START_HERE) or nbutil.execute_notebook(START_HERE)
    text = nbutil.outputs_text(nb)
    for label in (
        "Python:",
        "torch:",
        "numpy:",
        "ipywidgets:",
        "default start method:",
        "default sharing strategy:",
        "ulimit -n:",
        "/dev/shm:",
        "CJK font:",
    ):
        lines = [ln for ln in text.splitlines() if label in ln]
        assert lines, f"00_start_here printed no {label!r} line:\n{text}"
        # Every check prints its value on a ✅/⚠️ line, then a one-line explanation.
        assert lines[0].startswith(("✅", "⚠️")), lines[0]
    for name in ("01_what_is_torch_multiprocessing", "08_when_the_parent_dies", "lab5_hogwild"):
        assert name in text, f"the map does not mention {name}"


# Run inside the kernel, after 00_start_here's first cell: make the machine look like a default
# Docker container (64 MiB /dev/shm) with a low fd limit the user may still raise.
SIMULATE_SMALL_MACHINE = """
import resource, shutil
_usage, _getrlimit = shutil.disk_usage, resource.getrlimit
shutil.disk_usage = lambda p: (
    type(_usage(p))(64 * 2**20, 0, 64 * 2**20) if str(p) == "/dev/shm" else _usage(p)
)
resource.getrlimit = lambda r: (1024, 4096) if r == resource.RLIMIT_NOFILE else _getrlimit(r)
"""


@pytest.mark.notebook
@pytest.mark.timeout(nbutil.NOTEBOOK_TIMEOUT)
def test_start_here_flags_a_tiny_dev_shm_and_a_low_fd_limit():
    nb = nbutil.read_notebook(START_HERE)
    nb.cells.insert(1, nbutil.code_cell(SIMULATE_SMALL_MACHINE))
    text = nbutil.outputs_text(nbutil.execute(nb, cwd=START_HERE.parent))
    assert "⚠️ ulimit -n: 1,024 (hard limit 4,096)" in text, text
    assert "`ulimit -n 4096`" in text, text
    assert "⚠️ /dev/shm: 64 MiB in all" in text, text
    assert "--shm-size" in text, text
    assert "thing(s) to look at" in text, text  # the summary lists both problems
    assert " - ulimit -n = 1,024" in text and " - /dev/shm = 64 MiB" in text, text
