"""The learner's path (issue 12, section 4): short 30-second answers, full-width punctuation in
Chinese, and self-check answers that Run All does not spoil.

* The "## The 30-second answer" cell of every notebook: its English part (after ``**English.**``)
  has at most EN_WORDS words and its Chinese part (after ``**中文。**``) at most ZH_CHARS 汉字;
  identifiers (``code spans``) are not counted. A longer version may follow in a
  ``<details>`` element, which is not counted.
* Chinese text uses full-width punctuation (，。：；（）): in a paragraph that is mostly Chinese,
  no half-width , ; ( ) and no : . ! ? right after a 汉字; elsewhere, none of , ; : ( ) between
  two 汉字 (a Chinese phrase quoted in English text).
* In a "## Check yourself" (or "## Self-check") section, no code cell prints or displays
  anything except through ``shmlab.demo.show.reveal``, which puts the answer in a collapsed
  ``<details>`` element: the
  learner's attempt comes first.
"""

from __future__ import annotations

import ast
import re

import pytest
from support import nbutil

NOTEBOOKS = nbutil.find_notebooks((nbutil.REPO / "notebooks",))
EN_WORDS, ZH_CHARS = 80, 150
ANSWER_HEADING = "## The 30-second answer"
CHECK_HEADING = re.compile(r"^## (Check yourself|Self-check)", re.M)
HAN = re.compile(r"[\u4e00-\u9fff]")
SHOWING = {"print", "display", "show_table", "show_widget"}


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
                                "on Run All; use shmlab.demo.show.reveal(answer, ...)")
        if tree.body and isinstance(tree.body[-1], ast.Expr) and not (
                isinstance(tree.body[-1].value, ast.Call)):
            problems.append(f"{where}: the last line is an expression Jupyter displays")
    return problems


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
