"""An experiment's torch code is in the notebook, where a learner reads, edits and re-runs it.

Two checks:

* ``visible_code_problems`` reads every notebook's code cells (AST) and names each place an
  experiment's torch work is driven from outside the notebook:

  - **a string command** to a child: a call of an *actor* (or of its ``send``) whose first
    argument is a string literal other than an observation command (``OBSERVATION``), e.g.
    ``SENDER[lib]("make", "batch", 80, 16)``. An actor is what ``session.holder(...)``,
    ``session.actor(...)``, ``session.worker(...)`` or ``Actor(...)`` returns, and every name
    that is given one: by assignment (also element by element, and through a subscript or a
    dict/list comprehension of actors), or as a parameter of a function of the notebook that
    is called with one. ``worker.run(module.function, ...)`` is the visible way: the function
    is written by a ``%%writefile`` cell of the notebook.
  - **a scene function**: an import from a module in ``SCENES`` whose torch work the notebook
    cannot see (a whole module, or the named functions of a module whose other functions only
    observe).

  ``%%writefile`` cells and other cell magics are not parsed (their code runs in a child or a
  script); line magics and shell lines are blanked first.
* ``test_an_edit_of_notebook_04_shows_in_its_result`` edits one experiment of a copy of
  notebook 04 on both sides (the kernel sends the slice ``t[2:5]``; the worker code of its
  ``%%writefile`` cell writes twice the value) and runs the copy up to that step under fork and
  under spawn: what the receiver got and what it wrote into our tensor change as the edits say.
"""

from __future__ import annotations

import ast
import json
import re

import nbformat
import pytest
from support import nbutil

NOTEBOOKS = nbutil.find_notebooks((nbutil.REPO / "notebooks",))

# Commands a notebook may send a child by name: they only look (fd counts, /dev/shm links,
# SCM_RIGHTS arrivals), the looking may stay in the package.
OBSERVATION = {"fds"}

# Package modules whose functions do an experiment's torch work out of the notebook's sight.
# A module maps to None when all of it is scene code; to a set of names when only those are (its
# other functions observe, as fdpath's fds_on / segment_bytes / traced do).
SCENES: dict[str, set[str] | None] = {
    "shmlab.harness.holder": None,          # the tensor-holding actor's commands
    "shmlab.lessons.channels": None,        # Process/Pool/Queue targets that receive tensors
    "shmlab.lessons.cuda": None,
    # not scenes: lessons.crashes, inflight, trackers and share_parts only look (look, fds_on,
    # rows, watch_gone, parts_of: notebooks 12 and 13 write their experiments);
    # lessons.errors.run (in_child, run_python, Scene: run a function in a child and report how
    # it ended) observes; lessons.errors.namespaces (a small private /dev/shm, a pid namespace)
    # sets up the environment
    # the Hogwild worker; run_hogwild is the reference run notebook 07 compares DDP with (the
    # loop itself is notebook 06's lesson, written there); data, model and evidence observe
    "shmlab.examples.hogwild": {"train"},
    "shmlab.examples.ddp": None,
}

# Notebooks that still drive their experiments from the package: none (00 and 10 run no
# experiment). A notebook listed here must still have a problem (xfail), so that one converted
# fails here until it leaves the list.
NOT_YET_CONVERTED: set[str] = set()

_CELL_MAGIC = re.compile(r"^\s*%%")
_LINE_MAGIC = re.compile(r"^(\s*)[%!]")
_MAKERS = {"holder", "actor", "worker"}  # session.<maker>(...) returns an actor


# --- reading cells ---------------------------------------------------------------------------
def parsed_cells(nb) -> list[tuple[int, object, ast.Module]]:
    """(index, cell, AST) of every code cell that is Python run in the kernel."""
    found = []
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code" or _CELL_MAGIC.match(cell.source):
            continue  # %%writefile (a child's or a script's code) and other cell magics
        source = "\n".join(_LINE_MAGIC.sub(r"\1pass  #", line)
                           for line in cell.source.splitlines())
        found.append((index, cell, ast.parse(source)))
    return found


def _makes_actor(node, actors: set[str]) -> bool:
    """Does expression ``node`` evaluate to an actor (or a dict/list of actors)?"""
    if isinstance(node, ast.Name):
        return node.id in actors
    if isinstance(node, ast.Subscript):
        return _makes_actor(node.value, actors)
    if isinstance(node, ast.Call):
        func = node.func
        return ((isinstance(func, ast.Attribute) and func.attr in _MAKERS)
                or (isinstance(func, ast.Name) and func.id == "Actor"))
    if isinstance(node, (ast.DictComp,)):
        return _makes_actor(node.value, actors)
    if isinstance(node, (ast.ListComp, ast.SetComp, ast.GeneratorExp)):
        return _makes_actor(node.elt, actors)
    if isinstance(node, ast.Dict):
        return any(_makes_actor(v, actors) for v in node.values)
    if isinstance(node, (ast.List, ast.Tuple)):
        return any(_makes_actor(e, actors) for e in node.elts)
    return False


def _pairs(target, value):
    """(name, value expression) for each name an assignment binds, element-wise for tuples."""
    if isinstance(target, ast.Name):
        yield target.id, value
    elif isinstance(target, (ast.Tuple, ast.List)):
        if isinstance(value, (ast.Tuple, ast.List)) and len(value.elts) == len(target.elts):
            for t, v in zip(target.elts, value.elts, strict=True):
                yield from _pairs(t, v)


def actor_names(trees) -> set[str]:
    """Every name that is given an actor somewhere in the notebook (flow-insensitive: one
    name, one meaning, as a notebook's globals and its small functions are written)."""
    nodes = [n for tree in trees for n in ast.walk(tree)]
    functions = {n.name: n for n in nodes if isinstance(n, ast.FunctionDef)}
    actors: set[str] = set()
    while True:
        found = set(actors)
        for n in nodes:
            if isinstance(n, ast.Assign):
                for target in n.targets:
                    found |= {name for name, v in _pairs(target, n.value)
                              if _makes_actor(v, actors)}
            elif isinstance(n, ast.Call) and isinstance(n.func, ast.Name) \
                    and n.func.id in functions:  # an actor passed to a notebook function
                params = functions[n.func.id].args.args
                found |= {p.arg for p, a in zip(params, n.args, strict=False)
                          if _makes_actor(a, actors)}
        if found == actors:
            return actors
        actors = found


def _scene(module: str) -> tuple[str, set[str] | None] | None:
    for scene, names in SCENES.items():
        if module == scene or module.startswith(scene + "."):
            return scene, names
    return None


def visible_code_problems(nb) -> list[str]:
    """One line per place where the notebook runs an experiment's torch work unseen."""
    cells = parsed_cells(nb)
    actors = actor_names([tree for _, _, tree in cells])
    problems = []
    for index, cell, tree in cells:
        found = []  # (line, what) in this cell
        imported = {}  # local name -> (scene module, its scene functions), for `module.f(...)`
        for n in ast.walk(tree):
            if isinstance(n, ast.ImportFrom) and n.module:
                for alias in n.names:
                    part = _scene(n.module)                     # `from module import name`
                    whole = _scene(f"{n.module}.{alias.name}")  # `from pkg import module`
                    if part:
                        if part[1] is None or alias.name in part[1]:
                            found.append((n.lineno, f"imports {alias.name} from the scene "
                                                     f"module {part[0]}"))
                    elif whole and whole[1] is None:
                        found.append((n.lineno, "imports the scene module "
                                                 f"{n.module}.{alias.name}"))
                    elif whole:
                        imported[alias.asname or alias.name] = whole
            elif isinstance(n, ast.Import):
                for alias in n.names:
                    hit = _scene(alias.name)
                    if hit and hit[1] is None:
                        found.append((n.lineno, f"imports the scene module {hit[0]}"))
                    elif hit and alias.asname:  # `import shmlab.lessons.fdpath as fdpath`
                        imported[alias.asname] = hit
        for n in ast.walk(tree):
            if not isinstance(n, ast.Call):
                continue
            func, first = n.func, (n.args[0] if n.args else None)
            if (isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name)
                    and func.value.id in imported and func.attr in imported[func.value.id][1]):
                found.append((n.lineno, "calls the scene function "
                                       f"{imported[func.value.id][0]}.{func.attr}"))
            sends = (_makes_actor(func, actors)  # actor("cmd", ...), or actor.send("cmd", ...)
                     or (isinstance(func, ast.Attribute) and func.attr == "send"
                         and _makes_actor(func.value, actors)))
            if (sends and isinstance(first, ast.Constant)
                    and isinstance(first.value, str) and first.value not in OBSERVATION):
                found.append((n.lineno, f"a string command {first.value!r} to a child "
                                       f"({ast.unparse(func)}): write its code in a "
                                       "%%writefile cell and run it with .run()"))
        where = f"cell {index} (id {cell.get('id', '?')}) line"
        problems += [f"{where} {line}: {what}" for line, what in sorted(found)]
    return problems


# --- the rule, on every notebook ----------------------------------------------------------------
@pytest.mark.parametrize("path", NOTEBOOKS, ids=nbutil.rel)
def test_experiments_run_code_the_notebook_shows(path):
    problems = visible_code_problems(nbutil.read_notebook(path))
    if path.name in NOT_YET_CONVERTED:
        assert problems, (f"{path.name} has no hidden experiment left: remove it from "
                          "NOT_YET_CONVERTED in tests/notebooks/test_visible_code.py")
        pytest.xfail(f"not yet converted ({len(problems)} problems), e.g. {problems[0]}")
    assert not problems, (f"{nbutil.rel(path)} runs torch work the notebook does not show "
                          "(write it in a %%writefile cell: shmlab/harness/workers.py):\n  "
                          + "\n  ".join(problems))


def test_the_not_yet_converted_list_names_notebooks():
    names = {p.name for p in NOTEBOOKS}
    assert NOT_YET_CONVERTED <= names, NOT_YET_CONVERTED - names


# --- the check can fail (so a pass above means something) -------------------------------------
def _nb(*sources):
    return nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(s) for s in sources])


SETUP = ("import os\nfrom shmlab.harness.session import Session\n"
         "session = Session(os.environ.get('SHMLAB_START_METHOD') or None)\n"
         "LIBS = session.libs\nQ = {lib: session.queue() for lib in LIBS}")


def test_the_check_flags_string_commands_and_scene_functions():
    planted = _nb(
        SETUP,
        "SENDER = {lib: session.holder(lib, Q[lib]) for lib in LIBS}\n"
        "SENDER['torch']('make', 'r', 1, 1000)\n"
        "SENDER['torch']('fds')",                                   # observation: allowed
        "def scenario(S):\n    S('send', 'r')\n\nscenario(SENDER['torch'])",
        "S, R = SENDER['torch'], session.actor(lambda: {})\nR('recv', 'r', 1)\n"
        "S.send('drop', 'r')",
        "%time x = 1\nfrom shmlab.lessons import channels, fdpath\n"
        "from shmlab.examples import hogwild\nhogwild.train(1)\n"
        "fdpath.segment_bytes(1, 2)",                               # observation: allowed
        "from shmlab.lessons.channels import pool_write",
        "import shmlab.examples.ddp",
    )
    problems = visible_code_problems(planted)
    expected = [("cell 1", "'make'"), ("cell 2", "'send'"), ("cell 3", "'recv'"),
                ("cell 3", "'drop'"),
                ("cell 4", "scene module shmlab.lessons.channels"),
                ("cell 4", "scene function shmlab.examples.hogwild.train"),
                ("cell 5", "pool_write from the scene module shmlab.lessons.channels"),
                ("cell 6", "scene module shmlab.examples.ddp")]
    assert len(problems) == len(expected), problems
    for (cell, what), problem in zip(expected, problems, strict=True):
        assert problem.startswith(cell) and what in problem, (cell, what, problem)


def test_the_check_passes_a_converted_notebook():
    converted = _nb(
        SETUP,
        "%%writefile {session.code_dir}/nbx_receiver.py\n"
        "def receive(child):\n    return child.queue.get(timeout=60).shape\n",
        "from shmlab.lessons import fdpath\nfrom shmlab.harness.workers import fresh\n"
        "nbx_receiver = fresh('nbx_receiver')\n"
        "R = {lib: session.worker(lib, Q[lib]) for lib in LIBS}\n"
        "t = LIBS['torch'].zeros(1000).share_memory_()\nQ['torch'].put(t)\n"
        "shape = R['torch'].run(nbx_receiver.receive)\nfds = R['torch']('fds')\n"
        "print(fdpath.fds_on(1), fdpath.storage_fd(t))\n!ls /dev/shm",
    )
    assert visible_code_problems(converted) == []


# --- an edit of notebook 04 shows in its result, under fork and spawn --------------------------
NB04 = nbutil.REPO / "notebooks" / "04_file_descriptor_strategy.ipynb"
# Step 4: the kernel puts one tensor on the queue (cell s4-child), a worker takes it and writes
# -1 at its [0] with code the notebook writes (cell s4-child-code). The edit, on both sides:
# send a slice, and write twice the value.
EDITS = {"s4-child": ("QUEUES[lib].put(t)", "QUEUES[lib].put(t[2:5])"),
         "s4-child-code": ("        t[0] = value\n", "        t[0] = 2 * value\n")}
LAST = "s4-child"
PROBE = ("import json\nprint(json.dumps({lib: {'arrived': r['arrived'], "
         "'kernel sees': r['kernel sees']} for lib, r in step4.items()}))")


def edited_copy(nb):
    """Notebook 04 up to step 4, edited (EDITS): every cell up to step 4's (hidden tests left
    out), a cell printing step 4's result, then the clean-up cell."""
    ids = [c.get("id") for c in nb.cells]
    cells = [c for c in nb.cells[:ids.index(LAST) + 1]
             if "hidden-test" not in c.metadata.get("tags", [])]
    for cell in cells:
        if cell.get("id") in EDITS:
            old, new = EDITS[cell.id]
            assert cell.source.count(old) == 1, f"cell {cell.id} no longer has one {old!r}"
            cell.source = cell.source.replace(old, new)
    nb.cells = [*cells, nbformat.v4.new_code_cell(PROBE), nb.cells[ids.index("cleanup")]]
    return nb


@pytest.mark.notebook
@pytest.mark.slow
@pytest.mark.timeout(nbutil.NOTEBOOK_TIMEOUT)
@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_an_edit_of_notebook_04_shows_in_its_result(method, monkeypatch):
    monkeypatch.setenv("SHMLAB_START_METHOD", method)  # read by the notebook's set-up cell
    nb = edited_copy(nbutil.read_notebook(NB04))
    try:
        nbutil.execute(nb, cwd=NB04.parent)
    except Exception:  # keep the partly executed copy to read
        nbutil.ARTIFACTS.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, str(nbutil.ARTIFACTS / f"edited-{method}-{NB04.name}"))
        raise
    text = nbutil.outputs_text(nb)
    assert f"start method: {method}" in text, "the kernel did not see SHMLAB_START_METHOD"
    (probe,) = [c for c in nb.cells if c.source == PROBE]
    result = json.loads(probe.outputs[0]["text"])
    for lib in ("torch", "shmlab"):
        # Unedited, the hidden test of step 4 asserts [((1000000,), 0)] and [-1, 1, 2, 3]. The
        # slice arrives as itself, 3 elements at offset 2 of the whole storage (which is what
        # travels), so the child's write at its [0] lands at our t[2]; and it is the edited
        # worker code that wrote it: -2, not -1.
        assert result[lib] == {"arrived": [[[3], 2]], "kernel sees": [0.0, 1.0, -2.0, 3.0]}, \
            (lib, result[lib])
