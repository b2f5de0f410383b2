"""The lesson scenes: the workers and scenarios each notebook runs, one module per concept.

A ``spawn`` child imports the function it runs by module and name, so what a child of a lesson
runs lives here, not in a notebook cell. The harness that starts and drives those children is
``shmlab.harness``; the stress tool's families are ``shmlab.testing``.

- ``channels``, ``lifecycle``, ``cuda``: spawn-importable worker functions, by concept.
- ``fdpath``, ``wire``, ``mainscript`` (with its script ``strategy_at_import``): how an fd
  travels, what crosses the wire, where the strategy is set (notebooks 02 - 04).
- ``crashes``, ``dropped``, ``trackers``, ``inflight``: notebook 12's scenarios (a crash under
  each strategy; a live process's dropped manager connection; resource_tracker vs the
  managers; a file_descriptor sender's fds in flight).
- ``memprobe``, ``share_parts``, ``empty``, ``sharedcache``: inside ``share_memory_()``
  (notebook 13).
- ``errors``: the famous errors of notebook 11, each reproduced in a child process.

Nothing here is part of the torch mirror; it only drives it.
"""
