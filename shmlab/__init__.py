"""shmlab: watch torch.multiprocessing share tensors between processes.

A small, readable reference implementation of PyTorch's CPU tensor sharing (reducers,
the file_descriptor and file_system strategies, the shm manager daemon), with
introspection, live widgets, notebooks and labs around it.

Linux only, decided here once, before anything else is imported: the package is built on POSIX
shared memory in /dev/shm (shm_open), fds passed over UNIX sockets (SCM_RIGHTS), /proc,
SO_PEERCRED and posix_fallocate, as torch's CPU sharing is on Linux.
"""

import sys

if not sys.platform.startswith("linux"):
    raise ImportError(
        f"shmlab runs on Linux only, not on {sys.platform!r}: it needs POSIX shared memory in "
        "/dev/shm (shm_open), fd passing over UNIX sockets (SCM_RIGHTS), /proc, SO_PEERCRED and "
        "posix_fallocate. Use a Linux machine, VM or container (e.g. docker run --shm-size=2g)."
    )

__version__ = "0.1.0"

from .storage import UntypedStorage
from .tensor import Tensor, empty, from_numpy, tensor, zeros

__all__ = ["Tensor", "UntypedStorage", "empty", "from_numpy", "tensor", "zeros"]
