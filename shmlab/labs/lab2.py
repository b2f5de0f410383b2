"""Checks for lab 2: unlinked segments, SCM_RIGHTS, the receiver's cache, and its fds.

Mirrors: nothing in torch; what they check is torch's ``rebuild_storage_fd`` and its fd
accounting (``torch/multiprocessing/reductions.py``). Each check runs in the notebook on the
learner's objects, and in the grader's check process on proxies of them (``remote.place``): the
fds are counted, read and stat'ed from outside, in ``/proc/<pid>/fd`` of the process that
holds them, and what must run next to the learner's code (an injected failure, a dup, a fork)
is a routine of this module run there (Note [The verdict outside the learner's process]).
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket

from .._shm import SHM_DIR
from ..messages import tr
from .remote import place
from .report import Cases, fd_count


class _Cache(dict):
    """A receiver's cache that stays in the learner's process (not plain data: Note [Only plain
    data crosses], in ``wire``), so their code fills the one the check reads."""


def _new_cache() -> _Cache:
    return _Cache()


def _close(fd: int) -> None:
    os.close(fd)


def _dup(fd: int) -> int:
    return os.dup(fd)


def _socketpair():
    return socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)


def _fd_path(at, fd) -> str:
    """The fd ``fd`` of the process at ``at``, as a path this process can stat and open."""
    if type(fd) is not int or fd < 0:
        raise TypeError(f"not an fd number: {fd!r}")
    return f"/proc/{at.pid}/fd/{fd}"


def _stat(at, fd) -> os.stat_result:
    return os.stat(_fd_path(at, fd))


def _pread(at, fd, n: int) -> bytes:
    mine = os.open(_fd_path(at, fd), os.O_RDONLY)
    try:
        return os.pread(mine, n, 0)
    finally:
        os.close(mine)


def check_unlinked_segment(create_unlinked_segment, sizes=(4096,), error_paths=False):
    """``sizes``: the sizes tried; ``error_paths``: also a name that exists already, and a
    resize that fails (the grader's hidden cases)."""
    for size in sizes:
        _check_segment(create_unlinked_segment, size)
    if error_paths:
        _check_name_taken(create_unlinked_segment)
        _check_resize_fails(create_unlinked_segment)


def _shm_names(pid: int) -> set[str]:
    """The names in /dev/shm process ``pid`` made (its pid is in them): others share the dir."""
    mine = f"shmlab_{pid}_"
    return {n for n in os.listdir(SHM_DIR) if n.startswith(mine)}


def _next_name(create_unlinked_segment):
    """The name the learner's ``segment_name`` gives next, or None if they name segments
    some other way."""
    real = getattr(create_unlinked_segment, "__globals__", {}).get("segment_name")
    return None if real is None else real()


def _create_as(create_unlinked_segment, taken: str):
    """``create_unlinked_segment(4096)`` whose first ``segment_name()`` is ``taken``:
    (fd or None, errno or None, the error's type and text)."""
    names = create_unlinked_segment.__globals__
    real, calls = names["segment_name"], []

    def segment_name(*args, **kwargs):
        calls.append(1)
        return taken if len(calls) == 1 else real(*args, **kwargs)

    names["segment_name"] = segment_name
    try:
        return create_unlinked_segment(4096), None, ""
    except OSError as exc:
        return None, exc.errno, f"{type(exc).__name__}: {exc}"
    finally:
        names["segment_name"] = real


def _check_name_taken(create_unlinked_segment):
    """The next name is somebody else's segment already: it must survive, untouched."""
    at = place(create_unlinked_segment)
    taken = at.run(_next_name, create_unlinked_segment)
    if type(taken) is not str:
        return  # the learner names segments some other way: nothing to inject
    path = f"{SHM_DIR}{taken}"
    other = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    os.pwrite(other, b"someone else's data", 0)
    with Cases(tr("Exercise 1: a name that is taken already (EEXIST)")) as c:
        before = fd_count(at.pid)
        fd, errno_, raised = at.run(_create_as, create_unlinked_segment, taken)
        try:
            st = os.fstat(other)
            intact = os.path.exists(path) and os.pread(other, 19, 0) == b"someone else's data"
            c.check(intact and st.st_size == 19, tr(
                "the segment that had the name is untouched (still there, same size, same "
                "bytes)"), tr(
                "create with O_CREAT | O_EXCL: without O_EXCL shm_open opens somebody else's "
                "segment, and your ftruncate then resizes it and your shm_unlink removes its "
                "name: nobody can attach to it any more"))
            if fd is None:
                c.check(errno_ == errno.EEXIST, tr(
                    "it raised FileExistsError (got {type}: {error})",
                    type=raised.partition(":")[0], error=raised.partition(": ")[2]),
                    tr("let O_EXCL's error through"))
            else:
                mine = _stat(at, fd)
                c.check((mine.st_ino, mine.st_dev) != (st.st_ino, st.st_dev), tr(
                    "it returned a segment of its own (under another name)"), tr(
                    "never hand out an fd of a segment you did not create"))
                at.run(_close, fd)
            left = fd_count(at.pid) - before
            c.check(left == 0, tr("no fd is left open ({n} left)", n=left),
                    tr("close what you opened on every path"))
        finally:
            os.close(other)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)


def _create_failing_resize(create_unlinked_segment):
    """``create_unlinked_segment(4096)`` while ``ftruncate`` and ``posix_fallocate`` raise
    ENOSPC: (fd or None, errno or None, the error's text)."""
    real = {n: getattr(os, n) for n in ("ftruncate", "posix_fallocate")}

    def failing(fd, *args):
        raise OSError(errno.ENOSPC, "No space left on device (injected by the check)")

    for n in real:
        setattr(os, n, failing)
    try:
        return create_unlinked_segment(4096), None, ""
    except OSError as exc:
        return None, exc.errno, str(exc)
    finally:
        for n, fn in real.items():
            setattr(os, n, fn)


def _check_resize_fails(create_unlinked_segment):
    """``ftruncate`` and ``posix_fallocate`` raise ENOSPC (on a full /dev/shm it is
    posix_fallocate that does; tmpfs's ftruncate never does): no fd, no name is left."""
    at = place(create_unlinked_segment)
    with Cases(tr("Exercise 1: the resize fails (ENOSPC)")) as c:
        before, files = fd_count(at.pid), _shm_names(at.pid)
        fd, errno_, raised = at.run(_create_failing_resize, create_unlinked_segment)
        if fd is not None:  # sized some other way: the failure never reached it
            at.run(_close, fd)
            print("  " + tr("(the segment was sized without os.ftruncate or "
                            "os.posix_fallocate: this case does not apply)"))
            return
        c.check(errno_ == errno.ENOSPC, tr("the error reaches the caller ({error})",
                                           error=raised),
                tr("let it through: the caller must know there is no segment"))
        left = fd_count(at.pid) - before
        c.check(left == 0, tr("no fd is left open ({n} left)", n=left),
                tr("the fd shm_open gave you is yours to close when you cannot return it"))
        names = sorted(_shm_names(at.pid) - files)
        c.check(not names, tr("no name is left in /dev/shm ({left})", left=names),
                tr("unlink the name on every path, the failing one too"))


def _check_segment(create_unlinked_segment, size):
    at = place(create_unlinked_segment)
    with Cases(tr("Exercise 1: an unlinked shared-memory segment of {size} bytes",
                  size=size)) as c:
        fd = create_unlinked_segment(size)
        try:
            link = os.readlink(_fd_path(at, fd))
            c.check(link.startswith(SHM_DIR + "/"), tr("the fd points into /dev/shm ({link})",
                                                       link=link),
                    tr("use _posixshmem.shm_open (or os.open on /dev/shm/<name>)"))
            c.check(link.endswith("(deleted)"), tr("the name is already unlinked"),
                    tr("call shm_unlink(name) right after creating: the fd is the only handle"))
            st = _stat(at, fd)
            c.check(st.st_size == size, tr("the segment is {size} bytes (got {got})",
                                           size=size, got=st.st_size),
                    tr("size it with os.ftruncate (and os.posix_fallocate)"))
            c.check(st.st_mode & 0o777 == 0o600, tr("mode 0600: only you can open it"),
                    tr("the mode you create it with decides who else may open it"))
        finally:
            at.run(_close, fd)


def check_fd_passing(send_fd, recv_fd, create_unlinked_segment):
    at = place(send_fd, recv_fd)
    with Cases(tr("Exercise 2: pass an fd over a UNIX socket (SCM_RIGHTS)")) as c:
        parent_sock, child_sock = at.run(_socketpair)
        try:
            ident, kept = at.run_in_child(_send_segment, child_sock, send_fd,
                                          create_unlinked_segment)
            before = fd_count(at.pid)  # the child has sent and gone: only recv_fd opens fds
            fd = recv_fd(parent_sock)
            opened = fd_count(at.pid) - before
        finally:
            parent_sock.close()
            child_sock.close()
        c.check(kept == 0, tr("sending leaves the sender no new fd ({n} left open)", n=kept),
                tr("the fd you send stays the caller's; anything you dup or open to send it "
                   "is yours to close"))
        if type(fd) is not int or fd < 0:
            c.check(False, tr("recv_fd returns an fd number (got {got})", got=repr(fd)),
                    tr("recv_fds returns (data, fds, flags, address): the fd is in the list"))
            return
        try:
            st = _stat(at, fd)
            c.check((st.st_ino, st.st_dev) == ident,
                    tr("the fd received names the child's segment (same inode and device)"),
                    tr("which call puts an fd into a message's ancillary data, and which "
                       "takes it out? (the socket module has both)"))
            c.check(_pread(at, fd, 5) == b"hello", tr("the parent reads what the child wrote"),
                    tr("the received fd is a new number for the same object"))
            c.check(opened == 1, tr("receiving opened exactly one fd (opened {n})", n=opened),
                    tr("every fd recv_fd holds but does not return is a leak: return the one "
                       "you received, close any other (a dup, a second maxfds slot)"))
        finally:
            at.run(_close, fd)


def _send_segment(sock, send_fd, create_unlinked_segment):
    fd = create_unlinked_segment(4096)
    os.pwrite(fd, b"hello", 0)
    before = fd_count()
    send_fd(sock, fd)
    kept = fd_count() - before
    st = os.fstat(fd)
    os.close(fd)
    return (st.st_ino, st.st_dev), kept


def check_rebuild_cache(rebuild_storage_fd, create_unlinked_segment):
    at = place(rebuild_storage_fd)
    with Cases(tr("Exercise 3: rebuild_storage_fd with a cache keyed by (st_ino, st_dev)")) \
            as c:
        cache = at.run(_new_cache)
        seg = create_unlinked_segment(64)
        first_fd, second_fd = at.run(_dup, seg), at.run(_dup, seg)  # one segment, twice
        a = rebuild_storage_fd(first_fd, 64, cache)
        at.run(_close, first_fd)  # the caller closes what it received; the storage keeps its own
        b = rebuild_storage_fd(second_fd, 64, cache)
        at.run(_close, second_fd)
        c.check(a is b, tr("the same segment received twice gives one storage"),
                tr("key the cache by os.fstat(fd): (st_ino, st_dev); the fd number differs "
                   "on every receipt"))
        at.run(_close, seg)
        c.check(a.is_shared() is True and a.nbytes() == 64,
                tr("the storage is shared and 64 bytes long"),
                tr("build it with shmlab.UntypedStorage._new_shared_fd_cpu(fd, size)"))
        other = create_unlinked_segment(64)
        reuse = at.run(_dup, other)
        d = rebuild_storage_fd(reuse, 64, cache)  # likely the fd number `first_fd` had
        at.run(_close, reuse)
        at.run(_close, other)
        c.check(d is not a, tr("a different segment (even under a reused fd number) is a "
                               "new storage"),
                tr("fd numbers can be reused as soon as they are closed: they cannot name a "
                   "segment; (st_ino, st_dev) can"))
        del a, b, d
        _check_same_inode_other_device(c, rebuild_storage_fd, create_unlinked_segment)
        _check_fd_per_storage(c, rebuild_storage_fd, create_unlinked_segment)


@contextlib.contextmanager
def _seen_as(fd: int, ino: int, dev: int):
    """``os.fstat(fd)`` reports inode ``ino`` on device ``dev`` while inside (only for ``fd``):
    two file systems number their inodes independently, so one inode number can name two
    files, which only the device tells apart. No tmpfs here can be made to collide on demand."""
    real = os.fstat

    def fstat(which, *args, **kwargs):
        st = real(which, *args, **kwargs)
        if which != fd:
            return st
        fields = list(st)
        fields[1], fields[2] = ino, dev
        return os.stat_result(fields)

    os.fstat = fstat
    try:
        yield
    finally:
        os.fstat = real


def _rebuild_both(rebuild_storage_fd, one: int, two: int, ino: int, dev: int):
    """Rebuild ``one``, then ``two`` as if it had ``one``'s inode number on device ``dev``."""
    cache = {}
    with _seen_as(two, ino, dev):
        return rebuild_storage_fd(one, 64, cache), rebuild_storage_fd(two, 64, cache)


def _check_same_inode_other_device(c, rebuild_storage_fd, create_unlinked_segment):
    at = place(rebuild_storage_fd)
    one, two = create_unlinked_segment(64), create_unlinked_segment(64)
    try:
        st = _stat(at, one)
        x, y = at.run(_rebuild_both, rebuild_storage_fd, one, two, st.st_ino, st.st_dev + 1)
        c.check(x is not y, tr("the same inode number on another device is another segment"),
                tr("an inode number is unique only within one file system: the key is "
                   "(st_ino, st_dev)"))
    finally:
        at.run(_close, one)
        at.run(_close, two)


def _check_fd_per_storage(c, rebuild_storage_fd, create_unlinked_segment):
    """One fd per live storage (its own dup), gone when the storage is."""
    at = place(rebuild_storage_fd)
    at.sync()
    before = fd_count(at.pid)
    seg = create_unlinked_segment(8)
    s = rebuild_storage_fd(seg, 8, at.run(_new_cache))
    at.run(_close, seg)
    held = fd_count(at.pid) - before
    c.check(held == 1, tr("a live storage holds one fd of its own ({n})", n=held),
            tr("the storage keeps a dup of the fd it was built from; do not open more"))
    del s
    at.sync()
    left = fd_count(at.pid) - before
    c.check(left == 0, tr("when the storage dies, its fd goes too ({n} left)", n=left),
            tr("keep no fd of your own in the cache: the storage owns its fd"))


def check_fd_ledger(receive_storage, send_fd, create_unlinked_segment, repeats=3):
    """``repeats``: how often segment A is sent (the grader sends it more often)."""
    at = place(receive_storage)
    with Cases(tr("Exercise 4: count the fds across a send and a release")) as c:
        parent_sock, child_sock = at.run(_socketpair)
        try:
            sender = at.run_in_child(_send_ledger, child_sock, send_fd,
                                     create_unlinked_segment, repeats)
            # The sender has closed its fds and gone; the segments live on in the messages
            # queued on parent_sock. From here on only receive_storage opens fds.
            at.sync()
            base, cache, got, held = fd_count(at.pid), at.run(_new_cache), [], []
            for _ in range(repeats + 1):
                got.append(receive_storage(parent_sock, 64, cache))
                held.append(fd_count(at.pid) - base)
        finally:
            parent_sock.close()
            child_sock.close()
        print("  " + tr("sender: {created} fds after creating A and B, {sent} after sending "
                        "them, {closed} after closing them", **sender))
        print("  " + tr("receiver: {each} fds after each copy of A, {last} after B",
                        each=held[:repeats], last=held[-1]))
        one = all(s is got[0] for s in got[:repeats])
        c.check(one, tr("segment A received {n} times gives one storage", n=repeats),
                tr("pass the cache you were given on to rebuild_storage_fd: it finds A there"))
        c.check(_first_byte(at, got[0]) == b"A" and _first_byte(at, got[-1]) == b"B",
                tr("the storages hold what the sender wrote (A, then B)"),
                tr("build the storage from the fd that arrived in the message"))
        c.check(held[0] == 1, tr("after the first receipt the receiver holds 1 fd (held {n})",
                                 n=held[0]),
                tr("the storage keeps a dup of the fd it was built from: the fd the message "
                   "brought is yours to close once the storage is built"))
        c.check(held[repeats - 1] == 1, tr(
            "after {repeats} receipts of A it still holds 1 fd (held {n})", repeats=repeats,
            n=held[repeats - 1]), tr(
            "every message brings a new fd, also for a segment the cache already has: what "
            "becomes of that one?"))
        c.check(held[-1] == 2 and got[-1] is not got[0],
                tr("after segment B it holds 2 fds: one more storage, one more fd (held {n})",
                   n=held[-1]),
                tr("a different segment is a different storage with a dup of its own"))
        del got
        cache.clear()
        del cache
        at.sync()
        left = fd_count(at.pid) - (base - 2)  # the two sockets counted in `base` are closed now
        c.check(left == 0, tr("once the storages and the cache are released, 0 fds are left "
                              "(left {n})", n=left),
                tr("an fd that outlives every storage is a leak: keep none of your own"))


def _first_byte(at, storage) -> bytes | None:
    fd, _ = storage._share_fd_cpu_()  # the storage's own fd: not a new one
    return _pread(at, fd, 1)


def _send_ledger(sock, send_fd, create_unlinked_segment, repeats):
    """Send segment A ``repeats`` times, then segment B once, counting the sender's fds."""
    base = fd_count()
    a, b = create_unlinked_segment(64), create_unlinked_segment(64)
    os.pwrite(a, b"A", 0)
    os.pwrite(b, b"B", 0)
    created = fd_count() - base
    for _ in range(repeats):
        send_fd(sock, a)
    send_fd(sock, b)
    sent = fd_count() - base
    os.close(a)
    os.close(b)
    return {"created": created, "sent": sent, "closed": fd_count() - base}
