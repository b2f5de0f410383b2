"""Private Linux namespaces for the demos: a /dev/shm of our own size, pid numbers of our own.

Mirrors: nothing (teaching aid). It does by hand what a container runtime does for a container:
``docker run --shm-size=N`` mounts a tmpfs of N bytes on the container's /dev/shm (64 MiB
unless told), ``--ipc=host`` keeps the host's, and the container's pid namespace numbers its
processes from 1, so a pid it writes into a file name means nothing on the host.

Root may unshare a mount or pid namespace directly (it needs CAP_SYS_ADMIN). Anyone else gets
that right inside a new *user* namespace that maps their own uid and gid to themselves
(user_namespaces(7)): files made there stay theirs outside. Where neither is allowed (a
container without CAP_SYS_ADMIN and with user namespaces switched off), ``enter`` raises
PermissionError saying so, and the notebook skips with that reason.

Every call changes only the calling process (and the children it starts afterwards); call
them in a fork child (``run.in_child``), never in the notebook's kernel.
"""

from __future__ import annotations

import ctypes
import os

CLONE_NEWNS, CLONE_NEWPID, CLONE_NEWUSER = 0x20000, 0x20000000, 0x10000000
_MS_REC, _MS_PRIVATE = 0x4000, 1 << 18

_libc = ctypes.CDLL(None, use_errno=True)


def _call(name: str, *args) -> None:
    if getattr(_libc, name)(*args) != 0:
        err = ctypes.get_errno()
        raise PermissionError(err, f"{name}: {os.strerror(err)}")


def enter(flags: int) -> str:
    """unshare(``flags``) for this single-threaded process: directly where we may (root),
    else inside a new user namespace. Returns how: 'as root' or 'in a user namespace'."""
    try:
        _call("unshare", flags)
        return "as root"
    except PermissionError:
        pass  # no CAP_SYS_ADMIN here: a user namespace gives it to us, inside it
    uid, gid = os.geteuid(), os.getegid()
    try:
        _call("unshare", flags | CLONE_NEWUSER)
    except PermissionError as exc:
        raise PermissionError(exc.errno, f"{exc.strerror}: this machine allows neither a "
                              "private namespace (needs CAP_SYS_ADMIN) nor a user namespace "
                              "(sysctl user.max_user_namespaces)") from None
    # Map our own ids to themselves (setgroups must be denied before an unprivileged gid_map).
    for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"),
                       ("gid_map", f"{gid} {gid} 1")):
        with open(f"/proc/self/{name}", "w") as f:
            f.write(text)
    return "in a user namespace"


def private_mounts() -> None:
    """Stop our mounts from propagating back to the host (the new mount namespace shares
    the host's mount events until / is made private, recursively)."""
    _call("mount", b"none", b"/", None, _MS_REC | _MS_PRIVATE, None)


def mount_tmpfs(path: str, size: str) -> None:
    """A fresh tmpfs of ``size`` (e.g. '1m', '64m') on ``path``: what --shm-size does."""
    _call("mount", b"tmpfs", path.encode(), b"tmpfs", 0, f"size={size}".encode())


def private_shm(size: str) -> str:
    """A tmpfs of ``size`` (e.g. '1m') on /dev/shm for this process and its children only, as
    ``docker run --shm-size`` gives a container; the machine's /dev/shm is never touched (a
    private mount namespace). Returns how ('as root' or 'in a user namespace');
    PermissionError where the machine allows neither."""
    how = enter(CLONE_NEWNS)
    private_mounts()
    mount_tmpfs("/dev/shm", size)
    return how


def mount_proc() -> None:
    """A /proc that shows our pid namespace (call it in the namespace's pid 1)."""
    _call("mount", b"proc", b"/proc", b"proc", 0, None)


def set_next_pid(pid: int) -> None:
    """Make the next process this pid namespace starts get ``pid`` (if it is free): the
    kernel hands out last_pid + 1. Only a process inside the namespace (with CAP_SYS_ADMIN
    over it) may; that is how pid reuse, rare by chance, is shown on demand."""
    with open("/proc/sys/kernel/ns_last_pid", "w") as f:
        f.write(str(pid - 1))
