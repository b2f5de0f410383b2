"""The harness and set-up notebook 11 runs its famous errors with; the code that provokes each
error is written in the notebook (``%%writefile`` cells).

    run.py         in_child(fn, *args) and run_python(code) -> Outcome: the real message;
                   Scene(fn, *args): a staged situation kept alive in the background
    namespaces.py  private mount / pid / user namespaces (private_shm: a small /dev/shm; pids
                   of our own)
"""

from . import namespaces
from .run import Outcome, Scene, in_child, last_exception, run_python

__all__ = ["Outcome", "Scene", "in_child", "last_exception", "namespaces", "run_python"]
