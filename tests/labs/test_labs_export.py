"""Hand-outs: the nbgrader course layout and the student bundle."""

from __future__ import annotations

import subprocess
import sys

import nbformat

from shmlab.labs import export, integrity, release


def test_nbgrader_course_lays_out_source_per_assignment(tmp_path):
    export.nbgrader_course(tmp_path)
    for src in release.sources():
        copied = tmp_path / "source" / src.stem / src.name
        assert copied.read_bytes() == src.read_bytes()
    config = (tmp_path / "nbgrader_config.py").read_text()
    assert "c.CourseDirectory.course_id" in config
    compile(config, "nbgrader_config.py", "exec")


def test_student_bundle_has_no_instructor_material(tmp_path):
    out = subprocess.run([sys.executable, "-m", "shmlab.labs", "release", "--student",
                          str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == sorted([p.name for p in release.sources()] + ["README.md"])
    for p in tmp_path.glob("*.ipynb"):
        text = p.read_text()
        assert "BEGIN SOLUTION" not in text and "HIDDEN TESTS" not in text
        nbformat.validate(nbformat.reads(text, as_version=4))
    assert integrity.SUMS not in names
