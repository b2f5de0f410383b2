"""Checks for lab 3: the 64-byte refcount header, attach/close, safe updates, a safe attach.

Mirrors: nothing in torch; the scheme is torch's ``file_system`` strategy's refcount
(``libshm``'s ``THManagedMapAllocator``). Each check runs in the notebook on the learner's
objects, and in the grader's check process on proxies of them (``remote.place``): the counts
are read from the segment in ``/dev/shm``, the locks from ``/proc/locks`` and the fds from
``/proc/<pid>/fd``, all from outside; what must run next to the learner's code (the hammering
children, an attach in a thread) is a routine of this module run there (Note [The verdict
outside the learner's process]).
"""

from __future__ import annotations

import _posixshmem
import contextlib
import fcntl
import mmap
import os
import struct

from .. import _shm
from .._shm import SHM_DIR
from .._shm.headerlock import MAGIC
from ..messages import N_, tr
from . import wire
from .remote import place
from .report import Cases, fd_count

_COUNT = struct.Struct("<i")  # the header's int32 at offset 0, as the lab's set-up reads it


def _count(name: str):
    return _shm.read_refcount(name)


def _remove(name: str) -> None:
    """Remove the check's own segment, whatever the learner's code did to it."""
    try:
        os.unlink(f"{SHM_DIR}{name}")
    except FileNotFoundError:
        pass


def _header_left_alone(c: Cases, name: str) -> bool:
    """Bytes [4:64) are shmlab's own mark and lock: a learner's 8-byte write breaks them."""
    with open(f"{SHM_DIR}{name}", "rb") as f:
        intact = f.read(8)[4:8] == MAGIC
    return c.check(intact, tr("your code left header bytes [4:64) alone (shmlab's mark and "
                              "lock)"),
                   tr("read and write only the int32 at [0:4): struct.Struct('<i'), 4 bytes"))


@contextlib.contextmanager
def _removed(name: str):
    try:
        yield
    finally:
        _remove(name)


def _byte_at(mapping, offset: int) -> bytes:
    return bytes(memoryview(mapping)[offset:offset + 1])


def check_attach_close(attach, close):
    at = place(attach, close)
    name = _shm.new_name()
    with Cases(tr("Exercise 1: attach and close on the refcount header")) as c, \
            _removed(name):
        creator = _shm.create_refcounted(name, 16)  # count 1, as the creator holds it
        creator_buf = creator.buffer(_shm.HEADER_SIZE)
        creator_buf[0] = 42
        fds_before = fd_count(at.pid)
        m = attach(name, 16)
        c.check(_count(name) == 2, tr("attach: 1 -> 2 (got {got})", got=_count(name)),
                tr("read the int32 at offset 0, add 1, write it back"))
        c.check(at.run(_byte_at, m, _shm.HEADER_SIZE) == b"\x2a",
                tr("the attached mapping sees the creator's byte at offset 64"),
                tr("map HEADER_SIZE + size bytes; the data starts after the 64-byte header"))
        close(name, m)
        c.check(_count(name) == 1, tr("close: 2 -> 1 (got {got})", got=_count(name)),
                tr("subtract 1 from the count"))
        left = fd_count(at.pid) - fds_before
        c.check(left == 0, tr("after attach and close, no fd is left open ({n} left)", n=left),
                tr("the mapping keeps its own reference to the segment: the fd you opened to "
                   "map it is yours to close, in attach and in close, on every path"))
        c.check(os.path.exists(f"{SHM_DIR}{name}"),
                tr("the file stays while the creator holds it"),
                tr("unlink only when the count reaches 0"))
        m2 = attach(name, 16)
        if not _header_left_alone(c, name):
            return
        _shm.decref(name)  # the creator lets go: count 2 -> 1
        close(name, m2)
        unlinked = not os.path.exists(f"{SHM_DIR}{name}")
        _remove(name)
        c.check(unlinked, tr("the last closer unlinks the name"),
                tr("when your decrement brings the count to 0, shm_unlink(name)"))
        del m, m2
        at.sync()
    _check_attach_errors(attach)


def _check_attach_errors(attach):
    """attach on the paths that fail: a map that cannot be made, a name that is gone."""
    at = place(attach)
    name = _shm.new_name()
    with Cases(tr("Exercise 1: attach when it fails")) as c, _removed(name):
        _shm.create_refcounted(name, 16)
        fds_before = fd_count(at.pid)
        got = at.run(_raised, attach, name, 1 << 20)  # more than the file holds: mmap refuses
        c.check(got is not None, tr("mapping more than the segment holds raises ({error})",
                                    error=got),
                tr("let mmap's error through"))
        c.check(_count(name) == 1, tr("... and leaves the count at 1 (got {got})",
                                      got=_count(name)),
                tr("map first, count yourself in after: a failed attach holds no reference, "
                   "so a count raised before a map that fails is never given back"))
        c.check(fd_count(at.pid) == fds_before, tr("... and no fd open ({n} left)",
                                                   n=fd_count(at.pid) - fds_before),
                tr("close the fd on the raising path too (try/finally)"))
        _remove(name)
        fds_before = fd_count(at.pid)
        got = at.run(_raised, attach, name, 16)
        c.check(got == "FileNotFoundError", tr(
                "a name that is gone raises FileNotFoundError (got {got})", got=got),
                tr("shm_open raises it: let it through"))
        c.check(fd_count(at.pid) == fds_before, tr("... and leaves no fd open"))


def _raised(fn, *args):
    """The name of the exception ``fn(*args)`` raised (``_named``), or None (closing what it
    returned)."""
    try:
        _close(fn(*args))
    except Exception as exc:  # the learner's choice of exception is what is checked
        return _named(exc)
    return None


def check_concurrent_updates(incref, decref, processes=4, n=400):
    at = place(incref, decref)
    name = _shm.new_name()
    with Cases(tr("Exercise 2: refcount updates that are safe across processes")) as c, \
            _removed(name):
        _shm.create_refcounted(name, 8)
        raised = _not_implemented_in(at.run_in_child(_hammer, incref, name, processes,
                                                     n, timeout=120))
        want = 1 + processes * n
        c.check(not raised and _count(name) == want,
                tr("{processes} processes x {n} increments at once: {want} expected, got {got}",
                   processes=processes, n=n, want=want, got=_count(name))
                + (f" ({raised})" if raised else ""),
                tr("two read-modify-writes interleaved and one update was lost: what keeps "
                   "another process out between your read and your write?"))
        _set_count(name, want)
        raised = _not_implemented_in(at.run_in_child(_hammer, decref, name, processes,
                                                     n, timeout=120))
        c.check(not raised and _count(name) == 1,
                tr("{processes} processes x {n} decrements at once: back to 1, got {got}",
                   processes=processes, n=n, got=_count(name))
                + (f" ({raised})" if raised else ""),
                tr("read the count after you hold the lock, and write it back before you "
                   "let go: a count read before LOCK_EX, or written after LOCK_UN, is stale"))
        _set_count(name, 1)
        unlinks = at.run(_unlinks_of, decref, name)
        unlinked = not os.path.exists(f"{SHM_DIR}{name}")
        c.check(unlinked, tr("the decrement to 0 unlinks"),
                tr("when the count reaches 0, shm_unlink"))
        c.check(unlinks == [True], tr("it unlinks while holding the lock (shm_unlink calls, "
                                      "locked or not: {unlinks})", unlinks=unlinks),
                tr("between taking the lock and releasing it: otherwise an attach can slip in "
                   "after the count hit 0 and before the name is gone"))


def _not_implemented_in(raised: str) -> str:
    """What ``_hammer``'s children raised; an unfinished answer (every child raised
    NotImplementedError) is raised here, so that ``Cases`` reports it as not implemented yet."""
    lines = raised.splitlines()
    if lines and all(line.startswith("NotImplementedError") for line in lines):
        raise NotImplementedError("the children raised NotImplementedError")
    return raised


def _locks_on(path: str) -> list[str]:
    """The locks the kernel lists in /proc/locks on the file at ``path``, of any kind
    (FLOCK, POSIX from fcntl.lockf, OFDLCK), waiters left out."""
    st = os.stat(path)
    ident = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    with open("/proc/locks") as f:
        return [line for line in f if "->" not in line and ident in line.split()]


@contextlib.contextmanager
def _watching_unlink(fn):
    """Swap ``shm_unlink`` in ``fn``'s globals for one that records whether a lock is held
    on the file (any kind the kernel lists: flock, fcntl.lockf, an OFD lock)."""
    names, seen = fn.__globals__, []
    real = names.get("shm_unlink")

    def shm_unlink(name):
        seen.append(bool(_locks_on(f"{SHM_DIR}{name}")))
        return _posixshmem.shm_unlink(name)

    names["shm_unlink"] = shm_unlink
    try:
        yield seen
    finally:
        if real is None:
            names.pop("shm_unlink", None)
        else:
            names["shm_unlink"] = real


def _unlinks_of(decref, name: str) -> list[bool]:
    """``decref(name)``, watched: for each shm_unlink it called, was a lock held."""
    with _watching_unlink(decref) as unlinks:
        decref(name)
    return unlinks


def _hammer(update, name, processes, n):
    """``processes`` processes call ``update(name)`` ``n`` times each, all at once; the
    exceptions they raised ('' if none).

    Each read of the header is followed, and each write preceded, by a short sleep (os.pread
    and os.pwrite are wrapped in these children only): a read-modify-write that another process
    can enter then loses updates on every run, not only when the scheduler happens to switch
    at the wrong instruction. Under a lock the sleeps only slow it down.
    """
    import time

    real_read, real_write = os.pread, os.pwrite

    def pread(*args):
        data = real_read(*args)
        time.sleep(50e-6)
        return data

    def pwrite(*args):
        time.sleep(50e-6)
        return real_write(*args)

    go_r, go_w = os.pipe()
    out_r, out_w = os.pipe()
    children = []
    for _ in range(processes):
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                os.close(go_w)
                os.pread, os.pwrite = pread, pwrite
                os.read(go_r, 1)  # all start together
                for _ in range(n):
                    update(name)
            except BaseException as exc:
                os.write(out_w, f"{type(exc).__name__}: {exc}"[:200].encode() + b"\n")
                code = 1
            os._exit(code)
        children.append(pid)
    os.close(out_w)
    os.write(go_w, b"x" * processes)
    os.close(go_w)
    for pid in children:
        os.waitpid(pid, 0)
    raised = b""
    while chunk := os.read(out_r, 4096):
        raised += chunk
    os.close(out_r)
    os.close(go_r)
    return raised.decode(errors="replace").strip()


def check_in_flight(send_handle, receive_handle, close):
    at = place(send_handle, receive_handle, close)
    name = _shm.new_name()
    with Cases(tr("Exercise 3: the count a message holds while it is in flight")) as c, \
            _removed(name):
        _shm.create_refcounted(name, 8)
        message = send_handle(name)
        c.check(_count(name) == 2, tr("sending: 1 -> 2 (got {got})", got=_count(name)),
                tr("incref before the message leaves: the sender may drop its own reference "
                   "before the receiver attaches"))
        if not _header_left_alone(c, name):
            return
        _shm.decref(name)  # the sender drops its tensor at once: the message keeps it alive
        c.check(os.path.exists(f"{SHM_DIR}{name}"), tr("the segment survives its sender"),
                tr("that is what the in-flight count is for"))
        m = receive_handle(message, 8)
        c.check(_count(name) == 1, tr("received: attach +1, release the in-flight count -1 "
                                      "(got {got})", got=_count(name)),
                tr("attach, then decref once for the message"))
        close(name, m)
        unlinked = not os.path.exists(f"{SHM_DIR}{name}")
        c.check(unlinked, tr("the receiver, the last holder, unlinks on close"))
        del m
        at.sync()
    _check_receive_fails(send_handle, receive_handle)


def _check_receive_fails(send_handle, receive_handle):
    """The receiver cannot map the segment: the message's count must be given back anyway."""
    at = place(send_handle, receive_handle)
    name = _shm.new_name()
    with Cases(tr("Exercise 3: a message whose receiver cannot attach")) as c, \
            _removed(name):
        _shm.create_refcounted(name, 8)
        message = send_handle(name)
        _shm.decref(name)  # the sender has let go: only the message holds it now
        got = at.run(_raised, receive_handle, message, 1 << 20)  # more than the file holds
        gone = not os.path.exists(f"{SHM_DIR}{name}")
        c.check(got is not None, tr("receive_handle lets attach's error through ({error})",
                                    error=got),
                tr("the caller must know it got nothing"))
        c.check(gone, tr("the in-flight count is given back on that path too: the last count "
                         "went, so the name went (count left: {n})",
                         n=_count(name) if not gone else 0),
                tr("release the message's count whether attach worked or raised "
                   "(try/finally), and let attach count itself in only after its map worked "
                   "(Exercise 1): otherwise nobody ever gives it back and the segment leaks"))



_DEADLOCK = N_("a second shm_open + flock in the same process waits for the first, so do not "
               "call incref (or anything else that locks) while you hold the lock")


def check_safe_attach(safe_attach):
    at = place(safe_attach)
    name = _shm.new_name()
    with Cases(tr("Exercise 4: an attach that cannot revive a segment being freed")) as c, \
            _removed(name):
        creator = _shm.create_refcounted(name, 16)
        creator.buffer(_shm.HEADER_SIZE)[0] = 7
        fds_before = fd_count(at.pid)
        worker, outcome = at.run(_attach_in_thread, safe_attach, name)
        if not c.check(worker.is_alive() is False, tr("safe_attach returns (within 5 s)"),
                       tr("it hung: {why}", why=tr(_DEADLOCK))):
            return
        m = outcome[0] if len(outcome) else None
        raised = at.run(_raised_by, m)
        if raised:  # on a live segment any exception is your code's: Cases shows it
            exc = wire.decode_error(raised)
            exc.shmlab_learner_traceback = ""
            raise exc
        c.check(_count(name) == 2, tr("a live segment: attach counts itself in, 1 -> 2 (got "
                                      "{got})", got=_count(name)),
                tr("read the count, add 1, write it back, all on the fd you locked"))
        c.check(at.run(_is_mmap, m) is True and at.run(_byte_at, m, _shm.HEADER_SIZE) == b"\x07",
                tr("it returns a mapping that sees the creator's data"),
                tr("return mmap.mmap(fd, HEADER_SIZE + size)"))
        c.check(_lock_free(name), tr("the lock is free once attach returns"),
                tr("a mapping made from the locked fd keeps its open file, and so the flock, "
                   "alive after os.close(fd): release it with LOCK_UN"))
        at.run(_close, m)  # Python's mmap holds a dup of the fd until it is closed
        c.check(fd_count(at.pid) == fds_before,
                tr("once the mapping is closed, no fd is left open"),
                tr("close the fd you opened"))
        _set_count(name, 0)  # its last holder has decremented to 0 and is about to unlink it
        fds_before = fd_count(at.pid)
        refused = at.run(_attach_outcome, safe_attach, name)
        c.check(refused == "FileNotFoundError", tr("a segment whose count is 0 is refused with "
                                                   "FileNotFoundError (got: {got})", got=refused),
                tr("a count of 0 means its last holder is unlinking it: mapping it now would "
                   "hand out memory nobody counts"))
        c.check(_count(name) == 0, tr("... and its count stays 0 (got {got})", got=_count(name)),
                tr("decide before you write anything"))
        c.check(fd_count(at.pid) == fds_before and _lock_free(name),
                tr("that path leaves no fd open and no lock held"),
                tr("the lock and the fd are released on the raising path too"))
        _set_count(name, 1)
        fds_before = fd_count(at.pid)
        got = at.run(_raised, safe_attach, name, 1 << 20)  # more than the file holds
        c.check(got is not None and _count(name) == 1 and fd_count(at.pid) == fds_before
                and _lock_free(name), tr(
                    "a map that fails raises ({error}), leaves the count at 1 (got {got}), no "
                    "fd open and no lock held", error=got, got=_count(name)),
                tr("map before you count yourself in: a reference counted for a mapping that "
                   "was never made is never given back"))
        _check_race(c, safe_attach, name)
        del creator, m, worker, outcome
        at.sync()


def _check_race(c, safe_attach, name):
    """Another process holds the lock, lets attach start, drops the count to 0, then lets go."""
    at = place(safe_attach)
    holder, go = _hold_locks(name)
    worker, outcome = at.run(_attach_in_thread, safe_attach, name, wait=0.3, then=_outcome)
    waited = worker.is_alive() is True
    os.write(go, b"x")  # the holder's decref brings the count to 0 and unlocks
    os.close(go)
    os.waitpid(holder, 0)
    worker.join(5)
    c.check(waited, tr("attach waits while another process holds the lock"),
            tr("take the lock on the fd before you read the count"))
    if not c.check(worker.is_alive() is False, tr("attach returns once the lock is free"),
                   tr("it hung: {why}", why=tr(_DEADLOCK))):
        return
    got = at.run(_named, outcome[0]) if len(outcome) else None
    c.check(got == "FileNotFoundError" and _count(name) == 0,
            tr("let in after that decrement to 0, it refuses (got: {got}, count {n})", got=got,
               n=_count(name)),
            tr("a count read before you held the lock can be stale by the time you write it "
               "back: read it under the lock"))


def _hold_locks(name):
    """Fork a process that holds every kind of lock on the segment (flock, and a POSIX lock,
    which OFD locks conflict with too) until told to go: then it writes the count 0 and lets
    go. Returns (its pid, the write end that tells it to go), once it holds them."""
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            a = os.open(f"{SHM_DIR}{name}", os.O_RDWR)
            b = os.open(f"{SHM_DIR}{name}", os.O_RDWR)
            fcntl.flock(a, fcntl.LOCK_EX)
            fcntl.lockf(b, fcntl.LOCK_EX)
            os.write(ready_w, b"x")
            os.read(go_r, 1)
            os.pwrite(a, _COUNT.pack(0), 0)
        finally:
            os._exit(0)  # its locks go with it
    os.close(ready_w)
    os.close(go_r)
    os.read(ready_r, 1)
    os.close(ready_r)
    return pid, go_w


def _attach_in_thread(safe_attach, name, wait: float = 5.0, then=lambda m: m):
    """Call ``safe_attach(name, 16)`` in a daemon thread (it may deadlock): (thread, [result]).

    ``then`` turns the mapping into the result; an exception raised is the result otherwise.
    The list is an ``_Outcome``, so the check process holds it, not a copy of it.
    """
    import threading

    outcome = _Outcome()

    def call():
        try:
            outcome.append(then(safe_attach(name, 16)))
        except Exception as exc:  # the learner's choice of exception is what is checked
            outcome.append(exc)

    worker = threading.Thread(target=call, daemon=True, name="lab3-attach")
    worker.start()
    worker.join(wait)
    return worker, outcome


class _Outcome(list):
    """The result of an attach in a thread, filled in later: not plain data (Note [Only plain
    data crosses], in ``wire``), so it stays in the learner's process and the check reads it
    there when the thread is done."""


def _raised_by(result) -> dict | None:
    """None unless ``result`` is an exception: then it as ``wire`` carries one."""
    return wire.encode_error(result) if isinstance(result, BaseException) else None


def _is_mmap(result) -> bool:
    return isinstance(result, mmap.mmap)


def _outcome(mapping) -> str:
    _close(mapping)
    return "mapped"


def _attach_outcome(safe_attach, name) -> str:
    """'mapped', the name of the exception ``safe_attach`` raised, or 'hung'."""
    worker, outcome = _attach_in_thread(safe_attach, name, then=_outcome)
    return _named(outcome[0]) if outcome else "hung"


def _named(result) -> str:
    """'mapped', or the exception's class name ('FileNotFoundError' for any subclass of it)."""
    if isinstance(result, FileNotFoundError):
        return "FileNotFoundError"
    return type(result).__name__ if isinstance(result, BaseException) else result


def _close(mapping) -> None:
    with contextlib.suppress(Exception):
        mapping.close()


def _set_count(name: str, value: int) -> None:
    fd = os.open(f"{SHM_DIR}{name}", os.O_RDWR)
    try:
        os.pwrite(fd, _COUNT.pack(value), 0)
    finally:
        os.close(fd)


def _lock_free(name: str) -> bool:
    """True if nobody holds a lock of any kind on the segment (/proc/locks lists none)."""
    return not _locks_on(f"{SHM_DIR}{name}")
