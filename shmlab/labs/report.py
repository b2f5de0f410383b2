"""One line per case, ✅ or ❌ with a hint, and an AssertionError if any case failed.

Note [A check's output is the hint, not a traceback]
In JupyterLab a failed check would end in a traceback through this file (and, for an unfinished
answer, a second one chained to it: ~40 lines under the one-line hint). The lines printed above
it already say what failed and why, so in an IPython kernel (``_install_hints``) a failed
check's AssertionError shows as one line, and a check cell run before its answer cell (a
NameError naming the learner's function) says which cell to run. It is still an error: Run All
stops there, and the grader (plain Python, no IPython) sees the same AssertionError as before.
"""

from __future__ import annotations

import linecache
import os
import re
import threading
import traceback

from .._shm import SHM_DIR
from ..messages import tr


class Cases:
    """Collects the cases of one exercise's check and reports them like a test runner would.

    Use as a context manager: ``with Cases("Exercise 1") as c: c.check(ok, "what", hint=...)``.
    An exception escaping the block (the learner's code raised) becomes a failed case with the
    exception's last line, so a learner sees *which* case broke rather than a bare traceback.
    """

    def __init__(self, title: str):
        self.title = title
        self.failed: list[str] = []
        self.passed = 0

    def __enter__(self) -> Cases:
        print(f"{self.title}")
        self._family = _Family()
        self._shm_before = _shm_files(self._family.pids)
        return self

    def check(self, ok: bool, what: str, hint: str = "") -> bool:
        if ok:
            self.passed += 1
            print(f"  ✅ {what}")
        else:
            self.failed.append(what)
            print(f"  ❌ {what}" + ("\n     " + tr("hint: {hint}", hint=hint) if hint else ""))
        return bool(ok)

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc_type is NotImplementedError:
            self.check(False, tr("not implemented yet"), tr(
                "fill in the cell above (replace the `raise NotImplementedError()` line) and "
                "run it, then run this cell again"))
        elif exc_type is not None and not issubclass(exc_type, AssertionError):
            self._raised(exc_type, exc, tb)
        self._family.stop()
        leaked = _shm_files(self._family.pids) - self._shm_before
        for name in sorted(leaked):  # clean up after the learner's code, and say so
            try:
                os.unlink(os.path.join(SHM_DIR, name))
            except FileNotFoundError:
                pass
        if leaked:
            self.check(False, tr("left {n} file(s) in /dev/shm (removed now)", n=len(leaked)),
                       tr("every segment needs an owner that unlinks it on every path"))
        total = self.passed + len(self.failed)
        print("  " + tr("{passed}/{total} cases passed", passed=self.passed, total=total))
        if self.failed:
            err = AssertionError(tr("{title}: {n} case(s) failed: ", title=self.title,
                                    n=len(self.failed)) + tr("; ").join(self.failed))
            err.shmlab_check = True  # said above: shown without a traceback (Note above)
            raise err from None  # the learner's exception was reported as a case already
        return exc_type is None


    def _raised(self, exc_type, exc, tb) -> None:
        """Say who raised: the learner's code (with its traceback) or the check itself."""
        from .integrity import is_learner_frame

        last = traceback.format_exception_only(exc_type, exc)[-1].strip()
        frames = traceback.extract_tb(tb)
        mine = [i for i, f in enumerate(frames) if is_learner_frame(f.filename)]
        remote = getattr(exc, "shmlab_learner_traceback", None)
        if remote is not None:  # raised in the learner's process (``remote``): its traceback
            where = [ln for ln in remote.splitlines() if ln.strip().startswith('File "<')]
            self.check(False, tr("your code raised {error}", error=last),
                       where[-1].strip() if where else "")
        elif mine:  # the learner's innermost line: where to look (the grader's frames are noise)
            at = frames[mine[-1]]
            deeper = "" if mine[-1] == len(frames) - 1 else tr(
                ", inside {file}", file=os.path.basename(frames[-1].filename))
            self.check(False, tr("your code raised {error}", error=last),
                       tr("{cell}, line {line}, in {function}{deeper}:", cell=_cell_name(
                           at.filename), line=at.lineno, function=at.name, deeper=deeper)
                       + f"\n       {(at.line or '').strip()}")
        else:
            where = frames[-1] if frames else None
            at = tr(" at {file}:{line}", file=os.path.basename(where.filename),
                    line=where.lineno) if where else ""
            self.check(False, tr("the check raised {error}{at}, after your code returned",
                                 error=last, at=at),
                       tr("usually your function returned something the check could not use "
                          "(an fd already closed, a name that is gone): look at what it "
                          "returns"))


def _cell_name(filename: str) -> str:
    """'your cell In[7]' for a notebook cell's code (In[7] as IPython names it), else the
    file's name."""
    try:
        from IPython import get_ipython

        count = get_ipython().compile._filename_map[filename]
        return tr("your cell In[{count}]", count=count)
    except Exception:  # noqa: BLE001 - not in IPython, or not a cell: the plain name
        return (tr("your cell {name}", name=filename) if filename.startswith("<")
                else os.path.basename(filename))


_CHECK_CALL = re.compile(r"\blab\d+\.check_\w+\(")


def _hint_handler(shell, etype, value, tb, tb_offset=None):
    """IPython's handler for AssertionError and NameError (Note [A check's output is the hint,
    not a traceback]): short for a failed check and for a check run too early; otherwise the
    usual traceback."""
    short = None
    if getattr(value, "shmlab_check", False):
        short = f"{etype.__name__}: {value}"
    elif issubclass(etype, NameError) and getattr(value, "name", None) and tb is not None:
        last = tb
        while last.tb_next is not None:  # the innermost frame: the check cell itself, if the
            last = last.tb_next          # name was missing there and not deeper in a call
        cell = "".join(linecache.getlines(last.tb_frame.f_code.co_filename))
        if _CHECK_CALL.search(cell):
            short = f"{etype.__name__}: {value}\n❌ " + tr(
                "this check needs `{name}`, which no cell has defined yet: run the answer "
                "cell above that defines `{name}` (or Run All Above), then run this check "
                "again", name=value.name)
    if short is None:
        shell.showtraceback((etype, value, tb), tb_offset=tb_offset)
    else:
        shell._showtraceback(etype, value, short.splitlines())
    return None


def _install_hints() -> None:
    """In an IPython kernel, show failed checks without a traceback (see the Note above)."""
    try:
        from IPython import get_ipython
    except ImportError:
        return
    shell = get_ipython()
    if shell is not None and not shell.custom_exceptions:  # never replace someone's handler
        shell.set_custom_exc((AssertionError, NameError), _hint_handler)


_install_hints()


def fd_count(pid: int | None = None) -> int:
    """Open fds of this process (or of ``pid``, read from outside), less the /proc files a
    poller (``_Family``) holds for a moment.

    Checks compare two counts around the learner's call; a /proc read in another thread must
    not look like a leak.
    """
    n, where = 0, f"/proc/{pid or 'self'}/fd"
    for fd in os.listdir(where):
        try:
            link = os.readlink(f"{where}/{fd}")
            # "/proc" itself: psutil's listdir("/proc") in the poller holds a directory fd
            n += not (link == "/proc" or link.startswith("/proc/"))
        except OSError:
            pass  # closed between the listing and the look: it was transient
    return n


# Pids whose segments a check here reports as its own: the learner's process, when the check
# runs outside it (``remote.Learner``).
OWNERS: set[int] = set()


def _shm_files(family: set[int]) -> set[str]:
    """Segments this process or one of its children (now dead) made: ours to report and remove.

    Names carry the creator's pid. On a shared machine a dead creator may be anybody's, so only
    pids seen among our descendants while the check ran count; a file of another process is
    never reported or removed. (psm_ names carry none.)
    """
    from ..introspect import shm_segments

    return {s.name for s in shm_segments() if s.creator_pid in {os.getpid(), *OWNERS}
            or (s.creator_alive is False and s.creator_pid in family)}


class _Family:
    """The pids of this process's descendants, polled every 20 ms until ``stop()``.

    A child that makes a segment and dies within 20 ms may be missed: its leak then goes
    unreported (lenient), never blamed on somebody else (unjust).
    """

    def __init__(self):
        import psutil

        self.pids: set[int] = set()
        self._me, self._done = psutil.Process(), threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True, name="cases-family")
        self._thread.start()

    def _poll(self) -> None:
        import psutil

        while True:
            try:
                self.pids.update(p.pid for p in self._me.children(recursive=True))
            except psutil.Error:
                pass
            if self._done.wait(0.02):
                return

    def stop(self) -> None:
        self._done.set()
        self._thread.join()


def run_in_child(fn, *args, timeout: float = 30.0):
    """Run ``fn(*args)`` in a fork child and return its result (or raise what it raised).

    fork, because the learner's functions live in the notebook's ``__main__``, which spawn
    cannot import: ``fn`` and ``args`` reach the child as they are, never pickled. The child
    is an ``Actor`` with a one-command table. A child that hangs is killed after ``timeout`` s.
    """
    return answer(start_child(fn, *args), timeout)


def start_child(fn, *args):
    """Fork the child of ``run_in_child`` now; ``answer(child)`` runs ``fn(*args)`` there."""
    from ..harness.actor import Actor

    return Actor(_call_table, fn, args, ctx="fork", name=str(getattr(fn, "__name__", fn)))


def answer(child, timeout: float = 30.0):
    """What the child's ``fn(*args)`` returned (or raise what it raised); then kill it."""
    from ..harness.actor import ActorDied, ActorError

    try:
        return child("call", timeout=timeout)
    except TimeoutError:
        raise TimeoutError(tr("{name} did not finish in {timeout} s", name=child.name,
                              timeout=f"{timeout:.0f}")) from None
    except ActorDied:
        raise RuntimeError(tr("the child process died before answering")) from None
    except ActorError as err:  # the same type, so NotImplementedError stays itself
        raise err.exception or RuntimeError(f"{err.type}: {err.message}") from None
    finally:
        child.kill()  # as soon as it answered, as before: what it made is checked, not its exit


def _call_table(fn, args) -> dict:
    """The table of a ``run_in_child`` child: one command, ``call``, replies ``fn(*args)``."""
    return {"call": lambda: fn(*args)}
