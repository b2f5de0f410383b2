"""Which language shmlab prints in: argument, SHMLAB_LANG, a zh folder, else English."""

from __future__ import annotations

import pytest

from shmlab import messages
from shmlab.messages import language, tr


def test_the_choice_order(monkeypatch, tmp_path):
    monkeypatch.delenv("SHMLAB_LANG", raising=False)
    (tmp_path / "zh").mkdir()
    monkeypatch.chdir(tmp_path)
    assert language() == "en"
    monkeypatch.chdir(tmp_path / "zh")  # where Jupyter starts a Chinese notebook's kernel
    assert language() == "zh"
    monkeypatch.setenv("SHMLAB_LANG", "en")
    assert language() == "en"
    assert language("zh_CN") == "zh"


def test_an_unknown_language_says_what_to_use(monkeypatch):
    monkeypatch.setenv("SHMLAB_LANG", "fr")
    with pytest.raises(ValueError, match="use one of"):
        language()


def test_tr_formats_in_either_language(monkeypatch):
    monkeypatch.delenv("SHMLAB_LANG", raising=False)
    msg = "no fd is left open ({n} left)"
    assert tr(msg, lang="en", n=2) == "no fd is left open (2 left)"
    assert tr(msg, lang="zh", n=2) == "没有留下打开的 fd（还剩 2 个）"
    assert tr("a message nobody translated", lang="zh") == "a message nobody translated"
    assert messages.N_("again") == "again"


def test_the_quiz_labels_follow_its_language_switch(monkeypatch, tmp_path):
    monkeypatch.setenv("SHMLAB_DRILL_DIR", str(tmp_path))
    monkeypatch.delenv("SHMLAB_LANG", raising=False)
    from shmlab.drill import Quiz

    quiz = Quiz()
    assert quiz.lang == "both" and quiz.reveal_button.description == "Reveal / 显示答案"
    assert [b.description for b in quiz.grade_buttons] == ["again", "hard", "good", "easy"]
    quiz.set_lang("zh")
    assert quiz.reveal_button.description == "显示答案"
    assert quiz.lang_buttons.description == "语言"
    assert [b.description for b in quiz.grade_buttons] == ["重来", "困难", "良好", "简单"]
    assert "已掌握" in quiz.chart.value
    quiz.set_lang("en")
    assert quiz.reveal_button.description == "Reveal / 显示答案"
    monkeypatch.setenv("SHMLAB_LANG", "zh")
    assert Quiz().lang == "zh"  # in the Chinese edition the quiz starts in 中文
