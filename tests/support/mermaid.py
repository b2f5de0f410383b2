"""The Mermaid diagrams of the notebooks: ```mermaid fences in Markdown cells.

JupyterLab (4.1 and later) renders such a fence as a diagram: a ``div.jp-RenderedMermaid`` holding
an ``<img>`` whose source is the SVG mermaid drew, or, when mermaid cannot parse the text, the same
div marked ``jp-mod-warning`` with the parser's message. test_diagrams.py checks what the fences
say; test_browser_diagrams.py checks that every one of them renders.
"""

from __future__ import annotations

import re

from support import nbutil

FENCE = re.compile(r"^```mermaid[ \t]*\n(.*?)^```[ \t]*$", re.M | re.S)
# The first word of a diagram: the kinds this project uses (mermaid knows more).
KINDS = ("sequenceDiagram", "flowchart", "stateDiagram-v2")


def fences(nb) -> list[tuple[str, str]]:
    """(cell id, diagram text) for every ```mermaid fence in the Markdown cells of `nb`."""
    return [(cell.get("id", "?"), m.group(1)) for cell in nb.cells
            if cell.cell_type == "markdown" for m in FENCE.finditer(cell.source)]


def notebooks_with_diagrams(dirs=(nbutil.REPO / "notebooks",)):
    """{notebook path: its fences}, for the notebooks that have at least one."""
    found = {}
    for path in nbutil.find_notebooks(dirs):
        diagrams = fences(nbutil.read_notebook(path))
        if diagrams:
            found[path] = diagrams
    return found
