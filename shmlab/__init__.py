"""shmlab: watch torch.multiprocessing share tensors between processes.

A small, readable reference implementation of PyTorch's CPU tensor sharing (reducers,
the file_descriptor and file_system strategies, the shm manager daemon), with
introspection, live widgets, notebooks and labs around it.
"""

__version__ = "0.1.0"

from .storage import UntypedStorage
from .tensor import Tensor, empty, from_numpy, tensor, zeros

__all__ = ["Tensor", "UntypedStorage", "empty", "from_numpy", "tensor", "zeros"]
