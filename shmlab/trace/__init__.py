"""Trace one tensor across processes: every hop and system call, timed, on one clock.

    from shmlab.trace import trace
    with trace() as tr:          # syscalls="auto" | True | False
        q.put(t)                 # ... and the child's q.get()
    tr.hops(pid=...)             # the steps, in order
    tr.show()                    # a Mermaid sequence diagram, one lane per process

The Python-level hops come from a profile hook (``shmlab.trace.recorder``, the table of hops
in ``shmlab.trace.hops``), the system calls from ``strace`` (``shmlab.trace.strace``); the
context manager is ``shmlab.trace.session``, the data ``shmlab.trace.model``, the pictures
``shmlab.trace.render``, the command line ``shmlab.trace.cli``.

Mirrors: nothing in torch; it observes torch and shmlab alike.
"""

from .model import Event, ProcessInfo, StraceUnavailable, Trace, TraceError
from .session import trace

__all__ = ["Event", "ProcessInfo", "StraceUnavailable", "Trace", "TraceError", "trace"]
