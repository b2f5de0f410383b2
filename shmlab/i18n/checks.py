"""What ``python -m shmlab.i18n check`` finds wrong with a catalog: missing and stale entries,
half-width punctuation in Chinese prose, glossary terms rendered two ways, changed code.

Mirrors: nothing in torch; gettext's ``msgfmt --check`` plus the house rules of the Chinese
edition (``i18n/README.md``).
"""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass
from pathlib import Path

from . import catalog, cells

_CJK = r"\u3400-\u9fff\uf900-\ufaff"
_HAS_CJK = re.compile(f"[{_CJK}]")
# What is not prose: fenced and inline code, link targets, URLs, HTML tags, math.
_NOT_PROSE = re.compile(r"```.*?```|`[^`\n]*`|\]\([^)]*\)|https?://\S+|<[^>\n]+>|\$[^$\n]+\$",
                        re.S)
# Half-width punctuation in Chinese prose: , ; ! ? anywhere in a line with Chinese, a colon or
# full stop right after a Chinese character, brackets with Chinese inside or beside them.
_HALF = [
    (re.compile(f"[,;!?](?=\\s|[{_CJK}]|$)|(?<=[{_CJK}])[,;!?]", re.M), "，；！？"),
    (re.compile(f"(?<=[{_CJK}])[:.](?=\\s|$|[{_CJK}])", re.M), "：。"),
    (re.compile(f"\\((?=[^)\\n]*[{_CJK}])[^)\\n]*\\)|(?<=[{_CJK}])\\s?\\(|\\)\\s?(?=[{_CJK}])"),
     "（）"),
]


@dataclass
class Problem:
    where: str  # catalog path and cell id
    what: str

    def __str__(self) -> str:
        return f"{self.where}: {self.what}"


# Not prose either: a call or an API name with its brackets (``report()``, ``fd_count(x)``),
# a tuple of names (``(st_ino, st_dev)``) and an f-string's replacement fields (``{n}``).
_CODE_LIKE = re.compile(r"[A-Za-z_][\w.]*\([^()\u3400-\u9fff]*\)|\{[^{}\n]*\}"
                        r"|\((?:[A-Za-z_][\w.]*\s*,\s*)+[A-Za-z_][\w.]*\)")


def prose_parts(text: str) -> list[str]:
    """The pieces of ``text`` outside code, links and URLs that contain Chinese: lines, and a
    table row's cells one by one."""
    plain = _CODE_LIKE.sub(" ", _NOT_PROSE.sub(" ", text))
    parts = []
    for line in plain.splitlines():
        parts += line.split("|") if line.lstrip().startswith("|") else [line]
    return [p for p in parts if _HAS_CJK.search(p)]


def half_width(text: str) -> list[str]:
    """Half-width punctuation in the Chinese prose of ``text`` (a markdown cell, a comment or a
    string literal): the offending snippets."""
    found = []
    for line in prose_parts(text):
        line = re.sub(r"^\s*([-*+]|\d+\.|#+)\s", " ", line)  # list items, headings
        for pattern, _ in _HALF:
            for m in pattern.finditer(line):
                a, b = max(0, m.start() - 8), min(len(line), m.end() + 8)
                found.append(line[a:b].strip())
    return found


def cell_prose(entry) -> str:
    """The text of an entry a reader reads as prose: all of a markdown cell; the comments and
    strings of a code cell."""
    if "code cell" in (entry.comment or "") or "hidden test" in (entry.comment or ""):
        return "\n".join(cells.prose(entry.msgstr) + [
            s for s in _strings_and_comments(entry.msgstr) if _HAS_CJK.search(s)])
    return entry.msgstr


def _strings_and_comments(source: str) -> list[str]:
    import io
    import tokenize

    try:
        return [t.string for t in tokenize.generate_tokens(io.StringIO(source).readline)
                if t.type in cells._TEXT]
    except (tokenize.TokenError, SyntaxError, IndentationError):
        return []


@dataclass(frozen=True)
class Term:
    english: str  # matched case-insensitively, as a whole word
    chinese: str  # the one rendering; "=" keeps the English
    avoid: tuple[str, ...]  # the other renderings that must not appear


def load_terms(path) -> list[Term]:
    """``terms.tsv``: english, chinese (or ``=``), the renderings to avoid (``|``-separated)."""
    terms = []
    with open(path, encoding="utf-8") as f:
        for row in csv.reader((ln for ln in f if ln.strip() and not ln.startswith("#")),
                              delimiter="\t"):
            english, chinese, avoid = (row + ["", ""])[:3]
            terms.append(Term(english.strip(), chinese.strip(),
                              tuple(a.strip() for a in avoid.split("|") if a.strip())))
    return terms


def term_problems(msgid: str, msgstr: str, terms: list[Term]) -> list[str]:
    problems = []
    for term in terms:
        if not re.search(rf"(?<![\w-]){re.escape(term.english)}(?![\w-])", msgid, re.I):
            continue
        for bad in term.avoid:
            if bad in msgstr:
                want = term.english if term.chinese == "=" else term.chinese
                problems.append(f"'{term.english}' is rendered '{bad}' here; the edition "
                                f"writes '{want}' (i18n/{catalog.LOCALE}/terms.tsv)")
    return problems


def check_catalog(src: catalog.Source, terms: list[Term], locale=catalog.LOCALE,
                  require_complete=True) -> list[Problem]:
    """Every problem of one notebook's catalog (``require_complete``: a missing translation
    is a problem too)."""
    nb = catalog.read_notebook(src.english)
    entries = catalog.by_id(catalog.load(src.catalog(locale), locale))
    rel = str(src.catalog(locale).relative_to(src.root))
    problems = []
    for cell in nb.cells:
        if not cells.translatable(cell):
            continue
        where, entry = f"{rel} [{cell.id}]", entries.get(cell.id)
        if entry is None or not entry.msgstr:
            if require_complete:
                problems.append(Problem(where, "missing: no translation yet"))
            continue
        if entry.msgid != cell.source or "fuzzy" in entry.flags:
            problems.append(Problem(where, "stale: the English changed since it was "
                                    "translated (update the msgstr, then drop `fuzzy`; run "
                                    "`python -m shmlab.i18n extract` first if the msgid is old)"))
            continue
        if cell.cell_type == "code":
            problems += [Problem(where, p) for p in cells.code_problems(cell.source,
                                                                          entry.msgstr)]
        for snippet in half_width(cell_prose(entry)):
            problems.append(Problem(where, f"half-width punctuation in Chinese prose: "
                                    f"{snippet!r} (write ，。：；？！（）)"))
        problems += [Problem(where, p) for p in term_problems(entry.msgid, entry.msgstr,
                                                               terms)]
    return problems


def terms_path(root=".", locale=catalog.LOCALE) -> Path:
    return Path(root) / "i18n" / locale / "terms.tsv"
