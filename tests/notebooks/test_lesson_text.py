"""The learner's path: short 30-second answers, full-width punctuation in
Chinese, and self-check answers that Run All does not spoil.

* The "## The 30-second answer" cell of every notebook: its English part (after ``**English.**``)
  has at most EN_WORDS words and its Chinese part (after ``**中文。**``) at most ZH_CHARS 汉字;
  identifiers (``code spans``) are not counted. A longer version may follow in a
  ``<details>`` element, which is not counted.
* Chinese text uses full-width punctuation (，。：；（）): in a paragraph that is mostly Chinese,
  no half-width , ; ( ) and no : . ! ? right after a 汉字; elsewhere, none of , ; : ( ) between
  two 汉字 (a Chinese phrase quoted in English text).
* In a "## Check yourself" (or "## Self-check") section, no code cell prints or displays
  anything except through ``shmlab.harness.show.reveal``, which puts the answer in a collapsed
  ``<details>`` element: the
  learner's attempt comes first.
* Every follow-up question of a "Follow-up questions" section has its Chinese right after it:
  the question and the answer, in the same form as the English (``**问题？** 回答``).
* A claims table's header names the Pythons the suite tests (requirements/constraints-py3.N.txt),
  nothing narrower or wider: the notebooks run on the learner's interpreter, and check it.
"""

from __future__ import annotations

import ast
import re

import pytest
from support import nbutil

from shmlab.drill import notebooks as drill_notebooks

NOTEBOOKS = nbutil.find_notebooks((nbutil.REPO / "notebooks",))
EN_WORDS, ZH_CHARS = 80, 150
ANSWER_HEADING = "## The 30-second answer"
CHECK_HEADING = re.compile(r"^## (Check yourself|Self-check)", re.M)
HAN = re.compile(r"[\u4e00-\u9fff]")
SHOWING = {"print", "display", "show_table", "show_widget"}
TESTED = sorted(int(p.name.split(".")[1]) for p in
                (nbutil.REPO / "requirements").glob("constraints-py3.*.txt"))
_PYTHONS = re.compile(r"\b(?:C?Python) 3\.(\d+)(?:\s*[–-]\s*3\.(\d+))?")


def _plain(text: str) -> str:
    """Markdown without code, links' targets, HTML tags and URLs (what punctuation rules see)."""
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    text = re.sub(r"`[^`]*`", "X", text)  # an identifier: a Latin token
    text = re.sub(r"\]\([^)]*\)", "]", text)
    text = re.sub(r"<[^>]+>", " ", text)
    text = re.sub(r"^[ \t]*>[ \t]?", "", text, flags=re.M)  # a quote's paragraphs are paragraphs
    return re.sub(r"https?://\S+", "X", text)


def answer_parts(source: str) -> tuple[str, str]:
    """(English, Chinese) text of a 30-second answer cell, before any <details>."""
    body = source.split("<details>")[0]
    en = re.search(r"\*\*English\.\*\*(.*?)(?=\*\*中文。\*\*|$)", body, re.S)
    zh = re.search(r"\*\*中文。\*\*(.*)", body, re.S)
    return (en.group(1) if en else ""), (zh.group(1) if zh else "")


def english_words(text: str) -> int:
    return len(re.findall(r"[A-Za-z0-9][A-Za-z0-9'’-]*", re.sub(r"`[^`]*`", " ", text)))


def han_chars(text: str) -> int:
    return len(HAN.findall(re.sub(r"`[^`]*`", " ", text)))


def punctuation_problems(text: str) -> list[str]:
    problems = []
    for para in re.split(r"\n\s*\n", _plain(text)):
        han, latin = len(HAN.findall(para)), len(re.findall(r"[A-Za-z]", para))
        chinese = han >= 10 and han * 3 >= latin
        for m in re.finditer(r"[,;:()!?.]", para):
            ch, before = m.group(), para[:m.start()].rstrip()[-1:]
            after = para[m.end():].lstrip()[:1]
            after_han = bool(HAN.match(before or " "))
            between_han = after_han and bool(HAN.match(after or " "))
            if not (chinese and (ch in ",;()" or (ch in ":.!?" and after_han))
                    or not chinese and between_han and ch in ",;:()"):
                continue
            problems.append(f"{ch!r} in …{para[max(0, m.start() - 20):m.end() + 10]!r}")
    return problems


def check_sections(nb):
    """The code cells under a '## Check yourself' heading (until the next '## ' heading)."""
    inside, cells = False, []
    for index, cell in enumerate(nb.cells):
        if cell.cell_type == "markdown" and re.search(r"^## ", cell.source, re.M):
            inside = bool(CHECK_HEADING.search(cell.source))
        elif inside and cell.cell_type == "code":
            cells.append((index, cell))
    return cells


def spoiler_problems(name: str, nb) -> list[str]:
    problems = []
    for index, cell in check_sections(nb):
        where = f"{name} cell {index} (id {cell.get('id')})"
        tree = ast.parse(cell.source)
        for node in ast.walk(tree):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                    and node.func.id in SHOWING):
                problems.append(f"{where} line {node.lineno}: {node.func.id}() shows the answer "
                                "on Run All; use shmlab.harness.show.reveal(answer, ...)")
        if tree.body and isinstance(tree.body[-1], ast.Expr) and not (
                isinstance(tree.body[-1].value, ast.Call)):
            problems.append(f"{where}: the last line is an expression Jupyter displays")
    return problems


def follow_up_problems(follow_ups) -> list[str]:
    """The follow-ups that lack a Chinese question or answer after them."""
    return [f"{f.notebook}: {f.question!r} has no Chinese question and answer after it"
            for f in follow_ups if not (han_chars(f.question_zh) and han_chars(f.answer_zh))]


def version_problems(source: str, tested: list[int]) -> list[str]:
    """Python versions named in a table's header line that are not the tested range."""
    lines, problems = source.splitlines(), []
    for line, below in zip(lines, lines[1:], strict=False):
        if not (line.startswith("|") and re.match(r"\|\s*:?-{3}", below)):
            continue  # not a header: a header line is followed by |---|
        for m in _PYTHONS.finditer(line):
            low, high = int(m.group(1)), int(m.group(2) or m.group(1))
            if (low, high) != (tested[0], tested[-1]):
                problems.append(f"{m.group()!r} in {line[:60]!r}…: the suite tests Python "
                                f"3.{tested[0]}–3.{tested[-1]}")
    return problems


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem[:2])
def test_follow_ups_are_in_both_languages(path):
    problems = follow_up_problems(drill_notebooks.follow_ups(path))
    assert not problems, "\n".join(problems)


def test_there_are_follow_ups_to_check():
    assert len(drill_notebooks.all_follow_ups()) >= 60


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem[:2])
def test_claims_tables_name_the_tested_pythons(path):
    problems = [p for c in nbutil.read_notebook(path).cells if c.cell_type == "markdown"
                for p in version_problems(c.source, TESTED)]
    assert not problems, f"{path.name}:\n" + "\n".join(problems)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem[:2])
def test_30_second_answers_are_short(path):
    nb = nbutil.read_notebook(path)
    cells = [c for c in nb.cells if c.cell_type == "markdown"
             and c.source.lstrip().startswith(ANSWER_HEADING)]
    problems = []
    for cell in cells:
        en, zh = answer_parts(cell.source)
        if not en.strip() or not zh.strip():
            problems.append(f"{cell.id}: needs an **English.** and a **中文。** part")
        if english_words(en) > EN_WORDS:
            problems.append(f"{cell.id}: English is {english_words(en)} words (at most {EN_WORDS})")
        if han_chars(zh) > ZH_CHARS:
            problems.append(f"{cell.id}: Chinese is {han_chars(zh)} 汉字 (at most {ZH_CHARS})")
    assert not problems, f"{path.name}:\n" + "\n".join(problems)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem[:2])
def test_chinese_text_uses_full_width_punctuation(path):
    nb = nbutil.read_notebook(path)
    problems = [f"cell {c.get('id')}: {p}" for c in nb.cells if c.cell_type == "markdown"
                for p in punctuation_problems(c.source)]
    assert not problems, f"{path.name}: use ，。：；（） in Chinese text:\n" + "\n".join(problems)


# A soft line break renders as a space, which Chinese never has between two characters.
_CJK = "\u3000-\u303f\u4e00-\u9fff\uff00-\uffef\u201c\u201d"
_CJK_BREAK = re.compile(f"[{_CJK}]\n(?:> )?[{_CJK}]")


def cjk_break_problems(text: str) -> list[str]:
    if "```mermaid" in text:
        return []
    return [f"…{text[max(0, m.start() - 12):m.end() + 12]!r}" for m in _CJK_BREAK.finditer(text)]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem[:2])
def test_chinese_lines_are_not_broken_between_two_characters(path):
    nb = nbutil.read_notebook(path)
    problems = [f"cell {c.get('id')}: {p}" for c in nb.cells if c.cell_type == "markdown"
                for p in cjk_break_problems(c.source)]
    assert not problems, (f"{path.name}: a line break between two Chinese characters shows as "
                          "a space; join the lines:\n" + "\n".join(problems))


def test_the_line_break_check_can_fail():
    assert cjk_break_problems("一段中文\n接着写") and cjk_break_problems("> 引用的中文\n> 接着写")
    assert not cjk_break_problems("一段中文\n`code` 之后")
    assert not cjk_break_problems("句子。\n\n下一段")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem[:2])
def test_self_check_answers_stay_hidden_on_run_all(path):
    problems = spoiler_problems(path.name, nbutil.read_notebook(path))
    assert not problems, "\n".join(problems)


def test_the_checks_can_fail():
    import nbformat

    long_answer = (f"{ANSWER_HEADING}\n\n**English.** " + "word " * 81 + "`not_a_word` "
                   "\n\n**中文。** " + "字" * 151)
    en, zh = answer_parts(long_answer)
    assert english_words(en) == 81 and han_chars(zh) == 151
    assert english_words("**English.** `a.b` and `c`") == 2
    assert punctuation_problems("这是一个很长的中文句子,用了半角逗号(不对)。")
    assert punctuation_problems("Handout: \"返回当前策略,以及\" — quoted.")
    assert not punctuation_problems("The handout, 面试题 (\"Interview questions\"), asks.")
    assert not punctuation_problems("这是一个很长的中文句子，用了全角逗号（对的）：`a, b`。")
    assert not punctuation_problems("English (with brackets), and: colons.")
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_markdown_cell("## Check yourself"),
        nbformat.v4.new_code_cell("x = 1\nprint('the answer', x)"),
        nbformat.v4.new_code_cell("reveal('the answer')"),
        nbformat.v4.new_code_cell("x"),
        nbformat.v4.new_markdown_cell("## Next"),
        nbformat.v4.new_code_cell("print('fine here')")])
    problems = spoiler_problems("n.ipynb", nb)
    assert len(problems) == 2 and "print()" in problems[0] and "expression" in problems[1]


def test_the_new_checks_can_fail(tmp_path):
    import nbformat

    section = ("## Follow-up questions\n\n<details>\n\n**Why?** Because.\n\n"
               "**为什么？** 因为如此。\n\n**And then?** Nothing.\n\n</details>")
    path = tmp_path / "n.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell(section)]), path)
    found = drill_notebooks.follow_ups(path)
    assert [(f.question, f.question_zh) for f in found] == [("Why?", "为什么？"), ("And then?", "")]
    assert follow_up_problems(found) == [
        "n.ipynb: 'And then?' has no Chinese question and answer after it"]
    assert len(TESTED) >= 3 and TESTED == list(range(TESTED[0], TESTED[-1] + 1))
    table = "| a | Current (torch 2.13, Python 3.11–3.14) | b |\n|---|---|---|\n| x | y | z |"
    assert version_problems(table, [10, 11, 12, 13])
    assert version_problems(table.replace("Python 3.11–3.14", "CPython 3.11"), [10, 11, 12, 13])
    assert not version_problems(table.replace("3.11–3.14", "3.10–3.13"), [10, 11, 12, 13])
    assert not version_problems("Python 3.14 made forkserver the default.", [10, 11, 12, 13])
