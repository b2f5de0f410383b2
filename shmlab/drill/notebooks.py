"""Read the notebooks the bank points at: their headings (as JupyterLab anchors) and follow-ups.

The bank (bank.json) is the single place the drill reads; the notebooks' "Follow-up questions"
sections are where the English follow-up cards come from. This module reads those sections, so a
test can check that every follow-up is in the bank word for word, and `python -m
shmlab.drill.sync` can copy a changed follow-up's English text into the bank. It only reads
notebooks (plain JSON, no nbformat needed).

JupyterLab gives every rendered heading an id: its text content with spaces replaced by "-"
(``Private.createHeaderId`` in @jupyterlab/rendermime). A link ``04_x.ipynb#Step-3-·-...``
scrolls to that heading, so :func:`anchor` computes the same string from the Markdown source.
The Chinese edition (``notebooks/zh/``, built from the catalogs with the English cells' ids)
has its own headings: :func:`zh_link` finds the English heading's cell and takes the heading at
the same place in the Chinese cell of that id, so a card's Chinese link is computed, never
stored (Note [A card's link in Chinese]).

Mirrors: nothing in torch; the notebooks are this course's, read as JupyterLab renders them.
"""

from __future__ import annotations

import functools
import json
import os
import re
from dataclasses import dataclass, replace
from pathlib import Path

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"
ZH = "zh"  # the Chinese edition's folder under notebooks/
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
_BOLD_QA = re.compile(r"\*\*(.+?)\*\*\s+(.*)", re.S)        # **Question?** answer
_BULLET_QA = re.compile(r"\*\s+\*(.+?)\*\s+(.*)", re.S)     # * *Question?* answer
_HAN = re.compile(r"[\u4e00-\u9fff]")


@dataclass(frozen=True)
class FollowUp:
    notebook: str   # file name, e.g. "04_file_descriptor_strategy.ipynb"
    question: str   # Markdown, as written in the notebook
    answer: str     # Markdown, one paragraph, line breaks joined
    question_zh: str = ""  # the Chinese paragraph right after it (same form), if any
    answer_zh: str = ""


def is_chinese(text: str) -> bool:
    """Mostly 汉字 (identifiers aside): a follow-up's Chinese paragraph, not a new question."""
    han = len(_HAN.findall(re.sub(r"`[^`]*`", "", text)))
    return han >= 2 and han >= len(re.findall(r"[A-Za-z]", re.sub(r"`[^`]*`", "", text))) / 3


def markdown_cells(path: Path) -> list[str]:
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    return ["".join(c["source"]) for c in cells if c["cell_type"] == "markdown"]


def plain(markdown: str) -> str:
    """The text a reader sees: no `code` ticks, **bold**, *italics* or [link](targets).

    Code spans stay as written (`/dev/shm/torch_*` keeps its star). Outside them a star pair
    around non-space text is taken as emphasis wherever it stands, between 汉字 or digits too
    (*父进程的*, 2*3*4), as Markdown's flanking rules have it, except where a star touches
    punctuation (`的*“x”*是` keeps its stars in CommonMark; no heading here has that); a lone
    star stays."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", markdown)
    parts = re.split(r"`([^`]*)`", text)  # odd items: the code spans
    for i in range(0, len(parts), 2):
        part = re.sub(r"\*\*(?=\S)(.+?)(?<=\S)\*\*", r"\1", parts[i])
        parts[i] = re.sub(r"\*(?=\S)(.+?)(?<=\S)\*", r"\1", part)
    return "".join(parts)


def anchor(heading: str) -> str:
    """The id JupyterLab gives a heading: its rendered text with spaces as dashes."""
    return plain(heading).strip().replace(" ", "-")


def cell_headings(source: str) -> list[tuple[int, str]]:
    """The Markdown headings of one cell (outside fenced code): (level, raw text) in order."""
    found, fenced = [], False
    for line in source.splitlines():
        fenced ^= line.lstrip().startswith("```")
        match = None if fenced else _HEADING.match(line)
        if match:
            found.append((len(match.group(1)), match.group(2)))
    return found


def headings(path: Path) -> list[str]:
    """Every Markdown heading of a notebook (outside fenced code), as its raw text."""
    return [text for source in markdown_cells(path) for _, text in cell_headings(source)]


@functools.lru_cache(maxsize=64)
def _headings_by_cell(path: Path) -> dict[str, list[tuple[int, str]]]:
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    return {c.get("id", ""): cell_headings("".join(c["source"]))
            for c in cells if c["cell_type"] == "markdown"}


# Note [A card's link in Chinese]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# A card stores one link, to the English notebook: "04_x.ipynb#Step-3-·-...". In Chinese the
# learner should land on the same heading of notebooks/zh/04_x.ipynb, whose anchor is its
# Chinese text. The build keeps every cell's id, so the English heading's cell id and its place
# among that cell's headings name the Chinese heading; zh_link reads it from the built notebook
# (what the link opens) and computes its anchor with `anchor`. Nothing is stored by hand, so a
# retranslated heading moves the link with it; a link that does not resolve raises LookupError
# (tests/notebooks/test_drill_bank.py resolves every card's).


def zh_link(link: str, notebooks: Path = NOTEBOOKS) -> str:
    """The Chinese edition's ``name.ipynb#anchor`` (relative to ``notebooks/zh``) for a card's
    English ``link``: Note [A card's link in Chinese]. LookupError says which part is missing."""
    name, _, target = link.partition("#")
    english = notebooks / name
    if not english.is_file():
        raise LookupError(f"{link!r}: no notebook {english}; fix the card's link in bank.json")
    place = next(((cell, i, level) for cell, found in _headings_by_cell(english).items()
                  for i, (level, text) in enumerate(found) if anchor(text) == target), None)
    if place is None:
        raise LookupError(f"{link!r}: {name} has no heading with that anchor; fix the card's "
                          "link in bank.json (anchors: shmlab.drill.notebooks.anchor)")
    cell, i, level = place
    chinese = notebooks / ZH / name
    found = _headings_by_cell(chinese).get(cell, []) if chinese.is_file() else []
    if i >= len(found) or found[i][0] != level:
        raise LookupError(f"{link!r}: cell {cell!r} of {chinese} has no level-{level} heading "
                          f"number {i + 1}; rebuild it (python -m shmlab.i18n build)")
    return f"{name}#{anchor(found[i][1])}"


def href(link: str, lang: str, here: Path | None = None, notebooks: Path = NOTEBOOKS) -> str:
    """A card's link as an href from the folder ``here`` (default: the working directory, where
    Jupyter starts a notebook's kernel): the Chinese notebook's heading in "zh", else the
    English one. A Chinese link that does not resolve falls back to the English heading."""
    target = link
    folder = notebooks
    if lang == "zh":
        try:
            target, folder = zh_link(link, notebooks), notebooks / ZH
        except LookupError:
            pass  # the English heading is still a right answer's proof
    if here is None:
        try:
            here = Path.cwd()
        except OSError:  # the working directory was removed under us
            here = notebooks
    name, _, fragment = target.partition("#")
    path = os.path.relpath(folder / name, here)
    return f"{Path(path).as_posix()}#{fragment}"


def anchors(notebooks: Path = NOTEBOOKS) -> set[str]:
    """Every ``name.ipynb#anchor`` a card may link to."""
    return {f"{p.name}#{anchor(h)}" for p in sorted(notebooks.glob("*.ipynb"))
            for h in headings(p)}


def _paragraphs(section: str) -> list[str]:
    """Blank-line-separated paragraphs, HTML lines (<details>, <summary>) and headings dropped."""
    keep = [line for line in section.splitlines()
            if not line.lstrip().startswith(("<", "#"))]
    return [" ".join(p.split()) for p in re.split(r"\n\s*\n", "\n".join(keep)) if p.strip()]


def _items(section: str) -> list[str]:
    """Paragraphs, with a bulleted list split into one item per bullet."""
    return _paragraphs(section.replace("\n* ", "\n\n* "))


def follow_ups(path: Path) -> list[FollowUp]:
    """The question/answer pairs of a notebook's follow-up section (``<details>`` after a
    "Follow-up questions" heading or summary); [] when it has none. A paragraph of the same
    form in Chinese, right after a pair, is that pair's ``question_zh`` / ``answer_zh``."""
    found = []
    for source in markdown_cells(path):
        start = re.search(r"Follow-up questions", source)
        if not start or "<details" not in source:
            continue  # a heading, or a <summary>, says where the section is
        before = source.rfind("<details", 0, start.start())
        section = source[before if before >= 0 else source.index("<details", start.start()):]
        for item in _items(section.split("</details>")[0]):
            match = _BULLET_QA.match(item) or _BOLD_QA.match(item)
            if not match:
                continue
            question, answer = match.group(1).strip(), match.group(2).strip()
            chinese = is_chinese(question + answer)
            if chinese and found and not found[-1].question_zh:
                found[-1] = replace(found[-1], question_zh=question, answer_zh=answer)
            elif not chinese:
                found.append(FollowUp(path.name, question, answer))
    return found


def all_follow_ups(notebooks: Path = NOTEBOOKS) -> list[FollowUp]:
    return [f for p in sorted(notebooks.glob("*.ipynb")) for f in follow_ups(p)]
