"""The verdict outside the learner's process (issue 27, item 3): cheats that reach the check.

Each cheat below scores marks on the old path (the check in the learner's process, which a
lab missing from ``grade.OUTSIDE`` takes) and 0 on the new one (Note [The verdict outside the
learner's process], in ``shmlab.labs.outside``). Each test grades the same notebook both ways.
"""

from __future__ import annotations

import pytest
from test_grader_cheats import notebook

from shmlab.labs import grade, wire

pytestmark = pytest.mark.timeout(400)

LAB = "lab1_reducers"

# A float whose comparisons are always true: the Point it rebuilds "equals" any Point.
ALWAYS_EQUAL = '''
class _Yes(float):
    def __eq__(self, other):
        return True

    def __ne__(self, other):
        return False

    __hash__ = float.__hash__


def rebuild_point(x, y):
    return Point(_Yes(0), _Yes(0))


def reduce_point(p):
    return (rebuild_point, (0, 0))


ForkingPickler.register(Point, reduce_point)
'''

# Cases.check patched for one case at a time, put back by the patch itself: the fingerprint
# taken after the check sees the original. (0 pickles to "0 < 1,000 bytes": that case is true.)
SELF_RESTORING = '''
import shmlab.labs.report as _r

_real = _r.Cases.__dict__["check"]


def _check(self, ok, what, hint=""):
    _r.Cases.check = _real  # back at once: the check's next line finds the original
    print("  ✅", what)
    return True


def pickle_size(n):
    _r.Cases.check = _check
    return 0
'''

# The check's own Cases object, found through the caller's frames, made into a yes-man.
FRAMES = '''
import sys
from shmlab.labs.report import Cases as _Cases


class _Yes(_Cases):
    def check(self, ok, what, hint=""):
        print("  ✅", what)
        return True

    def __exit__(self, *exc):
        return True


def pickle_size(n):
    f = sys._getframe(1)
    while f is not None:
        for v in list(f.f_locals.values()):
            if isinstance(v, _Cases):
                v.__class__ = _Yes
        f = f.f_back
    return 0
'''

# What Cases.check records, found with gc.get_objects(): every case now passes.
GC = '''
import gc


def pickle_size(n):
    for o in gc.get_objects():
        if type(o).__name__ == "_Streamed":
            o.recorded = lambda cases, ok, what, hint="": print("  ✅", what) or True
    return 0
'''

# The runner's own messages, written to every fd it might have, then a quiet exit.
FORGED = '''
import os


def pickle_size(n):
    print("  ✅ pickle_size(10) = 354\\n  6/6 cases passed", flush=True)
    lines = (b'{"cell": "test"}\\n'
             b'{"verdict": {"passed": true, "reason": "", "traceback": ""}}\\n')
    for fd in range(3, 64):
        try:
            os.write(fd, lines)
        except OSError:
            pass
    os._exit(0)
'''

CHEATS = {"always-equal float": (LAB, "ex1_point_reducer", ALWAYS_EQUAL),
          "self-restoring patch": (LAB, "ex3_pickle_size", SELF_RESTORING),
          "Cases through frames": (LAB, "ex3_pickle_size", FRAMES),
          "Cases through gc": (LAB, "ex3_pickle_size", GC),
          "forged messages": (LAB, "ex3_pickle_size", FORGED),
          "lab 2 forged messages": ("lab2_file_descriptors", "ex1_unlinked_segment",
                                    FORGED.replace("pickle_size(n)",
                                                   "create_unlinked_segment(size)"))}


@pytest.mark.parametrize("cheat", CHEATS, ids=list(CHEATS))
def test_a_cheat_on_the_check_scores_on_the_old_path_and_zero_outside(cheat, tmp_path,
                                                                       monkeypatch):
    lab, gid, code = CHEATS[cheat]
    path = notebook(lab, {gid: code}, tmp_path)
    only = {f"test_{gid}"}
    (outside,) = grade.grade(path, only=only).exercises
    assert outside.score == 0, outside
    monkeypatch.setattr(grade, "OUTSIDE", set())  # the old path: the check in the learner's
    (inside,) = grade.grade(path, only=only).exercises
    assert inside.score == inside.points, inside


REACH = '''
import ctypes
import os


def pickle_size(n):
    checker = os.getppid()  # the check process started this one
    def open_its_fds():
        for fd in os.listdir(f"/proc/{checker}/fd"):  # its numbers show; its files do not
            os.close(os.open(f"/proc/{checker}/fd/{fd}", os.O_WRONLY))

    for what, probe in (("fd", open_its_fds),
                        ("mem", lambda: open(f"/proc/{checker}/mem", "rb").close())):
        try:
            probe()
            print("REACHED", what)
        except PermissionError:
            print("DENIED", what)
    libc = ctypes.CDLL(None, use_errno=True)
    attached = libc.ptrace(16, checker, None, None) == 0  # PTRACE_ATTACH
    print("REACHED ptrace" if attached else "DENIED ptrace")
    return len(__import__("multiprocessing.reduction").reduction.ForkingPickler.dumps(
        __import__("shmlab").zeros(n)))
'''


def test_the_learners_process_cannot_reach_the_check_process(tmp_path):
    path = notebook(LAB, {"ex3_pickle_size": REACH}, tmp_path)
    (ex,) = grade.grade(path, only={"test_ex3_pickle_size"}).exercises
    assert ex.score == ex.points, ex  # a correct answer, graded as usual
    for what in ("fd", "mem", "ptrace"):
        assert f"DENIED {what}" in ex.output, ex.output
    assert "REACHED" not in ex.output, ex.output


class _Yes(float):
    def __eq__(self, other):
        return True

    __hash__ = float.__hash__


def test_only_exact_builtin_types_cross_as_data():
    handles = []

    def handle(obj):
        handles.append(obj)
        return {"h": len(handles) - 1}

    value = (1, 2.5, "s", b"b", None, True, [1, {"k": (2,)}], float("inf"), _Yes(3))
    back = wire.decode(wire.encode(value, handle), lambda n: ("handle", n))
    assert back[:8] == value[:8]
    assert back[8] == ("handle", 0) and handles == [value[8]]
    err = wire.decode_error(wire.encode_error(FileExistsError(17, "File exists")))
    assert type(err) is FileExistsError and err.errno == 17
    sub = type("Mine", (KeyError,), {})
    assert type(wire.decode_error(wire.encode_error(sub("x")))) is KeyError
