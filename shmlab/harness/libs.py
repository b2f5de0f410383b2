"""Run one scenario on torch and on shmlab: load either library by name, count our fds.

Every demo worker takes ``lib`` ("torch" or "shmlab") so one scenario runs on both side by
side; only ``.numpy()`` is used on tensors, which both libraries give as a zero-copy view.
"""

from __future__ import annotations

import os

LIBS = ("torch", "shmlab")


def load(lib: str):
    """(tensor library, its multiprocessing module) for "torch" or "shmlab"."""
    if lib == "torch":
        import torch
        import torch.multiprocessing as mp

        torch.set_num_threads(1)  # children on a 2-core machine: no thread oversubscription
        return torch, mp
    if lib == "shmlab":
        import shmlab
        import shmlab.multiprocessing as mp

        return shmlab, mp
    raise ValueError(f"lib must be 'torch' or 'shmlab', got {lib!r}")


def new_tensor(lib: str, values):
    """A private (not yet shared) float32 tensor of ``values`` in either library."""
    import numpy as np

    arr = np.asarray(values, dtype=np.float32)
    tlib, _ = load(lib)
    return tlib.from_numpy(arr.copy())


def fd_count() -> int:
    """Open fds of this process (what `ls /proc/self/fd | wc -l` shows)."""
    return len(os.listdir("/proc/self/fd"))


def shm_fd_count() -> int:
    """Open fds of this process that point at shared memory (/dev/shm/..., deleted or not)."""
    from ..introspect import fd_counts

    counts = fd_counts()
    return counts["shm-deleted"] + counts["shm-named"]
