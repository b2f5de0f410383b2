"""The 中英术语表 (notebooks/glossary.md): linked from 00_start_here, every row complete, every
term found in the notebook named as the one that teaches it, Chinese in full-width punctuation
(the rule of test_lesson_text), and the terms the issue names all present. The last column lists
the claims a definition rests on (checked against the registry by tests/meta/test_facts.py).
"""

from __future__ import annotations

import re

from support import nbutil
from test_lesson_text import punctuation_problems

NOTEBOOKS = nbutil.REPO / "notebooks"
GLOSSARY = NOTEBOOKS / "glossary.md"
START = NOTEBOOKS / "00_start_here.ipynb"
COLUMNS = ["English", "中文", "Definition", "定义", "Taught in", "Claims"]
REQUIRED = {"ancillary data": "辅助数据", "copy-on-write": "写时复制",
            "orphan process / orphan": "孤儿进程", "session": "会话", "process group": "进程组",
            "file descriptor": "文件描述符", "shared memory": "共享内存",
            "reference count / refcount": "引用计数"}
_LINK = re.compile(r"\]\(([^)#\s]+)[^)]*\)")


def rows(text: str) -> list[list[str]]:
    """The cells of every table row after the header and its |---| line."""
    lines = [ln for ln in text.splitlines() if ln.startswith("|")]
    return [[c.strip() for c in ln.strip().strip("|").split("|")] for ln in lines[2:]]


def header(text: str) -> list[str]:
    first = next(ln for ln in text.splitlines() if ln.startswith("|"))
    return [c.strip() for c in first.strip().strip("|").split("|")]


def notebook_text(name: str) -> str:
    return "\n".join(c.source for c in nbutil.read_notebook(NOTEBOOKS / name).cells).lower()


def row_problems(row: list[str]) -> list[str]:
    """What is wrong with one glossary row (empty list: nothing)."""
    where = f"row {row[0]!r}"
    if len(row) != len(COLUMNS) or not all(row):
        return [f"{where}: needs {len(COLUMNS)} non-empty cells, has {row}"]
    problems = [f"{where}: {p}" for cell in (row[1], row[3]) for p in punctuation_problems(cell)]
    links = _LINK.findall(row[4])
    if not links or not all((NOTEBOOKS / link).is_file() for link in links):
        return [*problems, f"{where}: 'Taught in' must link notebooks that exist: {row[4]!r}"]
    variants = [v.strip().strip("`").lower() for v in row[0].split(" / ")]
    if not any(v in notebook_text(links[0]) for v in variants):
        problems.append(f"{where}: {links[0]} never says {' or '.join(variants)!r}")
    return problems


def test_start_here_links_the_glossary_and_the_link_resolves():
    links = [link for cell in nbutil.read_notebook(START).cells if cell.cell_type == "markdown"
             for link in _LINK.findall(cell.source) if link.endswith("glossary.md")]
    assert links, "00_start_here links no glossary.md"
    assert all((NOTEBOOKS / link).resolve() == GLOSSARY.resolve() for link in links), links
    assert GLOSSARY.is_file()


def test_every_row_is_complete_true_and_full_width():
    text = GLOSSARY.read_text(encoding="utf-8")
    assert header(text) == COLUMNS
    found = rows(text)
    assert len(found) >= 40, len(found)
    problems = [p for row in found for p in row_problems(row)]
    assert not problems, "\n".join(problems)
    prose = re.sub(r"^\|.*$", "", text, flags=re.M)  # the paragraphs above the table
    assert not punctuation_problems(prose), punctuation_problems(prose)


def test_the_terms_the_issue_names_are_there():
    got = {row[0]: row[1] for row in rows(GLOSSARY.read_text(encoding="utf-8"))}
    missing = {en: zh for en, zh in REQUIRED.items() if zh not in got.get(en, "")}
    assert not missing, f"add these rows (English | 中文) to {GLOSSARY.name}: {missing}"
    assert len(got) == len(rows(GLOSSARY.read_text(encoding="utf-8"))), "a term has two rows"


def test_the_checks_can_fail():
    good = ["shared memory", "共享内存", "Memory.", "多个进程同时映射的内存。",
            "[01](01_what_is_torch_multiprocessing.ipynb)", "C1.2"]
    assert row_problems(good) == []
    assert "non-empty" in row_problems(good[:4] + ["", "C1.2"])[0]
    assert "non-empty" in row_problems(good[:5] + [""])[0]
    half_width = "多个进程同时映射的内存,一个进程写入,其他进程看得到."
    assert row_problems([*good[:3], half_width, *good[4:]])
    assert "exist" in row_problems([*good[:4], "[99](99_nothing.ipynb)", "C1.2"])[-1]
    assert "never says" in row_problems(["flux capacitor", *good[1:]])[-1]
