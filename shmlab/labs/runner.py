"""One exercise, graded in a fresh process: ``runner.main()`` with the message FD in argv[1].

The grader starts ``python -c "from shmlab.labs.runner import main; main()" FD`` (not ``-m``,
so this module is ``shmlab.labs.runner`` and is fingerprinted with the checks); the job comes
on stdin.

Mirrors: what nbgrader's autograde reads from a kernel (each cell's execute reply status), without
a kernel: cells run as plain Python with ``exec``, so there is no ``get_ipython()`` whose
``set_custom_exc``, ``showtraceback`` or ``input_transformers_post`` a learner could bend.

The job (JSON): ``cells`` — [{"role": "setup" | "reference" | "helper" | "answer", "label",
"source"}] in notebook order — and ``test``, the instructor's test cell (a ``helper`` is the
learner's own code outside this exercise's answer: one that raises is reported, not scored).
The runner

1. runs the set-up and reference cells (the instructor's), then takes
   ``integrity.fingerprint()`` just before the learner's first line;
2. runs the cells in a fresh ``__main__`` (the checks fork children that must find the
   learner's classes there); an ``answer`` cell that raises ends the exercise with 0 — its
   status, not its output, decides;
3. restores the names the set-up cells bound (so ``lab3 = fake`` is undone), runs the test,
   and fingerprints again: any replaced check code fails the exercise, naming what changed;
4. writes one JSON line per event to FD (``{"cell": label}`` before each cell, then
   ``{"verdict": {...}}``) and leaves with ``os._exit``, so no learner thread or atexit hook
   runs after the verdict.

That is the old path, where the check shares the learner's process. For a lab in
``grade.OUTSIDE`` (``job["outside"]``) the runner is a check process instead
(``outside.run_outside``): the same cells, run by ``run_cells`` in a learner's process it
starts, and the test here (Note [The verdict outside the learner's process]).
"""

from __future__ import annotations

import importlib
import json
import os
import re
import sys
import traceback
import types

from ..messages import tr
from . import integrity

# Imported before any cell; the set-up cells import the rest (the lab's module, torch for lab 5),
# and the first fingerprint is taken after them, just before the first learner line runs.
# shmlab.introspect is the one a check imports lazily (Cases counts /dev/shm with it): imported
# here, a stand-in put into sys.modules by the learner is a changed entry, not a new one.
CHECK_MODULES = ("shmlab.labs.runner", "shmlab.labs.report", "shmlab.harness.actor",
                 "shmlab.introspect")


# IPython syntax in a learner's cell (Note [Magics in graded cells], below).
_MAGIC = re.compile(r"^(?P<indent>[ \t]*)(?P<sigil>%%|%|!!|!)(?P<name>\w*)(?P<rest>.*)$")
_IPYTHON_ONLY = re.compile(r"^[ \t]*([\w.]+[ \t]*=[ \t]*[%!]|\??[\w.]+\?\??[ \t]*$)")
_TIMEIT_OPTIONS = re.compile(r"^[ \t]*((-[nrp][ \t]*\d+|-[qoct])[ \t]+)*")
_TIMERS = {"time", "timeit"}  # run the statement they wrap, once
_NO_OPS = {"matplotlib", "load_ext", "autoreload", "config"}  # only set IPython up


class _Unsupported(Exception):
    """An answer cell uses IPython syntax that has no plain-Python meaning here."""


def _plain_python(source: str) -> tuple[str, list[str]]:
    """``source`` with its harmless magics rewritten, and a note for each; or ``_Unsupported``.

    Note [Magics in graded cells]
    Answer cells run as plain Python (no IPython, so nothing to bend), so ``%time``, ``!ls`` or
    ``%%bash`` are syntax errors here although they ran in the learner's Jupyter. Only a cell that
    does not compile is looked at, and only the line the SyntaxError names: a ``%`` in a string or
    an expression is never touched. Timing magics run the code they wrap (``%time x = f()`` runs
    ``x = f()``; ``%%time`` / ``%%timeit`` run the cell), set-up magics (``%matplotlib``,
    ``%load_ext``, ``%autoreload``, ``%config``) become ``pass``; each says so in the output.
    Everything else (``!cmd``, ``%%bash``, ``%run``, ``%cd``, ``x = !ls``, ``obj?``) scores 0 with
    a message saying why and what to write instead: running a shell command, or another notebook,
    is not an answer the grader can reproduce.
    """
    lines, notes = source.split("\n"), []
    for _ in range(len(lines) + 1):
        try:
            compile("\n".join(lines), "<answer>", "exec")
            return "\n".join(lines), notes
        except SyntaxError as err:
            n = (err.lineno or 0) - 1
            if not 0 <= n < len(lines):
                return source, []
            line, fixed = lines[n], _rewrite(lines[n], first=n == 0)
            if fixed is None:
                if _MAGIC.match(line) or _IPYTHON_ONLY.match(line):
                    raise _Unsupported(f"line {n + 1}: {line.strip()[:80]}") from None
                return source, []  # a plain syntax error: the learner sees it as it is
            notes.append(f"note: the grader ran line {n + 1}, `{line.strip()[:60]}`, as "
                         f"`{fixed.strip()[:60] or '(nothing)'}`: graded cells run as plain "
                         "Python, without IPython's magics")
            lines[n] = fixed
    return source, []


def _rewrite(line: str, first: bool) -> str | None:
    """The plain-Python twin of one magic line, or None if it has none."""
    m = _MAGIC.match(line)
    if not m:
        return None
    indent, sigil, name, rest = m.group("indent", "sigil", "name", "rest")
    if sigil == "%%" and first and not indent and name in _TIMERS:
        return ""
    if sigil == "%" and name in _TIMERS:
        return indent + _TIMEIT_OPTIONS.sub("", rest, count=1).strip() or indent + "pass"
    if sigil == "%" and name in _NO_OPS:
        return indent + "pass"
    return None


def _unsupported_reason(label: str, where: str) -> str:
    return (f"your cell {label} uses IPython syntax ({where}): graded answer cells run as "
            "plain Python, without IPython, so magics (%, %%) and shell escapes (!) are not "
            "supported there (only %time, %timeit, %%time, %%timeit and set-up magics such "
            "as %matplotlib are run as the Python they wrap). Write it in Python "
            "(subprocess.run([...]) for a shell command, os.listdir() for !ls, "
            "time.perf_counter() for timing), or move it to a cell below the exercise's "
            "check cell, which the grader does not run")


def display(*objs, **kwargs) -> None:
    """IPython's ``display()`` for plain-Python cells: print each object (its repr, as a
    terminal IPython does), so an answer that shows a value runs here too."""
    for obj in objs:
        print(obj if isinstance(obj, str) else repr(obj))


def _send(out, message: dict) -> None:
    out.write(json.dumps(message) + "\n")
    out.flush()


def _learner_traceback(exc: BaseException) -> str:
    """The traceback from the first frame of the learner's own code on (the runner's cut)."""
    tb = exc.__traceback__
    while tb is not None and not integrity.is_learner_frame(tb.tb_frame.f_code.co_filename):
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(exc), exc, tb or exc.__traceback__))


def _who_raised(exc: BaseException) -> str:
    """'your code' if a frame of the learner's cells is on the traceback, else 'the check'."""
    tb = exc.__traceback__
    while tb is not None:
        if integrity.is_learner_frame(tb.tb_frame.f_code.co_filename):
            return "your code"
        tb = tb.tb_next
    return "the check"


class _Streamed:
    """``Cases.check`` that tells the checker of each failed case the moment it fails.

    The checker keeps what it was told: code that later empties the ``Cases`` record (a thread
    walking ``gc.get_objects()``, a frame hack) cannot take back a failure already sent. A data
    descriptor, so an instance's own ``check`` attribute (``c.check = lambda *a: True``) can
    neither be set nor shadow it; callable, so ``integrity.fingerprint`` watches it like a
    method and replacing it on the class is a change it reports.
    """

    def __init__(self, recorded, out):
        self.recorded, self.out = recorded, out
        self.__doc__ = recorded.__doc__

    def __call__(self, cases, ok, what, hint=""):
        passed = self.recorded(cases, ok, what, hint)
        if not passed:
            _send(self.out, {"case": str(what)[:300]})
        return passed

    def __get__(self, cases, owner=None):
        return self if cases is None else types.MethodType(self, cases)

    def __set__(self, cases, value):
        raise AttributeError("Cases.check belongs to the grader: a check's cases cannot be "
                             "replaced from an answer")


def _stream_failed_cases(out) -> None:
    from .report import Cases

    Cases.check = _Streamed(Cases.check, out)


def run_cells(cells: list, ns: dict, on_cell) -> tuple[dict | None, dict, dict | None, set]:
    """Run the job's cells in ``ns``: (the exercise's failure or None, the names the set-up
    bound, the fingerprint taken before the first learner line, the modules known then)."""
    before, known = None, set(sys.modules)
    setup_names: dict = {}
    for cell in cells:
        learner = cell["role"] in ("answer", "helper")
        if learner and before is None:
            before, known = integrity.fingerprint(), set(sys.modules)
        on_cell(cell["label"])
        filename = f"<{'answer' if learner else cell['role']} {cell['label']}>"
        source = cell["source"]
        if learner:
            try:
                source, notes = _plain_python(source)
            except _Unsupported as where:
                if cell["role"] == "helper":
                    print(tr("note: the grader skipped {label} ({where}): IPython syntax",
                             label=cell["label"], where=where))
                    continue
                return ({"passed": False, "traceback": "",
                         "reason": _unsupported_reason(cell["label"], str(where))},
                        setup_names, before, known)
            for note in notes:
                print(note)
        try:
            exec(compile(source, filename, "exec"), ns)
        except BaseException as exc:  # SystemExit and KeyboardInterrupt are answers too
            if cell["role"] == "helper":  # as in Jupyter: what it defined before it raised stays
                print(tr("note: {label} raised {error}", label=cell["label"],
                         error=f"{type(exc).__name__}: {exc}")[:300])
                continue
            return _cell_failure(cell, exc), setup_names, before, known
        if cell["role"] == "setup":
            setup_names = dict(ns)
    return None, setup_names, before, known


def _cell_failure(cell: dict, exc: BaseException) -> dict:
    if cell["role"] == "answer" and isinstance(exc, NotImplementedError):
        return {"passed": False, "traceback": "", "reason": tr(
            "not implemented yet: replace the `raise NotImplementedError()` in {label}",
            label=cell["label"])}
    if cell["role"] == "answer":
        return {"passed": False, "reason": tr(
            "your cell {label} raised {error}", label=cell["label"],
            error=f"{type(exc).__name__}: {exc}")[:300],
            "traceback": _learner_traceback(exc)}
    return {"passed": False, "reason": f"the grader's {cell['role']} cell "
            f"{cell['label']} raised {type(exc).__name__}: {exc} (a grader bug: "
            "tell the instructor)"[:300], "traceback": traceback.format_exc()}


def _fresh_main() -> dict:
    main = types.ModuleType("__main__")
    main.__builtins__ = __builtins__
    sys.modules["__main__"] = main
    main.__dict__["display"] = display  # an IPython builtin an answer may call
    return main.__dict__


def run_test(test: str, ns: dict) -> dict:
    """Run the instructor's test cell in ``ns``: the verdict (before any integrity check)."""
    try:
        exec(compile(test, "<check>", "exec"), ns)
    except AssertionError as exc:
        return {"passed": False, "reason": str(exc)[:300] or "a check failed", "traceback": ""}
    except BaseException as exc:
        learner_tb = getattr(exc, "shmlab_learner_traceback", None)
        who = "your code" if learner_tb is not None else _who_raised(exc)
        return {"passed": False, "traceback": learner_tb or _learner_traceback(exc),
                "reason": f"{who} raised {type(exc).__name__}: {exc}"[:300]}
    return {"passed": True, "reason": "", "traceback": ""}


def _replaced(changed: list[str]) -> dict:
    return {"passed": False, "traceback": "",
            "reason": "your code replaced part of the grader, so this check proves "
                      "nothing: " + ", ".join(changed[:5])}


def run(job: dict, out) -> dict:
    """The old path: the cells and the check in this one process (Note [The verdict outside
    the learner's process] says which labs still take it)."""
    if job.get("outside"):
        from .outside import run_outside

        return run_outside(job, out, _send, _stream_failed_cases)
    for name in CHECK_MODULES:
        importlib.import_module(name)
    _stream_failed_cases(out)
    ns = _fresh_main()
    failure, setup_names, before, known = run_cells(
        job["cells"], ns, lambda label: _send(out, {"cell": label}))
    if failure:
        return failure
    ns.update(setup_names)  # the check module and helpers the set-up bound, as it bound them
    _send(out, {"cell": "test"})
    verdict = run_test(job["test"], ns)
    changed = (integrity.differences(before or {}, integrity.fingerprint())
               + integrity.forged_modules(known))
    return _replaced(changed) if changed else verdict


def main() -> None:
    out = os.fdopen(int(sys.argv[1]), "w", buffering=1)
    job = json.loads(sys.stdin.read())
    try:
        verdict = run(job, out)
    except BaseException as exc:  # the runner itself broke: say so, score nothing
        verdict = {"passed": False, "reason": f"the grader's runner raised "
                   f"{type(exc).__name__}: {exc}"[:300], "traceback": traceback.format_exc()}
    try:
        sys.stdout.flush()
        sys.stderr.flush()
        _send(out, {"verdict": verdict})
    finally:
        os._exit(0)
