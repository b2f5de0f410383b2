"""shmlab.harness.workers: a child runs the code a notebook wrote, and runs it again once edited.

The notebook's way (Note [Edit the cell, re-run the step]): write a module into the session's
code_dir, start a worker child, ``run`` one of its functions; rewrite the module (a re-run
``%%writefile`` cell) and the same child runs the new code. Under fork and spawn, torch and
shmlab, with a tensor crossing the session's queue each time.
"""

from __future__ import annotations

import os
import sys

import pytest

from shmlab.harness.actor import ActorError
from shmlab.harness.session import Session

pytestmark = pytest.mark.timeout(180)

RECEIVE = '''
def receive(child, key):
    t = child.queue.get(timeout=30)
    child.kept[key] = t
    return {VALUE}
'''


def write(session, name, value_expr):
    path = os.path.join(session.code_dir, f"{name}.py")
    with open(path, "w") as f:
        f.write(RECEIVE.replace("{VALUE}", value_expr))
    return path


@pytest.mark.parametrize("lib", ["torch", "shmlab"])
@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_a_child_runs_the_notebooks_code_and_its_edit(method, lib):
    session = Session(method)
    try:
        name = f"nbtest_workers_{method}_{lib}"
        write(session, name, "t.tolist()")
        module = __import__(name)
        q = session.queue()
        child = session.worker(lib, q)
        tlib = session.libs[lib]
        t = tlib.zeros(6)
        t.numpy()[:] = [0, 1, 2, 3, 4, 5]
        q.put(t)
        assert child.run(module.receive, "whole") == [0.0, 1, 2, 3, 4, 5]
        # The learner edits the experiment: send a slice, answer its length and a sum.
        write(session, name, "['edited', t.numel(), float(t.numpy().sum())]")
        q.put(t[2:5])
        assert child.run(module.receive, "slice") == ["edited", 3, 9.0]
        assert child("fds")["shm"] >= 1  # the kept tensors' segment is open in the child
    finally:
        left = session.close()
        sys.modules.pop(name, None)
    assert left == {"files": [], "managers": [], "children": []}, left
    assert not os.path.exists(session.code_dir)
    assert session.code_dir not in sys.path


def cell_function(child):
    return child.lib


def test_a_function_a_child_cannot_import_is_refused_with_the_fix():
    session = Session("fork")
    try:
        child = session.worker("shmlab")
        cell_function.__module__ = "__main__"  # as if defined in a notebook cell

        with pytest.raises(ValueError, match="%%writefile"):
            child.run(cell_function)

        def nested(child):
            return None

        with pytest.raises(ValueError, match="cannot import"):
            child.run(nested)

        import shmlab.harness.show as not_written_here  # a module the notebook did not write

        with pytest.raises(ActorError, match="session.code_dir"):
            child.run(not_written_here.show_table)  # would reload it in the child
        assert child("fds")["total"] > 0  # the child lives on
    finally:
        cell_function.__module__ = __name__
        session.close()


def test_fresh_reloads_only_when_the_bytes_changed(tmp_path, monkeypatch):
    from shmlab.harness import workers

    monkeypatch.syspath_prepend(str(tmp_path))
    path = tmp_path / "nbtest_fresh.py"
    path.write_text("import itertools\nLOAD = next(itertools.count())\nX = 1\n")
    try:
        first = workers.fresh("nbtest_fresh")
        first.LOAD = "this load"  # a reload would execute the file again and reset it
        assert workers.fresh("nbtest_fresh").LOAD == "this load"  # unchanged: not reloaded
        path.write_text("import itertools\nLOAD = next(itertools.count())\nX = 2\n")
        again = workers.fresh("nbtest_fresh")
        assert (again.X, again.LOAD) == (2, 0)
    finally:
        sys.modules.pop("nbtest_fresh", None)
        workers._loaded.pop("nbtest_fresh", None)


@pytest.mark.notebook
def test_in_a_kernel_an_edited_worker_module_is_fresh_without_re_importing(tmp_path):
    """Re-running a %%writefile cell that adds a function: the kernel's module has it at the
    next cell (Session's pre_run_cell hook), and a child runs it; close() removes the hook."""
    from support import nbutil

    cells = [
        "from shmlab.harness.session import Session\nsession = Session('fork')\n"
        "child = session.worker('shmlab')",
        "%%writefile {session.code_dir}/nbtest_kernel.py\ndef one(child):\n    return 1",
        "import nbtest_kernel\nprint('first', child.run(nbtest_kernel.one))",
        "%%writefile {session.code_dir}/nbtest_kernel.py\ndef one(child):\n    return 1\n\n"
        "def two(child):\n    return child.lib",
        "print('added', child.run(nbtest_kernel.two))",
        "left = session.close()\nprint('left', left)\n"
        "hooks = get_ipython().events.callbacks['pre_run_cell']\n"
        "print('hooks', session._refresh_workers in hooks)",
    ]
    nb = nbutil.new_notebook(*[nbutil.code_cell(c) for c in cells])
    nbutil.execute(nb, cwd=tmp_path, timeout=120)
    out = nbutil.outputs_text(nb)
    assert "first 1" in out and "added shmlab" in out, out
    assert "left {'files': [], 'managers': [], 'children': []}" in out and "hooks False" in out
