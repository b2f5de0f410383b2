"""Checks for lab 2: unlinked segments, SCM_RIGHTS, the receiver's cache, and its fds."""

from __future__ import annotations

import contextlib
import errno
import os
import socket

from .._shm import SHM_DIR
from ..messages import tr
from .report import Cases, fd_count, run_in_child


def check_unlinked_segment(create_unlinked_segment, sizes=(4096,), error_paths=False):
    """``sizes``: the sizes tried; ``error_paths``: also a name that exists already, and a
    resize that fails (the grader's hidden cases)."""
    for size in sizes:
        _check_segment(create_unlinked_segment, size)
    if error_paths:
        _check_name_taken(create_unlinked_segment)
        _check_resize_fails(create_unlinked_segment)


def _shm_names() -> set[str]:
    """The names in /dev/shm this process made (its pid is in them): others share the dir."""
    mine = f"shmlab_{os.getpid()}_"
    return {n for n in os.listdir(SHM_DIR) if n.startswith(mine)}


def _check_name_taken(create_unlinked_segment):
    """The next name is somebody else's segment already: it must survive, untouched."""
    names = getattr(create_unlinked_segment, "__globals__", {})
    real = names.get("segment_name")
    if real is None:
        return  # the learner names segments some other way: nothing to inject
    taken = real()
    path = f"{SHM_DIR}{taken}"
    other = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    os.pwrite(other, b"someone else's data", 0)
    calls = []

    def segment_name(*args, **kwargs):
        calls.append(1)
        return taken if len(calls) == 1 else real(*args, **kwargs)

    with Cases(tr("Exercise 1: a name that is taken already (EEXIST)")) as c:
        before = fd_count()
        names["segment_name"] = segment_name
        try:
            fd, raised = create_unlinked_segment(4096), None
        except OSError as exc:
            fd, raised = None, exc
        finally:
            names["segment_name"] = real
        try:
            st = os.fstat(other)
            intact = os.path.exists(path) and os.pread(other, 19, 0) == b"someone else's data"
            c.check(intact and st.st_size == 19, tr(
                "the segment that had the name is untouched (still there, same size, same "
                "bytes)"), tr(
                "create with O_CREAT | O_EXCL: without O_EXCL shm_open opens somebody else's "
                "segment, and your ftruncate then resizes it and your shm_unlink removes its "
                "name: nobody can attach to it any more"))
            if raised is not None:
                c.check(raised.errno == errno.EEXIST, tr(
                    "it raised FileExistsError (got {type}: {error})",
                    type=type(raised).__name__, error=raised), tr("let O_EXCL's error through"))
            else:
                mine = os.fstat(fd)
                c.check((mine.st_ino, mine.st_dev) != (st.st_ino, st.st_dev), tr(
                    "it returned a segment of its own (under another name)"), tr(
                    "never hand out an fd of a segment you did not create"))
                os.close(fd)
            c.check(fd_count() == before, tr("no fd is left open ({n} left)",
                                             n=fd_count() - before),
                    tr("close what you opened on every path"))
        finally:
            os.close(other)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)


def _check_resize_fails(create_unlinked_segment):
    """``ftruncate`` and ``posix_fallocate`` raise ENOSPC (on a full /dev/shm it is
    posix_fallocate that does; tmpfs's ftruncate never does): no fd, no name is left."""
    real = {n: getattr(os, n) for n in ("ftruncate", "posix_fallocate")}

    def failing(fd, *args):
        raise OSError(errno.ENOSPC, "No space left on device (injected by the check)")

    with Cases(tr("Exercise 1: the resize fails (ENOSPC)")) as c:
        before, files = fd_count(), _shm_names()
        for n in real:
            setattr(os, n, failing)
        try:
            fd, raised = create_unlinked_segment(4096), None
        except OSError as exc:
            fd, raised = None, exc
        finally:
            for n, fn in real.items():
                setattr(os, n, fn)
        if fd is not None:  # sized some other way: the failure never reached it
            os.close(fd)
            print("  " + tr("(the segment was sized without os.ftruncate or "
                            "os.posix_fallocate: this case does not apply)"))
            return
        c.check(raised.errno == errno.ENOSPC, tr("the error reaches the caller ({error})",
                                                 error=raised),
                tr("let it through: the caller must know there is no segment"))
        c.check(fd_count() == before, tr("no fd is left open ({n} left)",
                                         n=fd_count() - before),
                tr("the fd shm_open gave you is yours to close when you cannot return it"))
        left = sorted(_shm_names() - files)
        c.check(not left, tr("no name is left in /dev/shm ({left})", left=left),
                tr("unlink the name on every path, the failing one too"))


def _check_segment(create_unlinked_segment, size):
    with Cases(tr("Exercise 1: an unlinked shared-memory segment of {size} bytes",
                  size=size)) as c:
        fd = create_unlinked_segment(size)
        try:
            link = os.readlink(f"/proc/self/fd/{fd}")
            c.check(link.startswith(SHM_DIR + "/"), tr("the fd points into /dev/shm ({link})",
                                                       link=link),
                    tr("use _posixshmem.shm_open (or os.open on /dev/shm/<name>)"))
            c.check(link.endswith("(deleted)"), tr("the name is already unlinked"),
                    tr("call shm_unlink(name) right after creating: the fd is the only handle"))
            st = os.fstat(fd)
            c.check(st.st_size == size, tr("the segment is {size} bytes (got {got})",
                                           size=size, got=st.st_size),
                    tr("size it with os.ftruncate (and os.posix_fallocate)"))
            c.check(st.st_mode & 0o777 == 0o600, tr("mode 0600: only you can open it"),
                    tr("the mode you create it with decides who else may open it"))
        finally:
            os.close(fd)


def check_fd_passing(send_fd, recv_fd, create_unlinked_segment):
    with Cases(tr("Exercise 2: pass an fd over a UNIX socket (SCM_RIGHTS)")) as c:
        parent_sock, child_sock = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            ident, kept = run_in_child(_send_segment, child_sock, send_fd,
                                       create_unlinked_segment)
            before = fd_count()  # the child has sent and gone: only recv_fd opens fds now
            fd = recv_fd(parent_sock)
            opened = fd_count() - before
        finally:
            parent_sock.close()
            child_sock.close()
        c.check(kept == 0, tr("sending leaves the sender no new fd ({n} left open)", n=kept),
                tr("the fd you send stays the caller's; anything you dup or open to send it "
                   "is yours to close"))
        if not isinstance(fd, int) or fd < 0:
            c.check(False, tr("recv_fd returns an fd number (got {got})", got=repr(fd)),
                    tr("recv_fds returns (data, fds, flags, address): the fd is in the list"))
            return
        try:
            st = os.fstat(fd)
            c.check((st.st_ino, st.st_dev) == ident,
                    tr("the fd received names the child's segment (same inode and device)"),
                    tr("which call puts an fd into a message's ancillary data, and which "
                       "takes it out? (the socket module has both)"))
            c.check(os.pread(fd, 5, 0) == b"hello", tr("the parent reads what the child wrote"),
                    tr("the received fd is a new number for the same object"))
            c.check(opened == 1, tr("receiving opened exactly one fd (opened {n})", n=opened),
                    tr("every fd recv_fd holds but does not return is a leak: return the one "
                       "you received, close any other (a dup, a second maxfds slot)"))
        finally:
            os.close(fd)


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
    with Cases(tr("Exercise 3: rebuild_storage_fd with a cache keyed by (st_ino, st_dev)")) \
            as c:
        cache = {}
        seg = create_unlinked_segment(64)
        first_fd, second_fd = os.dup(seg), os.dup(seg)  # one segment, received twice
        a = rebuild_storage_fd(first_fd, 64, cache)
        os.close(first_fd)  # the caller closes what it received; the storage keeps its own
        b = rebuild_storage_fd(second_fd, 64, cache)
        os.close(second_fd)
        c.check(a is b, tr("the same segment received twice gives one storage"),
                tr("key the cache by os.fstat(fd): (st_ino, st_dev); the fd number differs "
                   "on every receipt"))
        os.close(seg)
        c.check(a.is_shared() and a.nbytes() == 64,
                tr("the storage is shared and 64 bytes long"),
                tr("build it with shmlab.UntypedStorage._new_shared_fd_cpu(fd, size)"))
        other = create_unlinked_segment(64)
        reuse = os.dup(other)
        d = rebuild_storage_fd(reuse, 64, cache)  # likely the fd number `first_fd` had
        os.close(reuse)
        os.close(other)
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


def _check_same_inode_other_device(c, rebuild_storage_fd, create_unlinked_segment):
    one, two = create_unlinked_segment(64), create_unlinked_segment(64)
    try:
        st = os.fstat(one)
        cache = {}
        with _seen_as(two, st.st_ino, st.st_dev + 1):
            x = rebuild_storage_fd(one, 64, cache)
            y = rebuild_storage_fd(two, 64, cache)
        c.check(x is not y, tr("the same inode number on another device is another segment"),
                tr("an inode number is unique only within one file system: the key is "
                   "(st_ino, st_dev)"))
    finally:
        os.close(one)
        os.close(two)


def _check_fd_per_storage(c, rebuild_storage_fd, create_unlinked_segment):
    """One fd per live storage (its own dup), gone when the storage is."""
    import gc

    before = fd_count()
    seg = create_unlinked_segment(8)
    s = rebuild_storage_fd(seg, 8, {})
    os.close(seg)
    held = fd_count() - before
    c.check(held == 1, tr("a live storage holds one fd of its own ({n})", n=held),
            tr("the storage keeps a dup of the fd it was built from; do not open more"))
    del s
    gc.collect()
    left = fd_count() - before
    c.check(left == 0, tr("when the storage dies, its fd goes too ({n} left)", n=left),
            tr("keep no fd of your own in the cache: the storage owns its fd"))



def check_fd_ledger(receive_storage, send_fd, create_unlinked_segment, repeats=3):
    """``repeats``: how often segment A is sent (the grader sends it more often)."""
    import gc

    with Cases(tr("Exercise 4: count the fds across a send and a release")) as c:
        parent_sock, child_sock = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sender = run_in_child(_send_ledger, child_sock, send_fd, create_unlinked_segment,
                                  repeats)
            # The sender has closed its fds and gone; the segments live on in the messages
            # queued on parent_sock. From here on only receive_storage opens fds.
            base, cache, got, held = fd_count(), {}, [], []
            for _ in range(repeats + 1):
                got.append(receive_storage(parent_sock, 64, cache))
                held.append(fd_count() - base)
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
        c.check(_first_byte(got[0]) == b"A" and _first_byte(got[-1]) == b"B",
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
        gc.collect()
        left = fd_count() - (base - 2)  # the two sockets counted in `base` are closed now
        c.check(left == 0, tr("once the storages and the cache are released, 0 fds are left "
                              "(left {n})", n=left),
                tr("an fd that outlives every storage is a leak: keep none of your own"))


def _first_byte(storage) -> bytes | None:
    fd, _ = storage._share_fd_cpu_()  # the storage's own fd: not a new one
    return os.pread(fd, 1, 0)


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
