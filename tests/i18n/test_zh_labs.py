"""A Chinese lab is graded with the same checks and marks as the English, in Chinese."""

from __future__ import annotations

import nbformat
import pytest
from support.nbutil import REPO

from shmlab.i18n import build, catalog
from shmlab.labs import grade

LABS = [s for s in catalog.sources(REPO) if s.kind == "labs"
        and s.stem in build.built_stems(REPO)]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("src", LABS, ids=lambda s: s.stem)
def test_the_chinese_instructor_copy_scores_full_marks_in_chinese(src, tmp_path):
    folder = tmp_path / "zh"  # as labs/zh/: the kernel's folder says the language too
    folder.mkdir()
    path = folder / f"{src.stem}.ipynb"
    nbformat.write(build.build_notebook(src), str(path))
    result = grade.grade(path)
    english = grade.grade(src.english)
    assert result.language == "zh"
    assert result.score == result.max_score == english.max_score > 0, result.as_dict()
    assert [e.grade_id for e in result.exercises] == [e.grade_id for e in english.exercises]
    text = "".join(e.output for e in result.exercises)
    assert "✅" in text and "通过" in text and "cases passed" not in text, text


@pytest.mark.timeout(300)
@pytest.mark.parametrize("src", LABS, ids=lambda s: s.stem)
def test_the_chinese_learner_copy_scores_zero_and_says_why_in_chinese(src, capsys):
    path = build.out_path(src)
    result = grade.grade(path)
    assert result.score == 0 and result.max_score > 0, result.as_dict()
    assert all("还没有实现" in e.error for e in result.exercises), \
        [e.error for e in result.exercises]
    grade.print_table(result)
    assert "总分 0/" in capsys.readouterr().out
