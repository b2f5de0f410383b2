"""The famous torch.multiprocessing errors, each reproduced in a child process (notebook 11).

    run.py         in_child(fn, *args) and run_python(code) -> Outcome: the real message;
                   Scene(fn, *args): a staged situation kept alive in the background
    dataloader.py  too many open fds, SIGBUS and ENOSPC on a small /dev/shm, daemonic parents
    sharing.py     a late receive after the producer died; a leak after SIGKILL
    startup.py     no __main__ guard, a __main__ function under spawn, a SIGKILLed rank, CUDA
    hunt.py        the safe leak hunt's scenes: a pid-namespaced holder, an orphan's fds, a live job
    namespaces.py  private mount / pid / user namespaces (private_shm: a small /dev/shm; pids
                   of our own)

Every worker is a module-level function here, so spawn and forkserver children can import it
(a function defined in a notebook cell cannot be: that is one of the errors).
"""

from . import dataloader, hunt, namespaces, sharing, startup
from .run import Outcome, in_child, last_exception, run_python

__all__ = ["Outcome", "dataloader", "hunt", "in_child", "last_exception", "namespaces",
           "run_python", "sharing", "startup"]
