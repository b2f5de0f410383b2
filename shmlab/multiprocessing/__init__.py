"""A drop-in for ``multiprocessing`` that shares shmlab tensors instead of copying them.

Mirrors: torch/multiprocessing/__init__.py

Everything in ``multiprocessing.__all__`` is re-exported unchanged (Process, Queue, Pipe,
Pool, get_context, ...). The only additions are the sharing-strategy API and, at import, the
registration of shmlab's reducers with multiprocessing's ForkingPickler: from then on every
shmlab tensor or storage sent through a Queue, Pipe, Pool or Process arguments travels as a
handle to shared memory.
"""

import multiprocessing
from multiprocessing import *  # noqa: F403 - the whole point: be a drop-in replacement

from .._shm import FILE_DESCRIPTOR, FILE_SYSTEM
from .reductions import init_reductions

__all__ = ["set_sharing_strategy", "get_sharing_strategy", "get_all_sharing_strategies"]
__all__ += multiprocessing.__all__

# shmlab runs on Linux only (see shmlab/__init__.py), where torch offers both strategies and
# defaults to file_descriptor, which cannot leak a file. (On macOS torch offers file_system
# alone: it cannot key a cache by an shm fd's inode.)
_sharing_strategy = FILE_DESCRIPTOR
_all_sharing_strategies = {FILE_DESCRIPTOR, FILE_SYSTEM}


def set_sharing_strategy(new_strategy: str) -> None:
    """Set the strategy used from now on, in this process only, when a CPU tensor is pickled.

    Args:
        new_strategy: one of :func:`get_all_sharing_strategies`.
    """
    global _sharing_strategy
    # A real check, not `assert`: asserts vanish under `python -O`.
    if new_strategy not in _all_sharing_strategies:
        raise ValueError(
            f"invalid sharing strategy {new_strategy!r}: choose one of "
            f"{sorted(_all_sharing_strategies)} (see get_all_sharing_strategies())"
        )
    _sharing_strategy = new_strategy


def get_sharing_strategy() -> str:
    """Return the current strategy for sharing CPU tensors."""
    return _sharing_strategy


def get_all_sharing_strategies() -> set:
    """Return the set of sharing strategies supported on this system."""
    return set(_all_sharing_strategies)


init_reductions()
