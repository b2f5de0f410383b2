"""Every `Note [...]` reference resolves to exactly one definition (GHC's convention, as torch
uses it: a Note is written once and pointed at from wherever its reasoning applies).

* A definition is a `Note [Title]` alone on its line, beginning a comment or docstring
  paragraph (nothing before it on the line but indentation, a `#`, or the opening quotes; the
  line before it blank, a bare `#`, code, or the docstring's opening quotes). Each title is
  defined once.
* Any other mention is a reference. It may span lines (a comment's `#` marks are dropped),
  end in `...` or be a prefix of the title ("Note [Counting the fds]"); inside a string
  literal it ends at the closing quote. One that names a file (`Note [X] in daemon.py`,
  `... in support/leakcheck.py`) must be defined in that file.
* A reference resolves when exactly one definition matches: the one whose title it is, or
  else the only one it is a prefix of. References to torch's own Notes are listed in
  UPSTREAM, with where torch writes them.

`test_the_checker_*` run the checker on small trees in tmp_path with a dangling reference, a
duplicate definition and an ambiguous prefix, so the checker itself is shown to catch them.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from support.nbutil import REPO

SCANNED = ("shmlab", "tests", "notebooks", "labs", "docs", "benchmarks", "README.md")
SUFFIXES = (".py", ".md", ".ipynb")
SKIPPED_DIRS = {"__pycache__", ".ipynb_checkpoints", ".git", ".venv"}
THIS_FILE = Path(__file__).resolve()  # its own examples are not Notes

# torch's Notes that shmlab quotes but does not define (title -> where torch writes it).
UPSTREAM = {
    "Sharing CUDA tensors": "torch/csrc/CudaIPCTypes.h (quoted in CudaIPCTypes.cpp's warning)",
}

_MARK = "Note ["
_OPENERS = ("", "#", '"""', "'''", 'r"""', "//")
_CONTINUATION = re.compile(r"\s*\n[ \t]*(?:#[ \t]?)?")  # a line break, the next line's `#`
_STRING_END = re.compile(r"[\"'](?=\s*[)+,])")  # a quote that closes a string literal
_IN_FILE = re.compile(r"\]\s*(?:\(\s*)?in\s+`?([\w./-]+\.py)\b")
_MAX_TITLE = 200


@dataclass(frozen=True)
class Site:
    path: str  # relative to the scanned root; notebooks as "nb.ipynb:cell N"
    line: int
    title: str
    in_file: str | None = None


def _texts(root: Path):
    """(label, text) for every scanned file; a notebook gives one text per cell."""
    for top in SCANNED:
        start = root / top
        paths = [start] if start.is_file() else sorted(start.rglob("*")) if start.is_dir() else []
        for path in paths:
            if (not path.is_file() or path.suffix not in SUFFIXES
                    or SKIPPED_DIRS & set(path.relative_to(root).parts)
                    or path.resolve() == THIS_FILE):
                continue
            rel = path.relative_to(root).as_posix()
            if path.suffix == ".ipynb":
                cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
                for i, cell in enumerate(cells):
                    source = cell["source"]
                    yield f"{rel}:cell {i}", "".join(source) if isinstance(source, list) else source
            else:
                yield rel, path.read_text(encoding="utf-8", errors="replace")


def _normalise(raw: str) -> str:
    title = _CONTINUATION.sub(" ", raw)
    title = re.sub(r"\s+", " ", title).strip()
    return re.sub(r"\s*(\.\.\.|…)$", "", title)


def _begins_paragraph(before: str, previous: str) -> bool:
    previous = previous.strip()
    if before == "#":
        return not previous.startswith("#") or previous == "#"
    return previous in ("", '"""', "'''", 'r"""') or before.endswith(('"""', "'''"))


def scan(root: Path) -> tuple[list[Site], list[Site]]:
    """(definitions, references) of every Note under `root`."""
    defs, refs = [], []
    for label, text in _texts(root):
        lines = text.split("\n")
        for m in re.finditer(re.escape(_MARK), text):
            start = m.end()
            line_no = text.count("\n", 0, m.start())
            line_start = text.rfind("\n", 0, m.start()) + 1
            before = text[line_start:m.start()].strip()
            close = text.find("]", start, start + _MAX_TITLE)
            raw = text[start:close if close >= 0 else start + _MAX_TITLE]
            end_of_string = _STRING_END.search(raw)
            if end_of_string:
                raw, close = raw[:end_of_string.start()], -1
            line_end = text.find("\n", start)
            line_end = len(text) if line_end < 0 else line_end
            alone = (close >= 0 and close < line_end and not text[close + 1:line_end].strip())
            previous = lines[line_no - 1] if line_no > 0 else ""
            if alone and before in _OPENERS and _begins_paragraph(before, previous):
                defs.append(Site(label, line_no + 1, _normalise(raw)))
                continue
            after = _CONTINUATION.sub(" ", text[close:close + 80]) if close >= 0 else ""
            named = _IN_FILE.match(after)
            refs.append(Site(label, line_no + 1, _normalise(raw),
                             named.group(1) if named else None))
    return defs, refs


def _in(site: Site, file: str) -> bool:
    path = site.path.split(":")[0]
    return path == file or path.endswith("/" + file)


def problems(root: Path) -> list[str]:
    """Every duplicate definition and every reference that does not resolve to exactly one."""
    defs, refs = scan(root)
    found = []
    by_title: dict[str, list[Site]] = {}
    for d in defs:
        by_title.setdefault(d.title, []).append(d)
    for title, sites in sorted(by_title.items()):
        if len(sites) > 1:
            where = ", ".join(f"{s.path}:{s.line}" for s in sites)
            found.append(f"Note [{title}] is defined {len(sites)} times: {where}")
    for ref in refs:
        where = f"{ref.path}:{ref.line}"
        if not ref.title:
            found.append(f"{where}: an empty Note reference")
            continue
        pool = [d for d in defs if ref.in_file is None or _in(d, ref.in_file)]
        exact = {d.title for d in pool if d.title == ref.title}
        titles = exact or {d.title for d in pool if d.title.startswith(ref.title)}
        if len(titles) == 1:
            continue
        if not titles and ref.in_file is None and ref.title in UPSTREAM:
            continue
        if titles:
            found.append(f"{where}: Note [{ref.title}] could mean any of {sorted(titles)}: "
                         "write more of the title")
        elif ref.in_file is not None:
            found.append(f"{where}: Note [{ref.title}] is not defined in {ref.in_file}")
        else:
            found.append(f"{where}: Note [{ref.title}] is defined nowhere: fix the title, "
                         "or write the Note")
    return found


# -- the repository -----------------------------------------------------------------------------
def test_every_note_reference_resolves_to_exactly_one_definition():
    defs, refs = scan(REPO)
    assert len(defs) >= 20 and len(refs) >= 20, (len(defs), len(refs))  # the scan sees them
    found = problems(REPO)
    assert not found, "\n".join(found)


def test_the_scan_finds_known_definitions():
    """Not a rule, a check of the scan: a few titles we know are found as definitions."""
    titles = {d.title for d in scan(REPO)[0]}
    for title in ("Who checks what, and when", "Forking while the first share is in flight",
                  "Forking while a manager starts", "A dropped connection is not a dead process",
                  'A slow reply is not "I left"', "Magics in graded cells"):
        assert title in titles, f"Note [{title}] is not found as a definition"


# -- the checker, on planted violations ---------------------------------------------------------
def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return tmp_path


N = "Note" + " ["  # so that this file's own examples never read as Notes of the repository

GOOD = {
    "shmlab/a.py": (f'"""Module.\n\n{N}Why we wait]\nBecause.\n"""\n\n'
                    f"# {N}How we count]\n# By one.\n"),
    "shmlab/b.py": f"x = 1  # see {N}Why we wait] in a.py\n# and {N}How we ...]\n",
    "docs/c.md": f"A paragraph (see {N}Why we\n  wait]) and {N}How we count] in `shmlab/a.py`.\n",
    "notebooks/d.ipynb": json.dumps({"cells": [{"cell_type": "code", "source": [
        f'print(src.split("# {N}How we")[1])\n']}]}),
}


def test_the_checker_passes_a_clean_tree(tmp_path):
    root = _tree(tmp_path, GOOD)
    defs, refs = scan(root)
    assert sorted(d.title for d in defs) == ["How we count", "Why we wait"]
    assert len(refs) == 5, refs
    assert problems(root) == []


def test_the_checker_reports_a_dangling_reference(tmp_path):
    root = _tree(tmp_path, {**GOOD, "tests/e.py": f"# as {N}Why we stop] says\n"})
    (found,) = problems(root)
    assert "tests/e.py:1" in found and "Note [Why we stop] is defined nowhere" in found


def test_the_checker_reports_a_reference_to_the_wrong_file(tmp_path):
    root = _tree(tmp_path, {**GOOD, "tests/e.py": f"# as {N}Why we wait] in b.py says\n"})
    (found,) = problems(root)
    assert "tests/e.py:1" in found and "not defined in b.py" in found


def test_the_checker_reports_a_duplicate_definition(tmp_path):
    root = _tree(tmp_path, {**GOOD, "labs/f.py": f"\n# {N}Why we wait]\n# Another reason.\n"})
    found = problems(root)
    assert any("Note [Why we wait] is defined 2 times" in f and "labs/f.py:2" in f
               and "shmlab/a.py:3" in f for f in found), found


def test_the_checker_reports_an_ambiguous_prefix(tmp_path):
    root = _tree(tmp_path, {**GOOD, "tests/e.py": f"# {N}How we count]\n\n# see {N}How]\n"})
    found = problems(root)
    assert any("Note [How we count] is defined 2 times" in f for f in found), found
    root2 = _tree(tmp_path / "two", {**GOOD, "tests/e.py": f"# see {N}How we ...] or {N}Wh]\n",
                                     "shmlab/g.py": f"# {N}How we wait]\n# ...\n"})
    found2 = problems(root2)
    assert any("could mean any of ['How we count', 'How we wait']" in f for f in found2), found2
