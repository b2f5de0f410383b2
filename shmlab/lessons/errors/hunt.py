"""A safe leak hunt, staged (notebook 11, section 9): leaks and look-alikes for the doctor to judge.

Each scene is real: real torch tensors, real /dev/shm files, real processes, kept alive in the
background while the notebook runs the doctor (``doctor.diagnose``, what ``python -m shmlab
doctor`` prints) and ``shmlab.introspect`` on them, then torn down (``Scene.stop``), leaving
nothing behind.

    namespaced_holder  a live torch file_system tensor made in a private pid namespace: its file
                       name carries a pid that is another process on the host; only
                       /proc/*/maps shows who uses it
    orphan_with_fds    an orphan holding file_descriptor tensors: nothing in /dev/shm, only
                       '(deleted)' links in /proc/<pid>/fd
    live_family        a running file_system job and its torch_shm_manager: files a cleaner
                       must never touch
    pid_reuse          (runs in ``in_child``) a leak whose creator's pid now belongs to a newer
                       process: a live pid is not a live creator; the start time tells

Mirrors: nothing (teaching aid); the judging is ``shmlab.introspect.leaks``'s.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import time

import torch
import torch.multiprocessing as torch_mp

from ... import introspect
from ...introspect import leaks
from . import namespaces, sharing
from .run import Scene  # noqa: F401 - the stager is the runner's now


def _hold_file_system_tensor(conn) -> None:
    os.setpgid(0, 0)  # out of the kernel's process group: an interrupt there must not reach us
    torch_mp.set_sharing_strategy("file_system")
    tensor = torch.ones(1 << 18).share_memory_()  # a named /dev/shm file, fd closed, mapped
    name = tensor.untyped_storage()._share_filename_cpu_()[1].decode().lstrip("/")
    conn.send((name, os.getpid()))
    time.sleep(120)  # until the namespace's pid 1 is killed


def namespaced_holder(report, stop, ns_pid: int) -> None:
    """A live torch file_system tensor whose creator lives in a private pid namespace, as a
    container's processes do, with pid ``ns_pid`` there: the pid in its name is the
    namespace's, and on the host that number is some other process, or nobody."""
    recv, send = multiprocessing.Pipe(duplex=False)
    how = namespaces.enter(namespaces.CLONE_NEWPID)
    init = os.fork()  # pid 1 of the new namespace
    if init == 0:
        namespaces.set_next_pid(ns_pid)
        if os.fork() == 0:
            _hold_file_system_tensor(send)
            os._exit(0)
        os.wait()
        os._exit(0)
    name, seen_pid = recv.recv()
    family = introspect.process_family(init)
    try:
        report({"name": name, "path": f"{introspect.SHM_DIR}/{name}", "ns_pid": seen_pid,
                "host_pids": family[1:], "how": how})
        stop.wait(120)
    finally:
        os.kill(init, signal.SIGKILL)  # pid 1's death kills its namespace, manager included
        os.waitpid(init, 0)
        _unlink(name)  # so nothing is left: the manager died with the namespace


def _unlink(name: str) -> None:
    try:
        os.unlink(f"{introspect.SHM_DIR}/{name}")
    except FileNotFoundError:
        pass


def _orphan(send, count: int) -> None:
    os.setpgid(0, 0)  # out of the kernel's process group, like a job started from a shell
    torch_mp.set_sharing_strategy("file_descriptor")
    tensors = [torch.ones(1 << 16).share_memory_() for _ in range(count)]  # one fd each
    send.send(os.getpid())
    time.sleep(120)  # until killed; the tensors stay alive meanwhile
    del tensors


def orphan_with_fds(report, stop, count: int = 3) -> None:
    """A process holding ``count`` file_descriptor tensors whose parent has exited."""
    recv, send = multiprocessing.Pipe(duplex=False)
    middle = os.fork()
    if middle == 0:  # the parent that exits: its child is re-parented (to pid 1, or a subreaper)
        if os.fork() == 0:
            _orphan(send, count)
        os._exit(0)  # (the orphan too, if it ever wakes up)
    os.waitpid(middle, 0)
    orphan = recv.recv()
    try:
        report({"pid": orphan, "count": count})
        stop.wait(120)
    finally:
        os.kill(orphan, signal.SIGKILL)  # we made it; the kernel frees its memory with its fds


def live_family(report, stop) -> None:
    """A running file_system job: a tensor, its torch_shm_manager, both alive."""
    torch_mp.set_sharing_strategy("file_system")
    tensor = torch.ones(1 << 18).share_memory_()
    name = tensor.untyped_storage()._share_filename_cpu_()[1].decode().lstrip("/")
    managers = [m.pid for m in introspect.managers() if m.ppid == os.getpid()]
    report({"name": name, "path": f"{introspect.SHM_DIR}/{name}", "pid": os.getpid(),
            "managers": managers})
    stop.wait(120)
    del tensor  # the last holder unlinks it; the manager exits ~2 s after we do


def _reuse_inside(conn) -> None:
    """pid 1 of a private pid namespace: a leak, its creator's pid handed to a newer process."""
    namespaces.mount_proc()
    recv, send = multiprocessing.Pipe(duplex=False)
    creator = os.fork()
    if creator == 0:
        sharing._share_and_hold(send)  # a file_system tensor and its manager, until SIGKILL
        os._exit(0)
    name, managers = recv.recv()
    time.sleep(1.5)  # so the newcomer starts visibly later than the file
    for pid in [*managers, creator]:  # the manager first: it must not get to clean up
        os.kill(pid, signal.SIGKILL)
    for _ in range(1 + len(managers)):
        os.wait()  # the creator, and its manager (re-parented to us, pid 1)
    namespaces.set_next_pid(creator)
    newcomer = os.fork()
    if newcomer == 0:
        conn.send(_judge(name, creator))
        os._exit(0)
    os.waitpid(newcomer, 0)
    _unlink(name)


def _judge(name: str, creator: int) -> dict:
    """What a naive check and the doctor say of ``name``, asked by the process now holding
    the pid ``creator``."""
    (seg,) = [s for s in introspect.shm_segments() if s.name == name]
    os.kill(creator, 0)  # no error: a process with that pid runs (it is us)
    lines = [f for f in leaks.segments(min_age_s=0) if f.details.get("name") == name]
    return {"name": name, "creator_pid": creator, "asker_pid": os.getpid(),
            "pid_exists": True, "creator_alive": seg.creator_alive,
            "cleanable": bool(lines) and lines[0].details["cleanable"],
            "message": lines[0].message if lines else "no finding: the creator looks alive"}


def pid_reuse() -> dict:
    """Run in ``in_child``: stage a leak whose creator's pid is reused, in a private pid (and
    mount) namespace, and return what the process now holding that pid learns about it."""
    how = namespaces.enter(namespaces.CLONE_NEWPID | namespaces.CLONE_NEWNS)
    namespaces.private_mounts()
    recv, send = multiprocessing.Pipe(duplex=False)
    init = os.fork()
    if init == 0:
        try:
            _reuse_inside(send)
        finally:
            os._exit(0)
    facts = recv.recv() if recv.poll(30) else {"error": "the namespace did not answer"}
    os.waitpid(init, 0)
    return {**facts, "how": how}
