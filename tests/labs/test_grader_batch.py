"""A batch survives its notebooks: a dead runner, a hang or a misnamed notebook is one row."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
from test_grader_cheats import notebook

from shmlab.labs import grade, release

LAB = "lab1_reducers"


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_a_batch_with_a_dead_kernel_a_hang_and_a_misnamed_notebook_has_a_row_for_each(tmp_path):
    folders = [tmp_path / n for n in ("dead", "hang", "ok")]
    for f in folders:
        f.mkdir()
    dead = notebook(LAB, {"ex1_point_reducer": "import os\nos._exit(0)"}, folders[0])
    hang = notebook(LAB, {"ex2_tensor_reducer": "import time\ntime.sleep(600)"}, folders[1])
    ok = notebook(LAB, {}, folders[2])
    misnamed = tmp_path / "lab1.ipynb"
    misnamed.write_bytes(ok.read_bytes())
    out = subprocess.run([sys.executable, "-m", "shmlab.labs", "grade", "--json",
                          "--timeout", "20", str(dead), str(hang), str(misnamed), str(ok)],
                         capture_output=True, text=True, timeout=360)
    assert out.returncode == 1, out.stderr
    rows = {r["notebook"]: r for r in json.loads(out.stdout)}
    assert len(rows) == 4
    dead_ex = {e["grade_id"]: e for e in rows[str(dead)]["exercises"]}
    assert dead_ex["test_ex1_point_reducer"]["score"] == 0
    assert "died" in dead_ex["test_ex1_point_reducer"]["error"]
    assert dead_ex["test_ex2_tensor_reducer"]["score"] == 3  # the others are still graded
    hang_ex = {e["grade_id"]: e for e in rows[str(hang)]["exercises"]}
    assert "time limit" in hang_ex["test_ex2_tensor_reducer"]["error"]
    assert hang_ex["test_ex3_pickle_size"]["score"] == 1
    assert "name it like one of" in rows[str(misnamed)]["problem"]
    assert rows[str(ok)]["score"] == rows[str(ok)]["max_score"] == 6


@pytest.mark.timeout(200)
def test_the_notebook_time_limit_stops_a_notebook_not_the_batch(tmp_path):
    hang = notebook(LAB, {"ex1_point_reducer": "import time\ntime.sleep(600)"}, tmp_path)
    start = time.monotonic()
    result = grade.grade(hang, timeout=300, notebook_timeout=8)
    assert time.monotonic() - start < 60
    assert result.score == 0
    assert all("time limit" in e.error for e in result.exercises), result.as_dict()


def test_an_unreadable_notebook_is_a_row(tmp_path):
    bad = tmp_path / f"{LAB}.ipynb"
    bad.write_text("{not json")
    (result,) = grade.grade_batch([bad], release.SOURCE)
    assert result.score == 0 and "not a readable notebook" in result.problem


@pytest.mark.timeout(60)
def test_a_notebook_that_cannot_be_graded_fails_the_command(tmp_path):
    # 0/0 is not full marks: a misnamed or missing notebook must not exit 0.
    for path in (tmp_path / "lab1.ipynb", tmp_path / "lab1_reducers.ipynb"):
        if path.name == "lab1.ipynb":
            path.write_text("{}")
        out = subprocess.run([sys.executable, "-m", "shmlab.labs", "grade", "--json", str(path)],
                             capture_output=True, text=True, timeout=50)
        assert out.returncode == 1, (path.name, out.stdout, out.stderr)
        assert json.loads(out.stdout)[0]["problem"], out.stdout
