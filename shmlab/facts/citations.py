"""Teaching material cites the claims it rests on: cards, cheat sheets, mock interview, glossary.

Mirrors: nothing in torch; the project's fact base.

Flashcards (shmlab/drill/bank.json): every card has a non-empty ``claims`` list of known ids,
the claims its answer and why_wrong rest on.

Markdown (docs/cheatsheet.md, docs/cheatsheet.zh.md, docs/mock_interview.md and its Chinese
edition docs/mock_interview.zh.md): the text is cut into blocks, and every block is
fact-bearing unless exempted:
  - a block is a table body row (header and ``|---|`` rows are not blocks), a list item with its
    indented continuation lines, or a paragraph (consecutive lines up to a blank line, a heading,
    a table or a list item); headings, fenced code and standalone HTML comments are not blocks;
  - a fact-bearing block ends with a citation ``{C1.3, C12.12}`` (in a table row: its last cell
    does), every id known to the registry;
  - exempt (instructions, scoring rules, links, no fact): a block containing ``<!-- no-claim -->``,
    a block right after a standalone ``<!-- no-claim -->`` line, and, when that line stands right
    before a heading, every block of that heading's section (up to the next heading of the same
    or a higher level).

Glossary (notebooks/glossary.md): every table's last column is "Claims", and every body row
lists one or more known ids there (``C1.2, C4.1.3``, braces optional).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from shmlab.facts.registry import ID

NO_CLAIM = "<!-- no-claim -->"
_IDS = rf"{ID.pattern}(?:\s*,\s*{ID.pattern})*"
CITATION = re.compile(rf"\{{\s*({_IDS})\s*\}}\s*$")
_HEADING = re.compile(r"(#{1,6})\s")
_ITEM = re.compile(r"\s*(?:[-*+]|\d+[.)])\s+")
_FENCE = re.compile(r"\s*(```|~~~)")
_SEPARATOR = re.compile(r"\|?\s*:?-{3,}:?\s*(\|\s*:?-{3,}:?\s*)*\|?\s*")


@dataclass
class Block:
    line: int          # 1-based, its first line
    text: str
    exempt: bool


def ids_in(text: str) -> list[str]:
    return [part.strip() for part in text.split(",")]


def blocks(text: str) -> list[Block]:
    """The markdown's blocks, each marked exempt or not (the rules in the module docstring)."""
    out: list[Block] = []
    lines = text.split("\n")
    current: Block | None = None
    fence = None
    mark_next = False            # a standalone NO_CLAIM line was seen
    section_level = 0            # > 0: inside a section exempted at this heading level

    def close():
        nonlocal current
        if current is not None:
            out.append(current)
            current = None

    def start(i: int, line: str):
        nonlocal current, mark_next
        close()
        current = Block(i + 1, line, mark_next or section_level > 0 or NO_CLAIM in line)
        mark_next = False

    for i, line in enumerate(lines):
        stripped = line.strip()
        if fence:
            if stripped.startswith(fence):
                fence = None
            continue
        m = _FENCE.match(line)
        if m:
            close()
            fence = m.group(1)
            continue
        heading = _HEADING.match(line)
        if heading:
            close()
            level = len(heading.group(1))
            if section_level and level <= section_level:
                section_level = 0
            if mark_next:
                section_level, mark_next = level, False
            continue
        if not stripped:
            close()
            continue
        if stripped == NO_CLAIM:
            close()
            mark_next = True
            continue
        if stripped.startswith("<!--") and stripped.endswith("-->"):
            continue
        if stripped.startswith("|"):
            nxt = lines[i + 1].strip() if i + 1 < len(lines) else ""
            if _SEPARATOR.fullmatch(stripped) or _SEPARATOR.fullmatch(nxt):
                close()  # the separator, or the header row above it
                continue
            start(i, stripped)
            close()
            continue
        if _ITEM.match(line) or current is None:
            start(i, stripped)
            continue
        current.text += " " + stripped
        current.exempt = current.exempt or NO_CLAIM in stripped
    close()
    return out


def uncited_blocks(text: str, known: set[str], name: str = "<text>") -> list[str]:
    """'name:line: why' for every fact-bearing block without a citation of known ids."""
    problems = []
    for block in blocks(text):
        if block.exempt:
            continue
        body = block.text.rstrip()
        if body.startswith("|"):
            body = body.rstrip("|").rstrip()
        m = CITATION.search(body)
        if not m:
            problems.append(f"{name}:{block.line}: no {{C…}} citation at the end of "
                            f"{block.text[:60]!r}… (or mark it {NO_CLAIM} if it states no fact)")
            continue
        unknown = [i for i in ids_in(m.group(1)) if i not in known]
        if unknown:
            problems.append(f"{name}:{block.line}: cites unknown id(s) {unknown}")
    return problems


def uncited_cards(bank: dict, known: set[str]) -> list[str]:
    """'card id: why' for every card with no ``claims`` or an unknown id in them."""
    problems = []
    for card in bank.get("cards", []):
        claims = card.get("claims")
        if not claims:
            problems.append(f"{card.get('id')}: no 'claims' (the ids its answer and why_wrong "
                            "rest on)")
            continue
        unknown = [i for i in claims if i not in known]
        if unknown:
            problems.append(f"{card.get('id')}: cites unknown id(s) {unknown}")
    return problems


def _cells(row: str) -> list[str]:
    return [c.strip() for c in row.strip().strip("|").split("|")]


def uncited_glossary_rows(text: str, known: set[str], name: str = "glossary.md") -> list[str]:
    """'name:line: why' for a glossary table without a Claims column or a row citing nothing."""
    problems = []
    lines = text.split("\n")
    columns = None
    for i, line in enumerate(lines):
        stripped = line.strip()
        if not stripped.startswith("|"):
            columns = None
            continue
        nxt = lines[i + 1].strip() if i + 1 < len(lines) else ""
        if _SEPARATOR.fullmatch(stripped):
            continue
        if _SEPARATOR.fullmatch(nxt):
            columns = _cells(stripped)
            if columns[-1] != "Claims":
                problems.append(f"{name}:{i + 1}: the table's last column is "
                                f"{columns[-1]!r}, not 'Claims'")
            continue
        if columns and columns[-1] != "Claims":
            continue  # said once, at the header
        cell = _cells(stripped)[-1].strip("{} ")
        ids = ids_in(cell) if cell else []
        if not ids:
            problems.append(f"{name}:{i + 1}: no claim ids in the Claims column")
            continue
        unknown = [x for x in ids if x not in known]
        if unknown:
            problems.append(f"{name}:{i + 1}: cites unknown id(s) {unknown}")
    return problems
