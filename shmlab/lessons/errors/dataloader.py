"""DataLoader errors, reproduced: too many open fds, a worker killed by SIGBUS, a full /dev/shm,
and a DataLoader inside a daemonic process. Each runs inside ``run.in_child``.

Every function is module-level, so a spawn or forkserver child could import it too.
"""

from __future__ import annotations

import builtins
import mmap
import multiprocessing
import os
import resource

import torch
import torch.multiprocessing as torch_mp
from torch.utils.data import DataLoader, Dataset

from . import namespaces


class ManySmall(Dataset):
    """``items`` items of ``per_item`` tiny tensors each: in a worker's batch every tensor gets
    its own shared storage, and with file_descriptor each costs the receiver one fd."""

    def __init__(self, items: int, per_item: int):
        self.items, self.per_item = items, per_item

    def __len__(self):
        return self.items

    def __getitem__(self, i):
        return [torch.full((4,), float(i)) for _ in range(self.per_item)]


def keep_every_batch(nofile: str, strategy: str, items: int = 48, per_item: int = 32,
                     workers: int = 2) -> str:
    """Iterate a DataLoader with ``workers`` workers and keep every batch (a list of all the
    outputs, as code that collects predictions does), with this process's RLIMIT_NOFILE
    ``nofile``: 'low' (64 fds more than it has open now, like `ulimit -n 128` for a small
    script) or 'hard' (raised to the hard limit: the fix any user may apply).

    The limit is set after the workers have started, so only the receiving side (this
    process) is short of fds, as in the reports: the workers keep the limit they were born with.
    """
    if nofile not in ("low", "hard"):
        raise ValueError(f"nofile must be 'low' or 'hard', not {nofile!r}")
    torch_mp.set_sharing_strategy(strategy)
    batches = iter(DataLoader(ManySmall(items, per_item), num_workers=workers, timeout=30))
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    open_now = len(os.listdir("/proc/self/fd"))
    resource.setrlimit(resource.RLIMIT_NOFILE, (open_now + 64 if nofile == "low" else hard, hard))
    kept = list(batches)
    return (f"kept {len(kept)} batches of {per_item} tensors with {strategy}, ulimit -n "
            f"{resource.getrlimit(resource.RLIMIT_NOFILE)[0]}, "
            f"{len(os.listdir('/proc/self/fd'))} fds open")


# --- a private, small /dev/shm ------------------------------------------------------------------
def private_shm(size: str) -> str:
    """Mount a tmpfs of ``size`` (e.g. '1m') on /dev/shm for this process and its children only,
    as ``docker run --shm-size`` does for a container. Returns how ('as root', or 'in a user
    namespace'); PermissionError if the machine allows neither.

    A private mount namespace keeps the machine's /dev/shm untouched (namespaces.py).
    """
    how = namespaces.enter(namespaces.CLONE_NEWNS)
    namespaces.private_mounts()
    namespaces.mount_tmpfs("/dev/shm", size)
    return how


def can_mount_private_shm() -> str | None:
    """None if private_shm() works here, else why not (the skip reason)."""
    from .run import in_child

    outcome = in_child(private_shm, "1m", timeout=30)
    return outcome.message if outcome.failed else None


class FillsShm(Dataset):
    """Each item writes ``nbytes`` into shared memory: the stdlib way (shm_open + ftruncate +
    mmap, no reservation: a full tmpfs answers with SIGBUS) or torch's (a tensor in shared
    memory: torch 2.13 reserves the pages with posix_fallocate first and raises ENOSPC)."""

    def __init__(self, kind: str, nbytes: int):
        if kind not in ("stdlib", "torch"):
            raise ValueError(f"kind must be 'stdlib' or 'torch', not {kind!r}")
        self.kind, self.nbytes = kind, nbytes

    def __len__(self):
        return 2

    def __getitem__(self, i):
        if self.kind == "torch":  # collate puts it into shared memory in the worker
            return torch.zeros(self.nbytes // 4)
        path = f"/dev/shm/psm_errors_{os.getpid()}_{i}"
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:  # what multiprocessing.shared_memory.SharedMemory(create=True) does
            os.ftruncate(fd, self.nbytes)
            with mmap.mmap(fd, self.nbytes) as m:
                m[:] = b"x" * self.nbytes  # touching a page the tmpfs cannot give: SIGBUS
        finally:
            os.close(fd)
            os.unlink(path)
        return torch.tensor(i)


def load_on_small_shm(kind: str, tmpfs: str, nbytes: int = 4 << 20) -> str:
    """A DataLoader whose workers each put ``nbytes`` in shared memory, on a /dev/shm of
    ``tmpfs`` (e.g. '1m' fails, '64m' is enough)."""
    private_shm(tmpfs)
    torch_mp.set_sharing_strategy("file_descriptor")
    batches = list(DataLoader(FillsShm(kind, nbytes), num_workers=1, batch_size=1))
    return f"{len(batches)} batches of {nbytes:,} bytes through a {tmpfs} /dev/shm"


def shm_verdict(tmpfs: str) -> dict:
    """What ``python -m shmlab doctor`` says of a /dev/shm of ``tmpfs`` (its dev_shm line),
    read inside a private tmpfs of that size; 'how': how the tmpfs was mounted."""
    from ...introspect import checks

    how = private_shm(tmpfs)
    (finding,) = checks.dev_shm()
    return {"how": how, "severity": finding.severity, "message": finding.message,
            "fix": finding.fix, "total": finding.details["total"]}


# --- a DataLoader in a daemonic process ---------------------------------------------------------
def _load_and_report(conn) -> None:
    try:
        conn.send(("", sum(len(b) for b in DataLoader(range(8), num_workers=2, batch_size=4))))
    except BaseException as exc:  # noqa: BLE001 - sent back to be raised by the parent
        conn.send((type(exc).__name__, str(exc)))


def loader_in_process(daemon: bool) -> str:
    """Iterate a 2-worker DataLoader inside a Process(daemon=``daemon``)."""
    ctx = multiprocessing.get_context("fork")
    recv, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_load_and_report, args=(send,), daemon=daemon)
    proc.start()
    send.close()
    error, value = recv.recv()
    proc.join()
    if error:  # raise it here, with its own type, so the Outcome shows what the child saw
        raise getattr(builtins, error, RuntimeError)(value)
    return f"loaded {value} items in a process with daemon={daemon}"
