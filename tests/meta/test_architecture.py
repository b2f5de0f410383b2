"""docs/ARCHITECTURE.md names the real modules: every name on it exists, every module is on it.

* Every box of the Mermaid diagram is a module (its label's first line is the module's name):
  shmlab's must be a file of the package, the stdlib's must be importable.
* Every `shmlab...` name on the page is a module of the package, or a module and an attribute
  of it (`shmlab._shm.segment.new_name`), checked by importing the module.
* Every module of the package (each .py file; a package by its own name, `__main__` too) has a
  row in the page's "Every module" table, and every row names a module that exists.
"""

from __future__ import annotations

import importlib
import importlib.util
import re

from support.nbutil import REPO

PAGE = REPO / "docs" / "ARCHITECTURE.md"
PACKAGE = REPO / "shmlab"
_NAME = re.compile(r"(?<![\w./-])shmlab(?:\.[A-Za-z_]\w*)*(?![\w-])")
_BOX = re.compile(r"\b\w+\[\"([^\"]+)\"\]")


def text() -> str:
    return PAGE.read_text(encoding="utf-8")


def mermaid_blocks(page: str) -> list[str]:
    return re.findall(r"```mermaid\n(.*?)```", page, re.S)


def diagram_modules(page: str) -> list[str]:
    """The module name of every box (node label's first line); subgraph titles are not boxes."""
    names = []
    for block in mermaid_blocks(page):
        for line in block.splitlines():
            if line.strip().startswith("subgraph"):
                continue
            names += [label.split("<br/>")[0].strip() for label in _BOX.findall(line)]
    return names


def table_modules(page: str) -> list[str]:
    """The first column of the "Every module" table."""
    section = page.split("## Every module", 1)[1]
    return re.findall(r"^\| `(shmlab[\w.]*)` \|", section, re.M)


def package_modules() -> set[str]:
    """Every module of the package, from its files (packages by their own name)."""
    found = set()
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(REPO).with_suffix("").parts
        if "__pycache__" in parts:
            continue
        found.add(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return found


def module_exists(name: str) -> bool:
    if name == "shmlab" or name.startswith("shmlab."):
        base = REPO.joinpath(*name.split("."))
        return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()
    return importlib.util.find_spec(name) is not None


def resolves(name: str) -> bool:
    """A module of the package, or the longest such prefix of `name` plus attributes of it."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        module = ".".join(parts[:i])
        if module_exists(module):
            break
    else:
        return False
    if i == len(parts):
        return True
    try:
        obj = importlib.import_module(module)
        for attr in parts[i:]:
            obj = getattr(obj, attr)
    except (ImportError, AttributeError):
        return False
    return True


def test_the_page_replaces_interfaces_md():
    assert PAGE.is_file()
    assert not (REPO / "docs" / "INTERFACES.md").exists(), "ARCHITECTURE.md replaces it"


def test_the_diagram_draws_the_send_and_the_receive_path():
    (block,) = mermaid_blocks(text())
    assert re.search(r"subgraph send\b", block) and re.search(r"subgraph receive\b", block)
    boxes = set(diagram_modules(text()))
    for module in ("shmlab.multiprocessing.reductions", "shmlab.tensor", "shmlab.storage",
                   "shmlab._shm.unlinked", "shmlab._shm.refcounted", "shmlab._shm.mapping",
                   "shmlab.manager.client", "shmlab.manager.daemon"):
        assert module in boxes, f"the diagram has no box for {module}"


def test_every_box_of_the_diagram_is_a_module_that_exists():
    boxes = diagram_modules(text())
    assert len(boxes) >= 10, boxes
    missing = sorted({b for b in boxes if not module_exists(b)})
    assert not missing, f"boxes that name no module: {missing}"


def test_every_shmlab_name_on_the_page_exists():
    names = sorted(set(_NAME.findall(text())))
    missing = [n for n in names if not resolves(n)]
    assert not missing, f"docs/ARCHITECTURE.md names what does not exist: {missing}"


def test_every_module_of_the_package_is_in_the_table_and_every_row_exists():
    rows = table_modules(text())
    assert len(rows) == len(set(rows)), "a module has two rows"
    actual = package_modules()
    unnamed = sorted(actual - set(rows))
    gone = sorted(set(rows) - actual)
    assert not unnamed and not gone, (
        f"add a row to docs/ARCHITECTURE.md for {unnamed}; remove or rename the rows {gone}")
