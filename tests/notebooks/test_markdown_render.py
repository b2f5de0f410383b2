"""Every notebook's Markdown, as JupyterLab will render it: links that lead somewhere, no text
swallowed as HTML, and self-check answers said once.

* A relative link (``[text](path)``, ``<a href>``, ``<img src>``) names a file that exists in the
  repository, relative to the notebook; a ``#fragment`` into a notebook names one of its headings
  (JupyterLab's anchor: spaces as dashes). A repository file named in a code span (```docs/X.md```)
  exists too: a reader copies that path.
* No raw ``<word>`` outside code: Markdown passes it to the HTML sanitizer, which drops it, so
  ``/proc/self/fd/<fd>`` renders as "/proc/self/fd/". Only the HTML elements the notebooks use on
  purpose (``<details>``, ``<br>``, ...) may appear. The same for the Markdown tables that code
  cells build with ``show_table``/``markdown_table``: their string literals are Markdown too.
* ``reveal(answer, *evidence)`` shows "Answer: ..." once: the evidence is what this machine
  measured, not a second "Answer 1: ...".
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import nbformat
import pytest
from support import nbutil

from shmlab.drill import notebooks as drill_notebooks

REPO = nbutil.REPO
NOTEBOOKS = sorted(nbutil.find_notebooks((REPO / "notebooks", REPO / "labs")))
FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
CODE_SPAN = re.compile(r"(`+)(.+?)\1", re.S)
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HTML_REF = re.compile(r"<(?:a|img)\b[^>]*?\b(?:href|src)=[\"']([^\"']+)[\"']", re.I)
TAG = re.compile(r"</?([A-Za-z][\w-]*)(?:\s[^<>]*)?/?>")
HTML_OK = {"a", "b", "br", "code", "details", "div", "em", "i", "img", "kbd", "li", "ol", "p",
           "pre", "small", "span", "strong", "sub", "summary", "sup", "table", "tbody", "td",
           "th", "thead", "tr", "u", "ul", "hr", "figure", "figcaption", "center", "font"}
REPO_FILE = re.compile(r"^[\w.-]+(?:/[\w.-]+)+\.(?:md|ipynb)$")  # `docs/CLAIMS.md`
TABLE_CALLS = {"show_table", "markdown_table"}


def _cells(path: Path, kind: str) -> list[str]:
    return [c.source for c in nbformat.read(path, as_version=4).cells if c.cell_type == kind]


def _prose(markdown: str) -> str:
    """The Markdown without fenced blocks and code spans (which render verbatim)."""
    return CODE_SPAN.sub(" ", FENCE.sub("", markdown))


def _targets(markdown: str) -> list[str]:
    text = _prose(markdown)
    return LINK.findall(text) + HTML_REF.findall(text)


def _resolves(nb: Path, target: str) -> str | None:
    """None if ``target`` leads somewhere; else what is wrong with it."""
    if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # https:, mailto:, data:
        return None
    path, _, frag = target.partition("#")
    file = (nb.parent / path).resolve() if path else nb
    if not file.exists():
        return f"{target}: no file {file.relative_to(REPO) if file.is_relative_to(REPO) else file}"
    if frag and file.suffix == ".ipynb":
        anchors = {drill_notebooks.anchor(h) for h in drill_notebooks.headings(file)}
        if frag not in anchors:
            return f"{target}: {file.name} has no heading with that anchor"
    return None


def _swallowed(markdown: str) -> list[str]:
    return [m.group(0) for m in TAG.finditer(_prose(markdown))
            if m.group(1).lower() not in HTML_OK]


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.name)
def test_relative_links_and_named_files_resolve(nb):
    broken = []
    for md in _cells(nb, "markdown"):
        broken += [why for t in _targets(md) if (why := _resolves(nb, t))]
        for m in CODE_SPAN.finditer(FENCE.sub("", md)):
            name = m.group(2).strip()
            if REPO_FILE.match(name) and not ((REPO / name).exists()
                                              or (nb.parent / name).exists()):
                broken.append(f"`{name}`: no such file in the repository")
    assert not broken, f"{nb.name}:\n" + "\n".join(broken)


def _table_strings(source: str) -> list[str]:
    """String literals passed to show_table/markdown_table in a code cell."""
    try:
        tree = ast.parse(source)
    except SyntaxError:  # a cell with IPython magics: nothing of ours to read
        return []
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(
                node.func, "attr", None)) in TABLE_CALLS:
            out += [n.value for n in ast.walk(node)
                    if isinstance(n, ast.Constant) and isinstance(n.value, str)]
    return out


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.name)
def test_no_angle_bracket_text_is_swallowed_as_html(nb):
    found = [tag for md in _cells(nb, "markdown") for tag in _swallowed(md)]
    found += [f"{tag} (in a show_table string)" for code in _cells(nb, "code")
              for s in _table_strings(code) for tag in _swallowed(s)]
    assert not found, (f"{nb.name}: {found}: put it in a code span (`<fd>`) or write "
                       "&lt;fd&gt;, or the renderer drops it")


def _reveal_evidence(source: str) -> list[str]:
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    return [a.value if isinstance(a, ast.Constant) else ast.unparse(a)
            for node in ast.walk(tree)
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "reveal"
            for a in node.args[1:]]


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.name)
def test_a_self_check_answer_is_said_once(nb):
    twice = [e for code in _cells(nb, "code") for e in _reveal_evidence(code)
             if re.match(r"^f?[\"']?Answer\b", str(e))]
    assert not twice, f"{nb.name}: evidence that repeats the answer: {twice}"


def test_the_checks_see_what_they_look_for():
    """The patterns themselves, on the mistakes this file was written for."""
    assert _swallowed("| `/proc/self/fd/<fd>` | /proc/self/fd/<fd> |") == ["<fd>"]
    assert _swallowed("<details><summary>More</summary>text</details> a<b and c>d") == []
    assert _targets("see [x](../docs/CLAIMS.md#top) and `[y](nowhere.md)`") == [
        "../docs/CLAIMS.md#top"]
    nb = REPO / "notebooks" / "04_file_descriptor_strategy.ipynb"
    assert _resolves(nb, "../docs/CLAIMS.md") is None
    assert "no file" in _resolves(nb, "../seed/CLAIMS.md")
    assert _table_strings('show_table(["a", "/proc/self/fd/<fd>"], rows)') == [
        "a", "/proc/self/fd/<fd>"]
    assert _reveal_evidence('reveal("Answer: x", "Answer 1: y")') == ["Answer 1: y"]
