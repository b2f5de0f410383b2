"""Read the notebooks the bank points at: their headings (as JupyterLab anchors) and follow-ups.

The bank (bank.json) is the single place the drill reads; the notebooks' "Follow-up questions"
sections are where the English follow-up cards come from. This module reads those sections, so a
test can check that every follow-up is in the bank word for word, and `python -m
shmlab.drill.sync` can copy a changed follow-up's English text into the bank. It only reads
notebooks (plain JSON, no nbformat needed).

JupyterLab gives every rendered heading an id: its text content with spaces replaced by "-"
(``Private.createHeaderId`` in @jupyterlab/rendermime). A link ``04_x.ipynb#Step-3-·-...``
scrolls to that heading, so :func:`anchor` computes the same string from the Markdown source.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace
from pathlib import Path

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"
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
    """The text a reader sees: no `code` ticks, **bold**, *italics* or [link](targets)."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", markdown)
    return re.sub(r"(\*\*|`|(?<!\w)\*(?=\S)|(?<=\S)\*(?!\w))", "", text)


def anchor(heading: str) -> str:
    """The id JupyterLab gives a heading: its rendered text with spaces as dashes."""
    return plain(heading).strip().replace(" ", "-")


def headings(path: Path) -> list[str]:
    """Every Markdown heading of a notebook (outside fenced code), as its raw text."""
    found = []
    for source in markdown_cells(path):
        fenced = False
        for line in source.splitlines():
            fenced ^= line.lstrip().startswith("```")
            match = None if fenced else _HEADING.match(line)
            if match:
                found.append(match.group(2))
    return found


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
