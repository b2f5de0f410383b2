"""Hand-outs: an nbgrader course folder, and a student bundle with no instructor material.

Mirrors: nbgrader's course directory (``source/<assignment>/<notebook>.ipynb`` and
``nbgrader_config.py``), which ``nbgrader generate_assignment`` and ``autograde`` read as is:
the instructor copies already use nbgrader's delimiters and cell metadata.
"""

from __future__ import annotations

from pathlib import Path

import nbformat

from . import integrity
from .release import SOURCE, release_notebook

CONFIG = '''# Written by `python -m shmlab.labs nbgrader-course`: shmlab's labs for nbgrader.
c = get_config()  # noqa: F821 (nbgrader defines it)
c.CourseDirectory.course_id = "shmlab"
c.CourseDirectory.root = __file__.rsplit("/", 1)[0]
# The test cells import shmlab.labs: install shmlab in the kernel that autograde starts.
# Their checks start processes; on a busy machine a cell may need more than nbgrader's default
# 30 s (shmlab's own grader allows 120 s a cell).
c.ExecutePreprocessor.timeout = 120
'''

STUDENT_README = """# shmlab labs

Open each notebook in JupyterLab (with shmlab installed: `pip install shmlab`), run the set-up
cell, fill in each answer cell and run the check cell after it. Hand in the notebooks as they
are; your instructor grades them with `python -m shmlab.labs grade`.
"""


def nbgrader_course(out_dir, source_dir=SOURCE) -> list[Path]:
    """Lay out ``out_dir/source/<lab>/<lab>.ipynb`` (verified copies) and nbgrader_config.py."""
    out_dir = Path(out_dir)
    written = []
    for name, data in sorted(integrity.load_sources(source_dir).items()):
        target = out_dir / "source" / Path(name).stem / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        written.append(target)
    (out_dir / "nbgrader_config.py").write_text(CONFIG, encoding="utf-8")
    return [*written, out_dir / "nbgrader_config.py"]


def student_bundle(out_dir, source_dir=SOURCE) -> list[Path]:
    """The learner copies and a README in ``out_dir``; no solution or hidden test in any file."""
    out_dir = Path(out_dir)
    if out_dir.resolve() == Path(str(source_dir)).resolve():
        raise ValueError(f"{out_dir} holds the instructor copies: choose another folder")
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, data in sorted(integrity.load_sources(source_dir).items()):
        nb = release_notebook(nbformat.reads(data.decode("utf-8"), as_version=4))
        text = nbformat.writes(nb)
        if "BEGIN SOLUTION" in text or "BEGIN HIDDEN TESTS" in text:
            raise ValueError(f"{name}: a solution or hidden-test region survived the release")
        (out_dir / name).write_text(text, encoding="utf-8")
        written.append(out_dir / name)
    (out_dir / "README.md").write_text(STUDENT_README, encoding="utf-8")
    return [*written, out_dir / "README.md"]

