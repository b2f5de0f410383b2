"""Grade learners' lab notebooks against the verified instructor copies.

Mirrors: nbgrader's autograde (OverwriteCells, execution, the reply status per cell, totals).

Note — how a grade is earned, and what cannot earn one:

* **Each exercise is graded in its own fresh process** (``runner``), never in a Jupyter
  kernel. It runs the instructor's set-up cells, the *instructor's* solutions for every other
  exercise before it (so one mistake costs marks once: an fd leak in ex1 cannot fail ex3), the
  learner's answer cell(s) for this exercise, then the instructor's test cell. The learner's
  own helper cells above, and the definitions in their other answers, run too (Note [The
  learner's notebook as written]). Test cells come
  only from the instructor copy; a learner's edited or deleted test changes nothing.
* **Each exercise runs in its own sandbox** (``sandbox``: user, mount, pid and IPC
  namespaces): every file it can see is read-only (the package, site-packages, the instructor
  copies) but ``/tmp`` and the notebook's folder, where writes go to throwaway overlays;
  ``/dev/shm`` and ``TMPDIR`` are its own, and every process it started dies with it
  (``setsid`` daemons too). So nothing one notebook does, a ``.pth``, an edited or
  ``.pyc``-shadowed module, rewritten copies and sums, a delayed write, a daemon writing into
  later runners, reaches the next notebook's grade.
* **The verdict is the checker's**: the runner's messages go to a checker process (pid 1 of
  the sandbox) that runs none of the learner's code, holds the only fd to the grader and cannot
  be traced or have its fds opened by the learner's processes (``PR_SET_DUMPABLE`` 0). Each
  failed case reaches it the moment it fails; it believes a pass only from one verdict, sent
  after the check started, with no failed case before it (``sandbox.decide``).
* **The check itself is out of the learner's reach** (every lab in ``OUTSIDE``; Note [The
  verdict outside the learner's process], in ``outside``): the runner is a check process, not
  dumpable, that runs the learner's cells in a child process of its own (in a user namespace of
  its own when the kernel allows one, so it cannot trace the check process or open its fds;
  where it does not, the learner's output says so: see the limits) and runs ``Cases`` and the
  comparisons itself, on plain data and proxies (``wire``, ``remote``). A float that equals
  everything, ``Cases`` patched (for good, for one line, through frames or ``gc``) or the
  runner's messages forged score 0 (``tests/labs/test_grader_outside.py``). What the learner's
  code did is read from outside where it can be: the fds (labs 2-4) in ``/proc/<pid>/fd``, the
  counts (lab 3) in the segment in ``/dev/shm`` and the locks in ``/proc/locks``, the reclaimed
  segments (lab 4) in ``/dev/shm``.
* **Status, not output**: an answer cell that raises scores 0; so does a runner that dies
  (``os._exit``), hangs (per-cell and per-notebook time limits, then SIGKILL of its process
  group and sandbox), or sends no verdict. Cells run as plain Python, so there is no IPython
  to bend (``set_custom_exc``, ``showtraceback``, ``input_transformers_post`` raise
  NameError).
* **IPython syntax** in an answer cell (``%time``, ``!ls``, ``%%bash``) is a SyntaxError in
  plain Python. The runner rewrites the harmless magics (timing, set-up) into the Python they
  wrap and says so in the output; any other magic or shell escape scores 0 with a message that
  names the line, says magics are not supported in graded cells and what to write instead
  (runner's Note [Magics in graded cells]).
* **The check code is fingerprinted** (``integrity.fingerprint``) before the first learner cell
  and after the test, in the process where the learner's code runs (for a lab in ``OUTSIDE``, a
  second line of defence for the check's routines run there); a learner who patched ``Cases``,
  rebound a lab module, a builtin or a ``__code__`` fails that exercise with the name of what
  changed. In the check process, the names the set-up imports (modules, imported functions and
  classes: ``lab3``, ``shm_open``...) and its plain constants stay its own; names a set-up cell
  defines itself (lab 1's ``Point``, lab 3's ``read_count``) are the learner's process's, as the
  learner last bound them.
* **Instructor copies** are checked against ``SHA256SUMS`` before a batch starts and graded
  from memory; a notebook that writes one (or the grader's own files) scores 0 and the batch
  says so. Grading writes nothing into the source folder.

Limits — what the grader still cannot detect or prevent:

* **A lab not in ``OUTSIDE``** (none today) runs the check in the learner's process, where
  whatever the check can do the learner's code can do too: writing the runner's own messages and
  exiting, a ``float`` subclass whose comparisons are always true, ``Cases`` patched through
  frames or ``gc`` or put back before the check ends, ``ctypes`` writes into the check's memory.
  The fingerprint (which sees replaced code, not changed data) and the checker's rules catch
  only the plain forms there.
* **What the learner's process reports.** A check that must pickle the learner's objects, load
  the bytes, inject a failure, fork a sender, hammering children or a manager loop with its
  clients, or train and watch models, runs one of its routines in the learner's process
  (``remote.place``); code that knows the check can change what that routine measures there
  (replace it, or alter the objects the routine hands to the learner's code), and what it
  returns is then the learner's word. In labs 1-4 the check computes the inputs and the answers
  it expects itself (random points, the views' values, the fd counts and segments it reads from
  outside), so such a report must still be the right answer; a routine replaced to compute the
  right answer from the check's own inputs is not caught (the fingerprint taken in the learner's
  process catches the plain replacements). Lab 4's loop exercise expects constants (3
  REGISTERs, 1 socket, a time inside the grace period) besides the reclaimed random names it
  reads from outside, so it is nearly as weak. Lab 5 is the weakest: its training, the watch on
  which process trained which model, the accuracies and the timings are all measured there
  (``_hogwild_facts``...), and the check process only compares the numbers it is sent. The
  learner's process can also kill the check process (same uid): that exercise then scores 0. It
  can list the check process's fd numbers in ``/proc`` (not open them).
* **No user namespace for the learner's process.** Where ``unshare(CLONE_NEWUSER)`` fails
  there, the learner's process stays in the runner's namespace (uid 0 inside the sandbox, or
  root outside it) and could trace the check process; the grader prints a note in that
  exercise's output but does not mark the row ⚠️.
* **Reading is allowed.** The sandbox is read-only, not hidden: a notebook can read the
  instructor copies (the solutions) in the installed package, and any file the grader's user
  can read, other learners' notebooks included. Grade submissions from a folder per learner
  and keep the others out of reach (a container per batch) if that matters.
* **No network or resource isolation.** The sandbox shares the machine's network (the loopback,
  abstract Unix sockets) and has no memory, CPU or process-count limit beyond the time limits:
  a notebook can slow the machine, or exhaust its memory, while it runs.
* **Timing.** Checks that measure speed share the machine with whatever else runs on it.
* **Without namespaces** (kernels or containers that forbid unprivileged user namespaces) the
  grader falls back to a private ``TMPDIR`` and the same checker, and every row says so
  (``isolation``; the table prints a ⚠️ line): files stay writable and a daemon can outlive
  its run, so grade one learner per batch there, from a fresh install.
"""

from __future__ import annotations

import ast
import json
import os
import selectors
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import nbformat

from ..messages import language, tr
from . import integrity, sandbox
from .release import SOURCE, nbgrader_meta, release_cell

# The labs whose verdict comes from a check process the learner's code cannot reach (Note [The
# verdict outside the learner's process], in ``outside``): all five. A lab missing here (a new
# one, until its checks take proxies) runs the check in the learner's process, the old way. A
# Chinese copy has its English twin's name.
OUTSIDE = {"lab1_reducers.ipynb", "lab2_file_descriptors.ipynb",
           "lab3_file_system_refcount.ipynb", "lab4_shm_manager.ipynb", "lab5_hogwild.ipynb"}
_RUNNER = "import sys; del sys.path[0]; from shmlab.labs.runner import main; main()"


@dataclass
class Exercise:
    grade_id: str
    points: float
    score: float
    error: str  # why it lost its points ("" if it scored them)
    output: str = ""  # what the cells and the check printed: ✅/❌ lines, hints, tracebacks
    seconds: float = 0.0
    sandbox: str = ""  # how it was isolated (sandbox.FULL, or what was missing)


@dataclass
class Result:
    notebook: str
    exercises: list[Exercise]
    seconds: float
    problem: str = ""  # why the notebook as a whole could not be graded (or was voided)
    max_points: float = field(default=0.0)
    language: str = "en"  # the notebook's metadata.language: its messages' language

    @property
    def score(self) -> float:
        return 0.0 if self.problem else sum(e.score for e in self.exercises)

    @property
    def max_score(self) -> float:
        return sum(e.points for e in self.exercises) or self.max_points

    @property
    def isolation(self) -> str:
        """``sandbox.FULL`` if every exercise ran fully sandboxed, else the weakest one's."""
        weaker = [e.sandbox for e in self.exercises if e.sandbox != sandbox.FULL]
        return weaker[0] if weaker else sandbox.FULL if self.exercises else ""

    def as_dict(self) -> dict:
        return {"notebook": self.notebook, "score": self.score, "max_score": self.max_score,
                "seconds": round(self.seconds, 2), "problem": self.problem,
                "isolation": self.isolation,
                "exercises": [asdict(e) for e in self.exercises]}


def plan(source_nb, learner_nb) -> list[dict]:
    """One runner job per graded cell: {grade_id, points, cells, test}.

    A solution cell belongs to the first graded cell after it. The job for an exercise runs
    the learner's cells for that exercise (their answer, its split halves merged, then the
    unlabelled cells the learner added right after it); every earlier answer is the
    instructor's. An exercise with no solution cell of its own (an integration test) runs
    every earlier answer of the learner. The learner's own code above runs too, as
    ``helper`` cells (``_learner_cells``).
    """
    answers, extras = _learner_cells(learner_nb)
    jobs, pending, cells = [], [], []
    for n, cell in enumerate(source_nb.cells):
        meta = nbgrader_meta(cell)
        label = meta.get("grade_id") or f"cell{n}"
        if cell.cell_type != "code":
            cells.append(("text", label, ""))  # the learner's cells below it still run
            continue
        if meta.get("grade"):
            mine = pending or [j for j in cells if j[0] == "solution"]
            job_cells = []
            for kind, lab, src in cells:
                if kind in ("test", "text"):
                    pass  # an earlier exercise's check does not run here; cells below it do
                elif kind == "setup":
                    job_cells.append({"role": "setup", "label": lab, "source": src})
                elif (kind, lab, src) in mine:
                    job_cells.append({"role": "answer", "label": lab, "source": answers.get(
                        lab, release_cell(_cell(src)).source)})
                    job_cells += [{"role": "answer", "label": f"below {lab}",
                                   "source": s} for s in extras.get(lab, [])]
                    continue
                elif kind == "solution":
                    helpers = _definitions(answers.get(lab, ""))
                    if helpers:  # the learner's own helpers in that answer stay defined
                        job_cells.append({"role": "helper", "label": f"the definitions in "
                                          f"your {lab}", "source": helpers})
                    job_cells.append({"role": "reference", "label": lab, "source": src})
                job_cells += [{"role": "helper", "label": f"your cell below {lab}",
                               "source": s} for s in extras.get(lab, [])]
            jobs.append({"grade_id": label, "points": float(meta.get("points", 0)),
                         "cells": job_cells, "test": cell.source})
            pending = []
            cells.append(("test", label, cell.source))
        elif meta.get("solution"):
            cells.append(("solution", label, cell.source))
            pending.append(cells[-1])
        else:
            cells.append(("setup", label, cell.source))
    return jobs


def _cell(source: str):
    return nbformat.v4.new_code_cell(source, metadata={"nbgrader": {"solution": True}})


def _definitions(source: str) -> str:
    """The imports, ``def``s and ``class``es of a learner's cell, and nothing it would run.

    Another exercise's answer is the instructor's in this job, but a helper the learner wrote
    in it (and uses in this exercise's answer) must exist: its definitions are kept, its
    statements are not (so a hang or a leak there costs that exercise alone).
    """
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return ""
    kept = [node for node in tree.body if isinstance(node, (
        ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
    return "\n\n".join(ast.unparse(node) for node in kept)


def _learner_cells(learner_nb) -> tuple[dict[str, str], dict[str, list[str]]]:
    """({grade_id: the learner's answer}, {grade_id: the learner's own cells below it}).

    Note [The learner's notebook as written]
    A learner may split an answer cell (JupyterLab's split copies the nbgrader metadata to
    both halves): the halves of one grade id are merged, in order, into one answer. A learner
    may also write helper cells of their own (no nbgrader metadata) anywhere: each is filed
    under the last labelled cell above it (setup, answer or test), and runs in every job
    that runs that cell, after it: as part of the answer below this exercise's answer, as a
    ``helper`` elsewhere (a helper that raises costs nothing; the runner says so). Cells of
    the learner's below a test cell run in later exercises only; the test cell itself always
    comes from the instructor copy.
    """
    answers: dict[str, str] = {}
    extras: dict[str, list[str]] = {}
    anchor = None
    for cell in learner_nb.cells:
        meta = nbgrader_meta(cell)
        if meta.get("grade_id"):
            anchor = meta["grade_id"]
            if meta.get("solution") and cell.cell_type == "code":
                answers[anchor] = (answers[anchor] + "\n" + cell.source
                                   if anchor in answers else cell.source)
        elif cell.cell_type == "code" and anchor is not None and cell.source.strip():
            extras.setdefault(anchor, []).append(cell.source)
    return answers, extras


def _leftovers(lang: str) -> dict[str, str]:
    """``sandbox.LEFTOVERS`` in ``lang``: format strings, filled in by the sandbox."""
    return {"alive": tr("grader: {n} process(es) your code started were still running when "
                        "the check ended; the sandbox killed them", lang=lang),
            "shm": tr("grader: {n} file(s) left in /dev/shm after the check; the sandbox "
                      "removed them", lang=lang)}


def _protected(cwd, source_dir) -> list[str]:
    """Paths the sandbox must show read-only (it checks each and says if one is not).

    Not the notebook's folder: the sandbox lays a throwaway overlay over it (``sandbox``).
    """
    paths = {sysconfig.get_paths()[k] for k in ("purelib", "platlib", "stdlib")}
    paths |= {str(Path(__file__).resolve().parents[1]), str(Path(source_dir))}
    return sorted(paths)


def run_job(job: dict, cwd, cell_timeout: float, deadline: float,
            source_dir=SOURCE, lang: str = "en") -> Exercise:
    """Run one exercise in a fresh sandbox (``sandbox``); the verdict or why there is none.
    ``lang``: the language of the checks' messages (``SHMLAB_LANG`` in the sandbox)."""
    start = time.monotonic()
    rfd, wfd = os.pipe()
    tmpdir = tempfile.mkdtemp(prefix="shmlab-grade-")  # the sandbox mounts a tmpfs on it
    argv = [sys.executable, "-I", "-S", sandbox.__file__, str(wfd), tmpdir,
            json.dumps([sys.executable, "-c", _RUNNER]),
            json.dumps(_protected(cwd, source_dir)), json.dumps(_leftovers(lang))]
    proc = subprocess.Popen(argv, cwd=cwd, pass_fds=(wfd,), stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True, env=dict(os.environ, SHMLAB_LANG=lang))
    os.close(wfd)
    with _suppress():  # a sandbox that died before its runner read the job: a row says so
        proc.stdin.write(json.dumps(job).encode())
    with _suppress():
        proc.stdin.close()
    output, messages, reason = _collect(proc, rfd, cell_timeout, deadline)
    with _suppress():
        os.killpg(proc.pid, signal.SIGKILL)  # the sandbox, and with it all the learner started
    proc.wait()
    shutil.rmtree(tmpdir, ignore_errors=True)
    isolation = next((m["sandbox"] for m in messages if "sandbox" in m), "none")
    verdict = next((m["verdict"] for m in messages if "verdict" in m), None)
    if verdict is None and not reason:
        last = next((m["cell"] for m in reversed(messages) if "cell" in m), "start-up")
        reason = tr("the process died (exit status {status}) while running {cell}, before "
                    "the check finished: os._exit, a crash or a kill scores 0", lang=lang,
                    status=proc.returncode, cell=last)
    passed = bool(verdict and verdict.get("passed")) and not reason
    error = reason or ("" if passed else verdict.get("reason", "failed"))
    text = output + (verdict or {}).get("traceback", "") + (f"\n-> {error}\n" if error else "")
    return Exercise(job["grade_id"], job["points"], job["points"] if passed else 0.0, error,
                    text[-20000:], round(time.monotonic() - start, 2), isolation)


class _suppress:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return exc[0] is not None and issubclass(exc[0], OSError)


def _collect(proc, rfd, cell_timeout: float, deadline: float):
    """Read the runner's output and messages until it closes both, or a time limit passes."""
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    sel.register(rfd, selectors.EVENT_READ)
    out, buf, messages, reason = bytearray(), b"", [], ""
    cell_deadline = time.monotonic() + cell_timeout
    current = "start-up"
    open_fds = 2
    while open_fds:
        limit = min(cell_deadline, deadline)
        wait = limit - time.monotonic()
        if wait <= 0:
            which = "cell" if cell_deadline <= deadline else "notebook"
            reason = (f"{current} ran past the {which} time limit "
                      f"({cell_timeout:g} s per cell)" if which == "cell" else
                      f"{current} ran past the notebook's time limit")
            break
        for key, _ in sel.select(timeout=wait):
            fd = key.fd
            data = os.read(fd, 65536)
            if not data:
                sel.unregister(key.fileobj)
                open_fds -= 1
            elif fd == rfd:
                buf += data
                *lines, buf = buf.split(b"\n")
                for line in lines:
                    msg = json.loads(line)
                    messages.append(msg)
                    if "cell" in msg:
                        current, cell_deadline = msg["cell"], time.monotonic() + cell_timeout
            else:
                out += data
    sel.close()
    os.close(rfd)
    return out.decode("utf-8", "replace"), messages, reason


def _read_notebook(path: Path):
    try:
        return nbformat.read(path, as_version=4), ""
    except FileNotFoundError:
        return None, f"no such file: {path}"
    except Exception as exc:  # not JSON, not a notebook: a row that says so
        return None, f"{path} is not a readable notebook ({type(exc).__name__}: {exc})"


def grade(path, source_dir=SOURCE, timeout: float = 120, notebook_timeout: float = 900,
          sources: dict[str, bytes] | None = None, only=None) -> Result:
    """Score the notebook at ``path`` against the instructor copy of the same name.

    ``sources`` are instructor copies already verified (a batch passes them); without it they
    are read from ``source_dir`` and verified now (``IntegrityError`` if one was modified).
    ``only``: grade just these grade_ids (a test's shortcut). Runners start in the notebook's
    folder. Never raises for a learner's notebook: a problem
    with it (misnamed, unreadable) is the Result's ``problem``.
    """
    path = Path(path)
    sources = integrity.load_sources(source_dir) if sources is None else sources
    start = time.monotonic()
    if path.name not in sources:
        return Result(str(path), [], 0.0, f"no instructor copy for {path.name}: name it like "
                      f"one of {', '.join(sorted(sources))} (graded nothing)")
    learner, problem = _read_notebook(path)
    if problem:
        return Result(str(path), [], 0.0, problem)
    source_nb = nbformat.reads(sources[path.name].decode("utf-8"), as_version=4)
    deadline = start + notebook_timeout
    # A Chinese learner copy (labs/zh/) has the same cells and ids: the same jobs and marks,
    # its messages in Chinese. An unknown language is graded in English.
    lang = learner.metadata.get("language", "en")
    lang = lang if lang in ("en", "zh") else "en"
    jobs = [dict(job, outside=path.name in OUTSIDE) for job in plan(source_nb, learner)
            if only is None or job["grade_id"] in only]
    exercises = [run_job(job, str(path.parent.resolve()), timeout, deadline, source_dir, lang)
                 for job in jobs]
    return Result(str(path), exercises, time.monotonic() - start, language=lang)


def grade_batch(paths, source_dir=SOURCE, timeout: float = 120,
                notebook_timeout: float = 900) -> list[Result]:
    """Grade every notebook; each becomes a row, whatever it did (see the module's Note)."""
    sources = integrity.load_sources(source_dir)  # refuses a modified copy before any grading
    grader = integrity.grader_files()
    results = []
    for path in paths:
        result = grade(path, source_dir, timeout, notebook_timeout, sources)
        wrote = integrity.changed_sources(source_dir, sources)
        if integrity.grader_files() != grader:
            wrote.append("the grader's own files (shmlab/labs/*.py)")
        if wrote:
            result.problem = (f"this notebook wrote {', '.join(wrote)} while it was graded: "
                              "scored 0 (the batch kept grading from the verified copies; "
                              "reinstall shmlab before the next batch)")
            for e in result.exercises:
                e.score, e.error = 0.0, e.error or "voided: the notebook wrote the grader's files"
        results.append(result)
    return results


def print_table(result: Result) -> None:
    lang = language(result.language)
    print(f"{result.notebook}  ({result.seconds:.1f} s)")
    for e in result.exercises:
        mark = "✅" if e.score == e.points else "❌"
        print(f"  {mark} {e.grade_id:<28} {e.score:g}/{e.points:g}"
              + (f"   {e.error}" if e.error else ""))
    if result.problem:
        print(f"  ❌ {result.problem}")
    if result.isolation and result.isolation != sandbox.FULL:
        print(f"  ⚠️ sandbox {result.isolation}")
    print("  " + tr("total {score}/{max}", lang=lang, score=f"{result.score:g}",
                    max=f"{result.max_score:g}"))
