"""What the notebooks, tests, labs and the stress tool drive: child processes and their workers.

- ``actor``: THE child-process protocol: ``Actor`` (parent) and ``serve`` (child) over a Pipe.
- ``holder``: the command table of a child that holds tensors (notebooks 04/05, stress).
- ``libs``: load torch or shmlab by name; fd counts. Every worker runs on both.
- ``channels``, ``lifecycle``, ``cuda``: spawn-importable worker functions, by concept.
- ``crashes``, ``dropped``, ``trackers``, ``inflight``: notebook 12's scenarios (a crash under
  each strategy; a live process's dropped manager connection; resource_tracker vs the
  managers; a file_descriptor sender's fds in flight).
- ``notebook``: ``Session``, which starts, tracks and tears down what a notebook makes;
  ``show`` (tables, widgets), ``liveplot`` (training plots), ``watch`` (process probes).

Nothing here is part of the torch mirror; it only drives it.
"""
