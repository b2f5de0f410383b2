"""Build the translated notebooks and labs from the catalogs: ``notebooks/zh/``, ``labs/zh/``.

Mirrors: nothing in torch; gettext's ``msgfmt`` step (catalog -> what the program reads), for
notebooks.

Note [What a built notebook is]
The English notebook with each translated cell's source replaced by its ``msgstr``; a cell with
no current translation stays English (``check`` reports it). Cell ids, metadata, tags and
nbgrader's fields are the English ones, so the hidden test cells, the grader and the drill's
anchors see the same notebook; ``metadata.language`` is the locale's language. Only notebooks
with at least one translation are built: a Chinese folder of English copies would help nobody.
A lab is built as its instructor copy (in memory) and written as the learner copy released from
it, as ``python -m shmlab labs release`` does for the English. Relative links and images are
rewritten for the deeper folder: to the translated sibling when there is one, else to the
English file (``../``).
"""

from __future__ import annotations

import copy
import json
import os
import re
from pathlib import Path

import nbformat

from . import catalog

# [text](target) and ![alt](target), and <img src="target">: the targets to rewrite.
_LINK = re.compile(r"(!?\[[^\]]*\]\()([^)\s]+)(\))|(<img\s[^>]*src=\")([^\"]+)(\")")
_ABSOLUTE = re.compile(r"^([a-z][a-z0-9+.-]*:|#|/)", re.I)
_CODE = re.compile(r"```.*?```|`[^`\n]*`", re.S)  # fenced blocks and inline code spans


def language(locale: str) -> str:
    return locale.split("_")[0]


def out_path(src: catalog.Source, locale: str = catalog.LOCALE) -> Path:
    folder = "notebooks" if src.kind == "notebooks" else "labs"
    return src.root / folder / language(locale) / f"{src.stem}.ipynb"


def built_stems(root=".", locale: str = catalog.LOCALE) -> set[str]:
    """The notebooks and labs that get a translated edition: their catalog translates a cell."""
    done = set()
    for src in catalog.sources(root):
        path = src.catalog(locale)
        if path.exists() and catalog.translated_count(catalog.load(path, locale)):
            done.add(src.stem)
    return done


def _retarget(target: str, english_dir: Path, out_dir: Path, root: Path, built: set[str],
              lang: str) -> str:
    if _ABSOLUTE.match(target):
        return target
    path, _, anchor = target.partition("#")
    there = (english_dir / path).resolve()
    if there.suffix == ".ipynb" and there.stem in built:
        there = there.parent / lang / there.name  # the translated sibling
    new = os.path.relpath(there, out_dir.resolve())
    return new + (f"#{anchor}" if anchor else "")


def retarget_links(markdown: str, english_dir: Path, out_dir: Path, root: Path,
                   built: set[str], lang: str) -> str:
    """``markdown`` with its relative links and images pointing where they should from
    ``out_dir`` (Note [What a built notebook is]); a link inside a code span or block is left
    alone, a link whose text is a code span (``[`docs/CLAIMS.md`](../docs/CLAIMS.md)``) is not."""
    code = [m.span() for m in _CODE.finditer(markdown)]

    def fix(m):
        if any(start <= m.start() < end for start, end in code):
            return m.group(0)  # shown as code: the reader sees the text, it is no link
        if m.group(1):
            return m.group(1) + _retarget(m.group(2), english_dir, out_dir, root, built,
                                          lang) + m.group(3)
        return m.group(4) + _retarget(m.group(5), english_dir, out_dir, root, built,
                                      lang) + m.group(6)

    return _LINK.sub(fix, markdown)


def build_notebook(src: catalog.Source, locale: str = catalog.LOCALE, built=None):
    """The translated notebook of ``src`` (for a lab: the instructor copy), not written."""
    built = built_stems(src.root, locale) if built is None else built
    nb = copy.deepcopy(catalog.read_notebook(src.english))
    entries = catalog.by_id(catalog.load(src.catalog(locale), locale))
    out_dir = out_path(src, locale).parent
    english_dir = src.root / ("notebooks" if src.kind == "notebooks" else "labs")
    for cell in nb.cells:
        text = catalog.translation(entries.get(cell.get("id")))
        if text is None:
            continue
        if cell.cell_type == "markdown":
            text = retarget_links(text, english_dir, out_dir, src.root, built,
                                  language(locale))
        cell.source = text
    nb.metadata["language"] = language(locale)
    return nb


def _finish(src: catalog.Source, nb):
    """What is written for ``src``: a notebook as built; a lab's learner copy."""
    if src.kind == "labs":
        from ..labs.release import release_notebook

        return release_notebook(nb)
    return nb


def build(root=".", locale: str = catalog.LOCALE) -> list[Path]:
    """Write every translated edition; return the paths written."""
    built = built_stems(root, locale)
    written = []
    for src in catalog.sources(root):
        if src.stem not in built:
            continue
        out = out_path(src, locale)
        out.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(_finish(src, build_notebook(src, locale, built)), str(out))
        written.append(out)
    return written


def out_of_date(root=".", locale: str = catalog.LOCALE) -> list[str]:
    """Built editions that differ from a fresh build, are missing, or should not be there."""
    built, stale = built_stems(root, locale), []
    for src in catalog.sources(root):
        out = out_path(src, locale)
        if src.stem not in built:
            if out.exists():
                stale.append(f"{out} (its catalog translates nothing: remove it)")
            continue
        want = json.loads(nbformat.writes(_finish(src, build_notebook(src, locale, built))))
        if not out.exists() or json.loads(out.read_text(encoding="utf-8")) != want:
            stale.append(str(out))
    return stale
