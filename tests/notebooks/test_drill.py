"""The drill's scheduling, saved state, terminal mode and exports (no browser, no kernel).

Every test gets its own data dir through SHMLAB_DRILL_DIR, so nothing touches the real one.
"""

from __future__ import annotations

import csv
import html
import io
import json
import sqlite3
import zipfile

import pytest

from shmlab.drill import Deck, Scheduler, bank, cli, export, notebooks, state
from shmlab.drill.schedule import AGAIN_DELAY, DAY

IDS = [f"q1-card-{i}" for i in range(10)]


@pytest.fixture(autouse=True)
def data_dir(tmp_path, monkeypatch):
    monkeypatch.setenv(state.ENV, str(tmp_path / "data"))
    return tmp_path / "data"


class Clock:
    def __init__(self, t=1_000_000.0):
        self.t = t

    def __call__(self):
        return self.t


# --- scheduling ---------------------------------------------------------------------------------
@pytest.mark.claim("C25.417")
def test_a_card_graded_again_comes_back_before_one_graded_easy():
    s = Scheduler(IDS, seed=1)
    now = 0.0
    first = s.next_card(now)
    s.grade(first, "again", now)
    second = s.next_card(now)
    s.grade(second, "easy", now)
    order = []
    for step in range(1, 200):  # walk the calendar forward an hour at a time, no new cards
        now = step * 3600.0
        card = s.next_card(now, allow_new=False)
        if card is not None:
            if card not in order:
                order.append(card)
            s.grade(card, "good", now)
    assert order == [first, second]


@pytest.mark.claim("C25.417")
@pytest.mark.parametrize("grade, box, delay", [("again", 1, AGAIN_DELAY), ("hard", 1, DAY / 2),
                                               ("good", 2, 3 * DAY), ("easy", 3, 7 * DAY)])
def test_each_grade_moves_the_card_between_boxes(grade, box, delay):
    s = Scheduler(IDS)
    new = s.grade(IDS[0], grade, 100.0)
    assert (new["box"], new["due"], new["reviews"], new["last"]) == (box, 100.0 + delay, 1, grade)


@pytest.mark.claim("C25.417")
def test_boxes_stop_at_5_and_a_bad_grade_is_refused():
    s = Scheduler(IDS)
    for _ in range(4):
        s.grade(IDS[0], "easy", 0.0)
    assert s.state[IDS[0]]["box"] == 5
    with pytest.raises(ValueError):
        s.grade(IDS[0], "perfect", 0.0)


def _session(seed, grades):
    s, asked = Scheduler(IDS, seed=seed), []
    for i, g in enumerate(grades):
        card = s.next_card(i * 30.0)
        asked.append(card)
        s.grade(card, g, i * 30.0)
    return asked


def test_the_order_is_deterministic_with_a_seed():
    grades = ["again", "good", "hard", "easy", "again", "good", "good", "again", "easy", "good"]
    assert _session(7, grades) == _session(7, grades)
    assert _session(7, grades) != _session(8, grades)


def test_an_again_card_returns_in_the_same_session_once_new_cards_run_out():
    s = Scheduler(IDS[:2])
    s.grade(IDS[0], "again", 0.0)
    s.grade(IDS[1], "good", 0.0)
    assert s.next_card(1.0) == IDS[0]  # not due yet, but within the look-ahead
    assert s.next_card(DAY) == IDS[0]


def test_a_fresh_deck_asks_foundations_first_one_question_at_a_time():
    deck, asked = Deck(clock=Clock(), seed=0), []
    while deck.current() is not None:
        asked.append(deck.current())
        deck.grade("easy")
    levels = [c.level for c in asked]
    juniors = levels.count("junior")
    assert juniors and levels == ["junior"] * juniors + ["senior"] * (len(levels) - juniors)
    questions = {c.question for c in asked if c.level == "junior"}
    first = [c.question for c in asked[:len(questions)]]
    assert sorted(first) == sorted(questions), f"the first cards repeat a question: {first}"


# --- state --------------------------------------------------------------------------------------
def test_state_is_saved_in_the_data_dir_and_read_back(data_dir):
    clock = Clock()
    deck = Deck(clock=clock, seed=3)
    first = deck.current()
    deck.grade("easy")
    assert state.path() == data_dir / "drill.json" and state.path().is_file()
    again = Deck(clock=clock, seed=3)
    assert again.scheduler.state[first.id]["box"] == 3
    assert again.sessions == 2
    assert again.current().id != first.id  # the easy card is not due for a week
    assert again.progress()[first.question]["known"] == 1


def test_without_the_override_state_goes_to_the_platform_user_data_dir(monkeypatch):
    import platformdirs

    monkeypatch.delenv(state.ENV)
    assert state.data_dir() == __import__("pathlib").Path(
        platformdirs.user_data_dir("shmlab", False))


def test_the_deck_filters_by_question_and_stops_at_its_limit():
    deck = Deck(questions=["Q3"], limit=2, clock=Clock())
    assert deck.current().question == "Q3"
    deck.grade("good")
    assert deck.grade("good") is None and deck.current() is None
    assert sum(row["total"] for row in deck.progress().values()) == len(bank.load())


# --- the terminal mode --------------------------------------------------------------------------
def run_cli(args, typed: str):
    out = io.StringIO()
    rc = cli.main(args, stdin=io.StringIO(typed), out=out)
    return rc, out.getvalue()


def test_the_terminal_mode_asks_reveals_grades_and_saves():
    typed = "\n3\nmy answer\n1\n\nnot a grade\neasy\n"
    rc, text = run_cli(["--cards", "3", "--lang", "both", "--seed", "0"], typed)
    assert rc == 0
    assert text.count("your answer (Enter to reveal)>") == 3
    assert "type 1, 2, 3 or 4" in text and "3 card(s) graded" in text
    assert "see notebooks/" in text and "✗ " in text
    saved = state.load()["cards"]
    assert sorted(s["last"] for s in saved.values()) == ["again", "easy", "good"]
    asked = [c for c in bank.load() if c.id in saved]
    assert all(c.prompt["en"] in text and c.prompt["zh"] in text for c in asked)


def test_a_card_shows_the_claims_it_cites_after_its_answer(tmp_path):
    data = bank.raw()
    data["cards"] = [{**data["cards"][0], "claims": ["C1.3", "C12.12"]}]
    path = tmp_path / "bank.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    (card,) = bank.load(path)
    assert card.claims == ("C1.3", "C12.12")
    out = io.StringIO()
    answers = iter(["", "q"])
    cli.ask(card, "en", lambda prompt: next(answers), out)
    assert "(claims C1.3, C12.12)" in out.getvalue()
    assert out.getvalue().index(card.answer["en"]) < out.getvalue().index("C12.12")


def test_the_terminal_mode_in_one_language_and_quitting_early():
    rc, text = run_cli(["--cards", "5", "--lang", "zh"], "\nq\n")
    (asked,) = [c for c in bank.load() if c.prompt["zh"] in text]
    assert asked.prompt["en"] not in text and asked.answer["zh"] in text
    assert "0 card(s) graded" in text and state.load()["cards"] == {}
    rc, text = run_cli(["--cards", "5"], "")  # end of input at once
    assert rc == 0 and "0 card(s) graded" in text


def test_the_terminal_mode_in_chinese_links_the_chinese_notebook(monkeypatch):
    monkeypatch.setenv("SHMLAB_LANG", "zh")
    rc, text = run_cli(["--cards", "1"], "\nq\n")
    (asked,) = [c for c in bank.load() if c.prompt["zh"] in text]
    assert asked.prompt["en"] not in text  # SHMLAB_LANG=zh: Chinese only, like the quiz
    assert f"见 notebooks/zh/{notebooks.zh_link(asked.link)}" in text  # the prompts: Chinese
    monkeypatch.delenv("SHMLAB_LANG")
    rc, text = run_cli(["--cards", "1"], "\nq\n")
    assert f"see notebooks/{asked.link}" in text  # the English link, as before


def test_progress_lists_every_question():
    run_cli(["--cards", "1"], "\n4\n")
    rc, text = run_cli(["--progress"], "")
    assert [line.split()[0] for line in text.splitlines()] == list(bank.QUESTIONS)


# --- exports ------------------------------------------------------------------------------------
def test_csv_export_has_every_card_in_both_languages(tmp_path):
    rc, text = run_cli(["--export", "csv", str(tmp_path / "drill.csv")], "")
    assert rc == 0 and f"wrote {len(bank.load())} cards" in text
    with open(tmp_path / "drill.csv", encoding="utf-8-sig", newline="") as f:
        rows = list(csv.DictReader(f))
    cards = bank.load()
    assert [r["id"] for r in rows] == [c.id for c in cards]
    assert rows[0]["prompt_zh"] == cards[0].prompt["zh"]
    assert rows[-1]["why_wrong_en"] == cards[-1].why_wrong["en"]


def test_anki_export_is_a_zip_with_an_sqlite_deck_of_every_card(tmp_path):
    apkg = tmp_path / "drill.apkg"
    rc, _ = run_cli(["--export", "anki", str(apkg)], "")
    assert rc == 0
    with zipfile.ZipFile(apkg) as z:
        assert "collection.anki2" in z.namelist()
        (tmp_path / "c.anki2").write_bytes(z.read("collection.anki2"))
    db = sqlite3.connect(tmp_path / "c.anki2")
    try:
        notes = [row[0].split("\x1f") for row in db.execute("select flds from notes")]
        n_cards = db.execute("select count(*) from cards").fetchone()[0]
    finally:
        db.close()
    cards = bank.load()
    assert len(notes) == n_cards == len(cards)
    by_id = {fields[0]: fields for fields in notes}
    col = export.COLUMNS.index
    for c in cards:
        fields = by_id[c.id]
        assert fields[col("prompt_zh")] == html.escape(c.prompt["zh"])
        assert fields[col("answer_en")] == html.escape(c.answer["en"])
    assert any("张量" in f[col("answer_zh")] for f in notes)


# --- the widget, without a browser (tests/browser/test_browser_drill.py clicks it in Chromium) --
def test_quiz_buttons_reveal_grade_save_and_chart(data_dir):
    from shmlab.drill import Quiz

    quiz = Quiz(deck=Deck(clock=Clock(), seed=0), lang="en")
    card = quiz.deck.current()
    assert all(b.disabled for b in quiz.grade_buttons) and card.prompt["en"][:20] in quiz.text()
    assert card.answer["en"] not in quiz.text()
    quiz.reveal_button.click()
    assert quiz.revealed and "✗" in quiz.answer.value and card.link.split("#")[0] in quiz.text()
    easy = next(b for b in quiz.grade_buttons if b.description == "easy")
    easy.click()
    assert state.load()["cards"][card.id]["last"] == "easy"
    assert f'data-question="{card.question}" data-known="1" data-seen="1"' in quiz.chart.value
    quiz.lang_buttons.value = "中文"
    nxt = quiz.deck.current()
    from shmlab.drill.quiz import _html

    assert _html(nxt.prompt["zh"]) in quiz.question.value
    assert _html(nxt.prompt["en"]) not in quiz.question.value
    with pytest.raises(RuntimeError):
        quiz.grade("good")  # not revealed yet
    reloaded = Quiz(deck=Deck(clock=Clock(), seed=0))
    assert f'data-question="{card.question}" data-known="1"' in reloaded.chart.value


def test_the_quiz_in_chinese_links_the_chinese_heading_from_where_it_runs(monkeypatch):
    from shmlab.drill import Quiz

    quiz = Quiz(deck=Deck(clock=Clock(), seed=0), lang="en")
    card = quiz.deck.current()
    chinese = notebooks.zh_link(card.link)
    monkeypatch.chdir(notebooks.NOTEBOOKS)  # the kernel of notebooks/10_interview_drill.ipynb
    quiz.reveal()
    assert f"href='{html.escape(card.link)}'" in quiz.answer.value  # English: as it was
    quiz.lang_buttons.value = "中文"
    assert f"href='{html.escape('zh/' + chinese)}'" in quiz.answer.value
    assert f"see zh/{chinese}" in quiz.text()
    monkeypatch.chdir(notebooks.NOTEBOOKS / "zh")  # the Chinese edition's drill notebook
    quiz.set_lang("zh")
    assert f"href='{html.escape(chinese)}'" in quiz.answer.value
    heading = chinese.partition("#")[2].replace("-", " ")
    assert f"{chinese.partition('#')[0]} § {html.escape(heading)}</a>" in quiz.answer.value
    quiz.set_lang("en")  # English from the zh folder: the English notebook, one folder up
    assert f"href='{html.escape('../' + card.link)}'" in quiz.answer.value


def test_card_markdown_renders_in_chinese_too():
    from shmlab.drill.quiz import _html

    assert _html("发给*前台进程组*的信号") == "发给<i>前台进程组</i>的信号"
    assert _html("**要点**：用 `mp.spawn`") == "<b>要点</b>：用 <code>mp.spawn</code>"
    assert _html("2*3*4 and a_b*c") == "2*3*4 and a_b*c"  # arithmetic, not italics


# --- the documents ------------------------------------------------------------------------------
DOCS = ("cheatsheet.md", "cheatsheet.zh.md", "mock_interview.md", "study_plan.md")


def test_readme_links_the_cheat_sheets_mock_interview_and_plan():
    from support.nbutil import REPO

    readme = (REPO / "README.md").read_text(encoding="utf-8")
    for name in DOCS:
        assert (REPO / "docs" / name).is_file() and f"(docs/{name})" in readme, name
    for name in ("cheatsheet.md", "cheatsheet.zh.md"):
        text = (REPO / "docs" / name).read_text(encoding="utf-8")
        assert sum(line.startswith(f"{i}. ") for i in range(1, 11)
                   for line in text.splitlines()) == 10, name  # the ten wrong answers
    mock = (REPO / "docs" / "mock_interview.md").read_text(encoding="utf-8")
    for q in ("Q1", "Q2", "Q3", "Q4", "Q5"):
        section = mock.split(f"## {q} ")[1].split("\n## ")[0]
        assert all(k in section for k in ("**Opening.**", "**Follow-ups.**", "3. ",
                                          "**Junior answer.**", "**Senior answer.**",
                                          "**Red flags.**")), q
