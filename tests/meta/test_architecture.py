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


# --- the import rules ----------------------------------------------------------------------------
# Each module of the package belongs to a unit (the root modules `shmlab`, `shmlab.tensor` and
# `shmlab.storage` are one unit, `shmlab`; every subpackage is one), each unit to a part. The
# rules, as docs/ARCHITECTURE.md states them ("Import rules"):
#   1. the core imports nothing outside the core;
#   2. models import only the core;
#   3. observing imports only the core, observing and language (never driving, teaching or models);
#   4. driving never imports teaching;
#   5. no cycle between units;
#   6. the language part (`shmlab.messages`, what shmlab prints in Chinese) imports no other
#      part; observing, driving and teaching may import it.
# An import counts wherever it is: at the top, inside a function, under `if TYPE_CHECKING`.
PARTS = {
    "core": ("shmlab", "shmlab._shm", "shmlab.multiprocessing", "shmlab.manager"),
    "models": ("shmlab.models",),
    "observing": ("shmlab.introspect", "shmlab.widgets", "shmlab.trace"),
    "driving": ("shmlab.harness", "shmlab.lessons", "shmlab.examples", "shmlab.testing",
                "shmlab.tools", "shmlab.__main__"),
    "teaching": ("shmlab.labs", "shmlab.drill", "shmlab.facts", "shmlab.i18n"),
    "language": ("shmlab.messages",),
}
MAY_IMPORT = {
    "core": {"core"},
    "models": {"core", "models"},
    "observing": {"core", "observing", "language"},
    "driving": {"core", "models", "observing", "driving", "language"},
    "teaching": {"core", "models", "observing", "driving", "teaching", "language"},
    "language": {"language"},
}
# (importer, imported): the deliberate exceptions, each with its reason; the page lists the same.
EXCEPTIONS = {
    ("shmlab.storage", "shmlab.multiprocessing"):
        "torch's own lazy strategy lookup: `share_memory_` asks "
        "`multiprocessing.get_sharing_strategy()` at call time, from inside the function, as "
        "torch/storage.py does; `shmlab.multiprocessing.reductions` imports `storage` at the top",
}


def unit(module: str) -> str:
    """The unit a module belongs to: its subpackage, or `shmlab` for the root modules."""
    parts = module.split(".")
    if len(parts) == 1 or parts[1] in ("tensor", "storage"):
        return "shmlab"
    return ".".join(parts[:2])


def part(module: str) -> str:
    name = unit(module)
    for part_name, units in PARTS.items():
        if name in units:
            return part_name
    raise AssertionError(f"{module}: its unit {name} is in no part of PARTS; add it (and to the "
                         "page's import rules)")


def module_imports(root) -> dict[str, list[tuple[str, int]]]:
    """Every module under `root` (a folder holding the `shmlab` package) -> the package modules
    it imports, (module, line), read with `ast`: `import`, `from ... import`, relative imports
    resolved; `from X import name` counts as `X.name` when that is a module, else as `X`."""
    import ast

    files = {}
    for path in (root / "shmlab").rglob("*.py"):
        parts = path.relative_to(root).with_suffix("").parts
        if "__pycache__" in parts:
            continue
        is_package = parts[-1] == "__init__"
        files[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    found = {}
    for module, (path, is_package) in files.items():
        edges = []
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                edges += [(a.name, node.lineno) for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    here = module.split(".") if is_package else module.split(".")[:-1]
                    base = ".".join(here[:len(here) - node.level + 1]
                                    + ([node.module] if node.module else []))
                else:
                    base = node.module or ""
                for a in node.names:
                    name = f"{base}.{a.name}"
                    edges.append((name if name in files else base, node.lineno))
        found[module] = [(t, line) for t, line in edges if t == "shmlab" or t.startswith("shmlab.")]
    return found


def import_violations(imports: dict, exceptions=EXCEPTIONS) -> list[str]:
    """What breaks the rules: one line per import against rules 1-4, one per cycle (rule 5)."""
    out, graph = [], {}
    for module, edges in sorted(imports.items()):
        for target, line in edges:
            if (module, target) in exceptions or unit(module) == unit(target):
                continue
            graph.setdefault(unit(module), {}).setdefault(unit(target), (module, target, line))
            if part(target) not in MAY_IMPORT[part(module)]:
                out.append(f"{module}:{line} imports {target}: {part(module)} may not import "
                           f"{part(target)}")
    # rule 5: a cycle is a path back to where it started (depth-first, each unit once)
    seen_cycles = set()

    def walk(start, node, path):
        for nxt in graph.get(node, {}):
            if nxt == start and frozenset(path) not in seen_cycles:
                seen_cycles.add(frozenset(path))
                units = [*path, start]
                edges = "; ".join("{0}:{2} imports {1}".format(*graph[a][b])
                                  for a, b in zip(units, units[1:], strict=False))
                out.append(f"cycle {' -> '.join(units)}: {edges}")
            elif nxt not in path and nxt > start:  # each cycle found once, from its least unit
                walk(start, nxt, [*path, nxt])

    for start in sorted(graph):
        walk(start, start, [start])
    return out


def test_the_package_keeps_its_import_rules():
    assert import_violations(module_imports(REPO)) == []


def test_every_exception_still_happens_and_is_on_the_page():
    imports = module_imports(REPO)
    happening = {(m, t) for m, edges in imports.items() for t, _ in edges}
    stale = sorted(set(EXCEPTIONS) - happening)
    assert not stale, f"no longer happening: remove them here and on the page: {stale}"
    rules = text().split("## Import rules", 1)[1].split("\n## ", 1)[0]
    rows = set(re.findall(r"^\| `(shmlab[\w.]*)` \| `(shmlab[\w.]*)` \|", rules, re.M))
    listed = set(EXCEPTIONS)
    assert rows == listed, (f"the page's exceptions and EXCEPTIONS differ: page only "
                            f"{sorted(rows - listed)}, test only {sorted(listed - rows)}")


def test_every_unit_of_the_package_is_in_a_part():
    for module in module_imports(REPO):
        part(module)  # raises for a unit no part names


def test_the_checker_sees_an_import_inside_a_function():
    """Without its exception, storage's lazy import of multiprocessing is a cycle: so the
    checker reads function bodies (and the exception is what lets it pass)."""
    found = import_violations(module_imports(REPO), exceptions={})
    cycle = re.compile(r"cycle shmlab -> shmlab\.multiprocessing -> shmlab: "
                       r"shmlab\.storage:\d+ imports shmlab\.multiprocessing;")
    assert any(cycle.match(v) for v in found), found


def test_the_checker_reports_planted_violations(tmp_path):
    """A synthetic package: a core module importing introspect (relatively, inside a function),
    an observer importing the harness, and two driving packages importing each other."""
    files = {
        "shmlab/__init__.py": "from .storage import UntypedStorage\n",
        "shmlab/storage.py": "class UntypedStorage:\n    def f(self):\n"
                             "        from .introspect import fds\n",
        "shmlab/introspect/__init__.py": "",
        "shmlab/introspect/fds.py": "import shmlab.harness.actor\n",
        "shmlab/harness/__init__.py": "",
        "shmlab/harness/actor.py": "from ..tools import bench\n",
        "shmlab/tools/__init__.py": "",
        "shmlab/tools/bench.py": "from shmlab.harness import actor\n",
        "shmlab/labs/__init__.py": "from shmlab.tools import bench\n",  # allowed: teaching
    }
    for name, body in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(body)
    found = import_violations(module_imports(tmp_path), exceptions={})
    assert "shmlab.storage:3 imports shmlab.introspect.fds: core may not import observing" in found
    assert ("shmlab.introspect.fds:1 imports shmlab.harness.actor: observing may not import "
            "driving") in found
    assert any(v.startswith("cycle shmlab.harness -> shmlab.tools -> shmlab.harness:")
               for v in found), found
    assert not any("shmlab.labs" in v for v in found), found
