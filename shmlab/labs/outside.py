"""The runner as a check process: the learner's cells in a child, the check out of their reach.

Mirrors: nothing in torch; the split of a test harness from the code under test, as a
grader that runs the submission in a separate worker and asserts from the outside.

Note [The verdict outside the learner's process]
On the old path (``runner.run``) the learner's cells and the instructor's check share one
process, so the learner's code can reach the check: a ``float`` subclass whose comparisons are
always true, a patch that restores itself between the check's lines, ``Cases`` found through
frames or ``gc.get_objects()``, ``ctypes`` writes into the check's memory. The fingerprint
(``integrity``) and the streamed cases (``runner._Streamed``) catch the clumsy forms of these,
not the careful ones. On this path:

* the runner is the **check process**: it marks itself not dumpable, then starts the
  **learner's process** (``learner.main``), which enters a user namespace of its own (where the
  kernel allows one; else it says so in its output), so it has no capability over the check
  process: no ``ptrace``, no ``/proc/<pid>/mem`` or
  ``/proc/<pid>/fd`` of it. The two share no writable fd but the pipe of requests and the
  pipe of replies (the check's channel to pid 1 is not inherited); stdout and stderr are
  shared, but what is printed is shown to the learner, never read as a verdict.
* every cell runs in the learner's process; the check process runs only the set-up cells
  (the instructor's imports), then the test cell, in a namespace where each of the learner's
  names is plain data or a ``remote.Proxy`` (Note [Only plain data crosses], in ``wire``);
  the set-up's imports stay the check process's own, so ``lab1 = fake`` changes nothing.
* ``Cases`` and the comparisons run here, on plain data: a learner's object can only be
  equal to itself, an exception from its code arrives as a fresh builtin one, and nothing in
  the learner's process can change what this process computes, records or sends.
* a check that must run code next to the learner's objects (pickle them, fork a child that
  calls them) asks ``remote.place(obj)`` to run one of its own routines there. What such a
  routine reports is the learner's process speaking, so the check computes what it expects
  itself (the random inputs, the right values) and compares; where it can, it reads the
  outcome from outside (``/proc/<pid>/fd``, ``/dev/shm``) instead.

``runner.run`` takes this path for the labs in ``grade.OUTSIDE`` (all five); a lab missing
there runs the old way. In a notebook the check cells call the same checks on the
real objects (``remote.LOCAL``): the learner's own feedback, not a grade.
"""

from __future__ import annotations

import builtins
import contextlib
import ctypes
import io
import types

from ..messages import tr
from . import remote, runner

PR_SET_DUMPABLE = 4
_DATA = (type(None), bool, int, float, str, bytes)


def _kept(value) -> bool:
    """A set-up name whose value the check process keeps as its own: a module, something
    imported (not defined in the notebook), or plain data."""
    if isinstance(value, types.ModuleType) or type(value) in _DATA:
        return True
    module = getattr(value, "__module__", None)
    return (isinstance(value, type) or callable(value)) and module not in (None, "__main__")


def _check_namespace(cells: list, learner: remote.Learner) -> dict:
    ns = {"__name__": "__main__", "__builtins__": builtins, "display": runner.display}
    with contextlib.redirect_stdout(io.StringIO()):  # the learner's process printed it already
        for cell in cells:
            if cell["role"] == "setup":
                exec(compile(cell["source"], f"<setup {cell['label']}>", "exec"), ns)
    own = {k: v for k, v in ns.items() if k.startswith("__") or _kept(v)}
    names = learner.request("names")
    for name, value in (names.items() if type(names) is dict else ()):
        if type(name) is str and name not in own:
            ns[name] = value
    ns.update(own)
    return ns


def _status(learner: remote.Learner):
    try:
        return learner.proc.wait(timeout=2)
    except Exception:  # noqa: BLE001 - it closed its pipe but lives on: no status to give
        return None


def run_outside(job: dict, out, send, stream_failed_cases) -> dict:
    """``runner.run`` for a lab in ``grade.OUTSIDE``: the verdict, computed in this process."""
    stream_failed_cases(out)
    ctypes.CDLL(None).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    learner = remote.Learner()
    if learner.isolation:
        print(tr("note: your code's process could not enter a user namespace of its own "
                 "({reason})", reason=learner.isolation))
    current = ["start-up"]

    def on_cell(label: str) -> None:
        current[0] = label
        send(out, {"cell": label})

    try:
        try:
            failure = learner.request("cells", cells=job["cells"], on_cell=on_cell)
        except remote.LearnerDied:
            return {"passed": False, "traceback": "", "reason": tr(
                "the process died (exit status {status}) while running {cell}, before the "
                "check finished: os._exit, a crash or a kill scores 0",
                status=_status(learner), cell=current[0])}
        if failure is not None:
            failure = failure if type(failure) is dict else {}
            return {"passed": False, "reason": str(failure.get("reason", "a cell failed")),
                    "traceback": str(failure.get("traceback", ""))}
        ns = _check_namespace(job["cells"], learner)
        send(out, {"cell": "test"})
        verdict = runner.run_test(job["test"], ns)
        try:  # a process that ends itself here may have replaced a routine the check ran there
            changed = learner.request("integrity")
        except remote.LearnerDied:
            return {"passed": False, "traceback": "", "reason": tr(
                "the process died (exit status {status}) while running {cell}, before the "
                "check finished: os._exit, a crash or a kill scores 0",
                status=_status(learner), cell="test")}
        if changed:
            return runner._replaced([str(c) for c in changed] if type(changed) is list
                                    else ["the check's routines"])
        return verdict
    finally:
        learner.close()
