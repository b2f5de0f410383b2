"""Live ipywidgets views of shared memory in use, read only through ``shmlab.introspect``.

- ``FdMonitor``: open fds over time for this kernel and all its descendants, per process
  (optionally per kind), with the current numbers beside the chart;
- ``ShmFiles``: the torch_/shmlab_/psm_ segments in /dev/shm, leaked rows highlighted;
- ``LeakCleanup``: a process dies, its segments leak, a manager reclaims them: the timeline and
  the measured time to reclaim (observed for torch and shmlab, and from shmlab's event log);
- ``Dashboard``: the three together, with start/stop buttons;
- ``DoctorReport``: ``python -m shmlab doctor``'s report, with a clean button that asks first;
- ``TraceTimeline``: a ``shmlab.trace`` trace drawn while it records, one lane per process.

Each refreshes from a daemon thread (default 4 Hz, ``hz=``), keeps a bounded history, stops
when closed, and never raises into the notebook. Outside Jupyter, ``show()`` and ``repr()``
give a text snapshot. Every widget carries a ``shmlab-...`` CSS class for browser tests.
"""

from ._live import DEFAULT_HZ, in_kernel
from .dashboard import Dashboard
from .doctor import DoctorReport
from .fdmonitor import FdMonitor
from .leakcleanup import LeakCleanup
from .shmfiles import ShmFiles
from .tracetimeline import TraceTimeline

__all__ = ["DEFAULT_HZ", "Dashboard", "DoctorReport", "FdMonitor", "LeakCleanup", "ShmFiles",
           "TraceTimeline", "in_kernel"]
