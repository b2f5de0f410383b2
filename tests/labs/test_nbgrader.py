"""nbgrader itself grades the course that `python -m shmlab.labs nbgrader-course` lays out (#14).

An instructor runs nbgrader's own commands on that folder, unchanged: `nbgrader
generate_assignment lab1_reducers`, then `nbgrader autograde lab1_reducers` on a correct and a
wrong submission, then `nbgrader export` for the scores. nbgrader is not one of shmlab's
dependencies (it is the instructor's tool, and its own pins, `jupyter-client<9`, `notebook<8`,
would hold back a learner's if it joined the lock), so the test installs it into a throwaway
venv. That venv sees the test interpreter's site-packages through a .pth file (found at run time,
`site.addsitedir`, so their own .pth files, the editable shmlab's included, work too): pip
installs only nbgrader and the few packages the suite does not have (NBGRADER, pinned; every
other version comes from the constraints file of this Python), in about a minute instead of a
whole Jupyter stack. The kernel autograde starts is that venv's python (a cell in each
submission prints sys.executable), with Jupyter's config, data and runtime folders inside the
test's tmp_path, and pip's cache off, so nothing outside it is read or written.

Needs the package index: where pip cannot fetch nbgrader the test is skipped with pip's reason,
except under CI=true, where it fails.
"""

from __future__ import annotations

import csv
import os
import re
import shutil
import site
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

import nbformat
import pytest
from support.nbutil import REPO

import shmlab
from shmlab.labs import release

pytestmark = [pytest.mark.nbgrader, pytest.mark.slow, pytest.mark.timeout(900)]

LAB = "lab1_reducers"
# nbgrader and what it needs beyond the suite's own packages, at versions that resolve with the
# constraints files of Python 3.11-3.13 (nbgrader 0.9.6 needs Python >= 3.11).
NBGRADER = ["nbgrader==0.9.6", "alembic==1.20.1", "mako==1.4.3", "notebook==7.6.5",
            "rapidfuzz==3.14.6", "sqlalchemy==2.1.9"]
# A tempting wrong answer: a constant instead of a measurement.
WRONG = {"ex3_pickle_size": "def pickle_size(n):\n    return 100\n"}
INSTALL_TIMEOUT = 600
NBGRADER_TIMEOUT = 300
_MARKER = re.compile(r"^[ \t]*### (BEGIN|END) SOLUTION[ \t]*\n", re.M)


def _run(cmd, timeout, **kwargs) -> subprocess.CompletedProcess:
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kwargs)
    assert out.returncode == 0, (
        f"{' '.join(map(str, cmd))} exited {out.returncode}:\n{out.stdout[-4000:]}\n"
        f"{out.stderr[-4000:]}")
    return out


def _throwaway_venv(venv: Path) -> Path:
    """A venv without pip of its own that sees this interpreter's site-packages after its own."""
    _run([sys.executable, "-m", "venv", "--without-pip", venv], timeout=120)
    vpy = venv / "bin" / "python"
    inner = Path(_run([vpy, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                      timeout=60).stdout.strip())
    outer = dict.fromkeys([sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"],
                           *site.getsitepackages()])
    lines = [f"import site; site.addsitedir({p!r})" for p in outer if Path(p).is_dir()]
    (inner / "_shmlab_test_outer.pth").write_text("\n".join(lines) + "\n")
    return vpy


def _fetch_nbgrader(vpy: Path, wheels: Path) -> None:
    """Download nbgrader's wheel; skip (fail under CI) if the index cannot give it."""
    out = subprocess.run([vpy, "-m", "pip", "download", "--quiet", "--no-cache-dir", "--no-deps",
                          "-d", wheels, NBGRADER[0]],
                         capture_output=True, text=True, timeout=INSTALL_TIMEOUT)
    if out.returncode != 0:
        reason = f"the package index did not give {NBGRADER[0]}: {out.stderr.strip()[-600:]}"
        if os.environ.get("CI") == "true":
            pytest.fail(reason)
        pytest.skip(reason)


def _submission(released: Path, solutions: dict[str, str], wrong: dict[str, str], out: Path):
    """The released notebook answered: the instructor's solutions, but `wrong`'s cells."""
    nb = nbformat.read(released, as_version=4)
    for cell in nb.cells:
        gid = release.nbgrader_meta(cell).get("grade_id")
        if gid in solutions:
            cell.source = wrong.get(gid, _MARKER.sub("", solutions[gid]))
    # A learner's own extra cell (nbgrader keeps it): which python the kernel is.
    nb.cells.append(nbformat.v4.new_code_cell("import sys\nprint('kernel:', sys.executable)"))
    out.parent.mkdir(parents=True)
    nbformat.write(nb, out)


def _kernel_of(autograded: Path) -> str:
    nb = nbformat.read(autograded, as_version=4)
    text = "".join(o.get("text", "") for o in nb.cells[-1].outputs)
    return text.removeprefix("kernel:").strip()


@pytest.mark.skipif(sys.version_info < (3, 11), reason="nbgrader 0.9.6 needs Python >= 3.11")
def test_nbgrader_generates_and_autogrades_a_lab_unchanged(tmp_path):
    # nbgrader 0.9.6 leaves six tempfile.mkdtemp() directories behind per autograde: it gets a
    # TMPDIR of its own that goes with the rest. A short one: the lab's checks bind UNIX
    # sockets in it, and a socket's path must fit in 107 bytes (tmp_path's is too deep).
    scratch = Path(tempfile.mkdtemp(prefix="nbg-"))
    try:
        _generate_and_autograde(tmp_path, scratch)
    finally:  # the venv and the course (about 60 MB) go at once, not with pytest's tmp
        for folder in [*tmp_path.iterdir(), scratch]:
            shutil.rmtree(folder, ignore_errors=True)


def _generate_and_autograde(tmp_path: Path, scratch: Path) -> None:
    started = time.monotonic()
    vpy = _throwaway_venv(tmp_path / "venv")
    wheels = tmp_path / "wheels"
    _fetch_nbgrader(vpy, wheels)
    pins = REPO / "requirements" / "constraints-py{}.{}.txt".format(*sys.version_info[:2])
    _run([vpy, "-m", "pip", "install", "--quiet", "--no-cache-dir", "--find-links", wheels,
          "-c", pins, *NBGRADER], timeout=INSTALL_TIMEOUT)
    installed = time.monotonic() - started

    jupyter = tmp_path / "jupyter"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JUPYTER", "VIRTUAL_ENV"))}
    env.update(
        PATH=f"{vpy.parent}{os.pathsep}{env.get('PATH', '')}",
        # the shmlab under test, in nbgrader and in its kernels
        PYTHONPATH=os.pathsep.join(filter(None, [str(Path(shmlab.__file__).parents[1]),
                                                 env.get("PYTHONPATH")])),
        JUPYTER_CONFIG_DIR=str(jupyter / "config"), JUPYTER_DATA_DIR=str(jupyter / "data"),
        JUPYTER_RUNTIME_DIR=str(jupyter / "runtime"), JUPYTER_PATH="",
        IPYTHONDIR=str(jupyter / "ipython"), TMPDIR=str(scratch))
    course = tmp_path / "course"
    _run([vpy, "-m", "shmlab.labs", "nbgrader-course", course], timeout=120, env=env)

    started = time.monotonic()
    nbgrader = vpy.parent / "nbgrader"
    _run([nbgrader, "generate_assignment", LAB], timeout=NBGRADER_TIMEOUT, env=env, cwd=course)
    released = course / "release" / LAB / f"{LAB}.ipynb"
    # shmlab's own release (labs/) is what nbgrader releases, cell by cell.
    ours = nbformat.read(REPO / "labs" / f"{LAB}.ipynb", as_version=4)
    assert [c.source for c in nbformat.read(released, as_version=4).cells] == [
        c.source for c in ours.cells]

    source = release.read(course / "source" / LAB / f"{LAB}.ipynb")
    solutions = {release.nbgrader_meta(c)["grade_id"]: c.source for c in source.cells
                 if release.nbgrader_meta(c).get("solution")}
    points = {release.nbgrader_meta(c)["grade_id"]: release.nbgrader_meta(c)["points"]
              for c in source.cells if release.nbgrader_meta(c).get("grade")}
    for student, wrong in (("correct", {}), ("wrong", WRONG)):
        _submission(released, solutions, wrong, course / "submitted" / student / LAB /
                    f"{LAB}.ipynb")
    _run([nbgrader, "autograde", LAB], timeout=NBGRADER_TIMEOUT, env=env, cwd=course)
    _run([nbgrader, "export"], timeout=NBGRADER_TIMEOUT, env=env, cwd=course)
    graded = time.monotonic() - started
    with open(course / "grades.csv", newline="") as f:
        rows = {r["student_id"]: r for r in csv.DictReader(f)}
    scores = {s: (float(r["score"]), float(r["max_score"])) for s, r in rows.items()}
    print(f"\n[nbgrader] install {installed:.0f} s, generate + autograde x2 + export "
          f"{graded:.0f} s; scores {scores}")

    full = float(sum(points.values()))
    assert scores["correct"] == (full, full), scores
    assert scores["wrong"] == (full - points["test_ex3_pickle_size"], full), scores
    for student in rows:
        kernel = _kernel_of(course / "autograded" / student / LAB / f"{LAB}.ipynb")
        assert Path(kernel) == vpy, f"autograde ran {student}'s kernel on {kernel}, not {vpy}"
