"""The labs: nbgrader-format sources, released learner copies, hidden test cells and the grader."""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import nbformat
import pytest
from support.nbutil import REPO

from shmlab.labs import grade, release

SOURCES = release.sources()  # the instructor copies: package data in shmlab/labs/source/
LEARNER = REPO / "labs"  # the released learner copies, checked in
LAB_IDS = [p.stem for p in SOURCES]

# One plausible wrong answer per lab: (solution grade_id, wrong code, the hint it must get).
WRONG = {
    "lab1_reducers": ("ex2_tensor_reducer", """
def my_rebuild_tensor(storage, offset, shape, strides, dtype):
    return shmlab.Tensor(storage, offset, shape, strides, dtype)


def my_reduce_tensor(t):
    # wrong: sends a copy of the data, not the storage
    return (shmlab.from_numpy, (t.numpy().copy(),))
""", "pass t.untyped_storage()"),
    "lab2_file_descriptors": ("ex3_rebuild_cache", """
def rebuild_storage_fd(fd, size, cache):
    if fd in cache:  # wrong: the fd number names nothing for long
        return cache[fd]
    cache[fd] = shmlab.UntypedStorage._new_shared_fd_cpu(fd, size)
    return cache[fd]
""", "key the cache by os.fstat(fd)"),
    "lab3_file_system_refcount": ("ex1_attach_close", """
def attach(name, size):
    fd = shm_open(name, os.O_RDWR, 0o600)
    try:
        write_count(fd, read_count(fd) + 1)
        return mmap.mmap(fd, HEADER_SIZE + size)
    finally:
        os.close(fd)


def close(name, mapping):
    fd = shm_open(name, os.O_RDWR, 0o600)
    try:
        write_count(fd, read_count(fd) - 1)  # wrong: never unlinks, even at 0
    finally:
        os.close(fd)
    mapping.close()
""", "when your decrement brings the count to 0, shm_unlink(name)"),
    "lab4_shm_manager": ("ex1_reclaim", """
def reclaim(registered):
    for name in registered:
        if os.path.exists("/dev/shm/" + name):
            os.unlink("/dev/shm/" + name)
    return list(registered)  # wrong: claims names that were already gone
""", "skip FileNotFoundError"),
    "lab5_hogwild": ("ex1_worker", """
import copy


def train_worker(rank, world, model, data, epochs):
    torch.set_num_threads(1)
    model = copy.deepcopy(model)  # wrong: trains a private copy
    x, y = data.x_train[rank::world], data.y_train[rank::world]
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.5)
    for _ in range(epochs):
        for i in range(0, len(x), 32):
            optimizer.zero_grad()
            F.cross_entropy(model(x[i:i + 32]), y[i:i + 32]).backward()
            optimizer.step()
""", "don't copy the model"),
}


def _meta(cell) -> dict:
    return cell.metadata.get("nbgrader", {})


def _with_answer(lab: str, grade_id: str, code: str, tmp_path: Path) -> Path:
    """The instructor notebook with one answer replaced, saved as a learner would."""
    nb = release.read(release.SOURCE / f"{lab}.ipynb")
    for cell in nb.cells:
        if _meta(cell).get("grade_id") == grade_id:
            cell.source = code.strip()
    out = tmp_path / f"{lab}.ipynb"
    nbformat.write(nb, out)
    return out


def test_every_lab_is_here():
    assert LAB_IDS == ["lab1_reducers", "lab2_file_descriptors", "lab3_file_system_refcount",
                       "lab4_shm_manager", "lab5_hogwild"]


def test_learner_copies_are_up_to_date():
    stale = release.out_of_date(out_dir=LEARNER)
    assert not stale, f"run `python -m shmlab.labs release`: {stale} are out of date"


@pytest.mark.parametrize("path", SOURCES, ids=LAB_IDS)
def test_nbgrader_metadata_is_valid(path):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    ids = [_meta(c)["grade_id"] for c in nb.cells if _meta(c)]
    assert len(ids) == len(set(ids)), "grade_ids must be unique"
    graded = [c for c in nb.cells if _meta(c).get("grade")]
    assert 3 <= len(graded) <= 6, "each lab has 3-6 exercises"
    for cell in nb.cells:
        m = _meta(cell)
        if not m:
            continue
        assert m["schema_version"] == 3
        if m.get("grade"):
            assert cell.cell_type == "code" and m["points"] > 0 and m["locked"]
            assert cell.metadata["jupyter"]["source_hidden"] is True
            assert "hidden-test" in cell.metadata["tags"]
        if m.get("solution"):
            assert not m["locked"] and "### BEGIN SOLUTION" in cell.source
    text = "".join(c.source for c in nb.cells if c.cell_type == "markdown")
    assert "**Goals.**" in text and "**Time.**" in text and "notebook `0" in text


@pytest.mark.parametrize("path", SOURCES, ids=LAB_IDS)
def test_released_copy_hides_solutions_and_grader_only_tests(path):
    learner = nbformat.read(LEARNER / path.name, as_version=4)
    text = "\n".join(c.source for c in learner.cells)
    assert "BEGIN SOLUTION" not in text and "HIDDEN TESTS" not in text
    assert text.count("raise NotImplementedError()") >= 1
    assert all(not c.get("outputs") for c in learner.cells if c.cell_type == "code")


@pytest.mark.timeout(300)
@pytest.mark.parametrize("path", SOURCES, ids=LAB_IDS)
def test_instructor_copy_scores_full_marks(path):
    result = grade.grade(path)
    assert result.score == result.max_score > 0, [e for e in result.exercises if e.error]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("path", SOURCES, ids=LAB_IDS)
def test_learner_copy_fails_every_exercise_and_scores_zero(path):
    result = grade.grade(LEARNER / path.name)
    assert result.score == 0 and len(result.exercises) >= 3
    for e in result.exercises:
        assert "not implemented yet" in e.output, (e.grade_id, e.output, e.error)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("lab", LAB_IDS)
def test_a_plausible_wrong_answer_gets_partial_marks_and_the_right_hint(lab, tmp_path):
    grade_id, code, hint = WRONG[lab]
    result = grade.grade(_with_answer(lab, grade_id, code, tmp_path))
    assert 0 < result.score < result.max_score
    failed = {e.grade_id: e for e in result.exercises if e.score < e.points}
    # The exercise answered wrongly fails with the hint that teaches the fix (later exercises
    # that build on the same function may fail too; earlier ones still score).
    target = failed[f"test_{grade_id}"]
    assert hint in target.output, target.output


@pytest.mark.timeout(300)
def test_edited_or_deleted_test_cells_are_restored(tmp_path):
    lab = "lab2_file_descriptors"
    wrong = WRONG[lab][1]
    path = _with_answer(lab, "ex3_rebuild_cache", wrong, tmp_path)
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        if _meta(cell).get("grade_id") == "test_ex3_rebuild_cache":
            cell.source = "print('all good')"  # a learner 'fixes' the test
    nb.cells = [c for c in nb.cells if _meta(c).get("grade_id") != "test_ex1_unlinked_segment"]
    nbformat.write(nb, path)
    result = grade.grade(path)
    by_id = {e.grade_id: e for e in result.exercises}
    assert set(by_id) == {"test_ex1_unlinked_segment", "test_ex2_fd_passing",
                          "test_ex3_rebuild_cache", "test_ex4_fd_ledger"}
    assert by_id["test_ex1_unlinked_segment"].score == 2  # deleted, restored, and it passes
    assert by_id["test_ex3_rebuild_cache"].score == 0  # the edit did not help


def test_plan_keeps_learner_helper_cells_and_ignores_relabelling():
    source = release.read(release.SOURCE / "lab1_reducers.ipynb")
    learner = copy.deepcopy(source)
    idx = next(i for i, c in enumerate(learner.cells)
               if _meta(c).get("grade_id") == "ex3_pickle_size")
    learner.cells.insert(idx + 1, nbformat.v4.new_code_cell("helper = 1"))
    learner.cells[idx].metadata["nbgrader"]["points"] = 100  # relabelled: ignored
    jobs = {j["grade_id"]: j for j in grade.plan(source, learner)}
    assert all(j["points"] < 100 for j in jobs.values())
    ex3 = [c for c in jobs["test_ex3_pickle_size"]["cells"] if c["role"] == "answer"]
    assert [c["source"] for c in ex3][-1] == "helper = 1"
    # An exercise runs the instructor's answers to the others, never the learner's.
    ex1 = jobs["test_ex1_point_reducer"]["cells"]
    assert not any(c["source"] == "helper = 1" for c in ex1)


@pytest.mark.timeout(300)
def test_cli_grade_json_and_exit_status():
    learner = LEARNER / "lab1_reducers.ipynb"
    out = subprocess.run([sys.executable, "-m", "shmlab.labs", "grade", "--json", str(learner)],
                         capture_output=True, text=True, timeout=240)
    assert out.returncode == 1
    (row,) = json.loads(out.stdout)
    assert row["score"] == 0 and row["max_score"] == 6
    check = subprocess.run([sys.executable, "-m", "shmlab.labs", "release", "--check"],
                           capture_output=True, text=True, timeout=60, cwd=REPO)
    assert check.returncode == 0, check.stdout


def test_grading_an_unknown_notebook_says_what_to_do(tmp_path):
    stray = tmp_path / "my_notes.ipynb"
    nbformat.write(nbformat.v4.new_notebook(), stray)
    result = grade.grade(stray)
    assert result.score == 0 and "name it like one of lab1_reducers.ipynb" in result.problem


# --- grading from an installed wheel, outside the checkout --------------------------------------
def _wheel_env(target: Path) -> dict:
    """PYTHONPATH = the wheel's target dir + this venv's site-packages (deps) only.

    Run with ``python -S``: no site-packages .pth files, so the editable install of the checkout
    is not on the path either; only the kernel the grader starts (a plain ``python``) processes
    them, and there the target dir comes first.
    """
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    site = sysconfig.get_paths()["purelib"]
    env.update(PYTHONPATH=os.pathsep.join([str(target), site]), PYTHONNOUSERSITE="1")
    return env


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_grading_works_from_an_installed_wheel(tmp_path):
    src = tmp_path / "src"  # build from a copy, so the checkout gets no build/ or egg-info
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    shutil.copytree(REPO / "shmlab", src / "shmlab",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input"]
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q",
                    "-w", str(tmp_path / "dist"), str(src)], check=True, timeout=180)
    (wheel,) = (tmp_path / "dist").glob("shmlab-*.whl")
    target = tmp_path / "target"
    subprocess.run([*pip, "install", "--no-deps", "--no-index", "-q", "--target", str(target),
                    str(wheel)], check=True, timeout=120)

    work = tmp_path / "elsewhere"  # the instructor's folder: no checkout in sight
    (work / "solved").mkdir(parents=True)
    shutil.copy(LEARNER / "lab1_reducers.ipynb", work / "lab1_reducers.ipynb")  # the stubs
    shutil.copy(release.SOURCE / "lab1_reducers.ipynb", work / "solved" / "lab1_reducers.ipynb")
    env, python = _wheel_env(target), [sys.executable, "-S"]
    where = subprocess.run(
        [*python, "-c", "import shmlab, shmlab.labs.release as r; print(shmlab.__file__); "
                        "print(r.SOURCE)"],
        cwd=work, env=env, capture_output=True, text=True, timeout=60, check=True)
    module, source = where.stdout.split()
    assert module.startswith(str(target)) and source.startswith(str(target)), where.stdout

    out = subprocess.run(
        [*python, "-m", "shmlab.labs", "grade", "--json", "lab1_reducers.ipynb",
         "solved/lab1_reducers.ipynb"],
        cwd=work, env=env, capture_output=True, text=True, timeout=240)
    rows = {row["notebook"]: row for row in json.loads(out.stdout)}
    assert out.returncode == 1, out.stderr  # not full marks: the stubs score nothing
    stubs, solved = rows["lab1_reducers.ipynb"], rows["solved/lab1_reducers.ipynb"]
    assert stubs["score"] == 0 and stubs["max_score"] == 6, stubs
    assert solved["score"] == solved["max_score"] == 6, solved


# --- IPython syntax in answer cells (runner's Note [Magics in graded cells]) --------------------
def test_harmless_magics_become_python_and_the_rest_are_refused_by_line():
    from shmlab.labs.runner import _plain_python, _Unsupported

    assert _plain_python("%time x = f()")[0] == "x = f()"
    assert _plain_python("def g():\n    %timeit -n 10 -r 2 f()")[0] == "def g():\n    f()"
    assert _plain_python("%%time\nx = 1")[0] == "\nx = 1"
    assert _plain_python("%matplotlib inline")[0] == "pass"
    assert _plain_python('s = "%d" % 3') == ('s = "%d" % 3', [])  # compiles: never touched
    assert _plain_python("def f(:\n    pass")[1] == []  # a plain SyntaxError stays itself
    for src, line in [("x = 1\n!ls", 2), ("%%bash\nls", 1), ("files = !ls", 1), ("len?", 1),
                      ("%run other.ipynb", 1), ("%time x = 1\n%cd /tmp", 2)]:
        with pytest.raises(_Unsupported, match=f"line {line}:"):
            _plain_python(src)


@pytest.mark.timeout(300)
def test_magics_in_a_graded_cell_are_run_or_explained(tmp_path):
    lab, gid = "lab1_reducers", "ex3_pickle_size"
    source = release.read(release.SOURCE / f"{lab}.ipynb")
    answer = next(c.source for c in source.cells if _meta(c).get("grade_id") == gid)
    timed = answer.replace("print(pickle_size(10)", "%time print(pickle_size(10)")
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    ok = grade.grade(_with_answer(lab, gid, timed, tmp_path / "a"), only={f"test_{gid}"})
    (ex,) = ok.exercises
    assert ex.score == ex.points == 1, ex
    assert "as plain Python" in ex.output, ex.output  # it says what it ran instead

    shell = "!ls /dev/shm\n" + answer
    bad = grade.grade(_with_answer(lab, gid, shell, tmp_path / "b"), only={f"test_{gid}"})
    (ex,) = bad.exercises
    assert ex.score == 0
    assert "line 1: !ls /dev/shm" in ex.error and "not supported" in ex.error, ex.error
    assert "subprocess.run" in ex.error, ex.error  # ... and what to write instead


def test_fd_count_ignores_the_pollers_proc_reads_but_not_a_real_fd(tmp_path):
    # The Cases poller (psutil) lists /proc from another thread: a directory fd on "/proc"
    # itself for a moment. Counted, it made lab2 ex4's instructor copy lose marks 1 run in 6.
    from shmlab.labs.report import fd_count

    before = fd_count()
    d = os.open("/proc", os.O_RDONLY | os.O_DIRECTORY)
    s = os.open("/proc/self/stat", os.O_RDONLY)
    f = os.open(tmp_path / "x", os.O_CREAT | os.O_RDWR)
    try:
        assert fd_count() == before + 1
    finally:
        for fd in (d, s, f):
            os.close(fd)
