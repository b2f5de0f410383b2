"""The lesson scenes: the workers and scenarios each notebook runs, one module per concept.

What a child runs is written in the notebooks themselves (``%%writefile`` cells, run by
``shmlab.harness.workers``); what is left here observes an experiment, or is a worker the tests
and the training notebooks share. The harness that starts and drives children is
``shmlab.harness``; the stress tool's families are ``shmlab.testing``.

- ``channels``, ``cuda``: spawn-importable worker functions the tests share, by concept.
- ``fdpath``, ``wire``: how an fd travels (a tracer of multiprocessing's fd routes; one
  segment's memory) and what crosses the wire (``strace`` of notebook 04's script).
- ``crashes``, ``trackers``, ``inflight``: notebook 12's probes (a pair's file, refcount, fds,
  mappings and memory; resource_tracker vs the managers; a sender's fds in flight).
- ``memprobe``, ``share_parts``: what a process holds, and ``share_memory_()``'s parts timed
  (notebook 13).
- ``errors``: the runner and the namespace set-up of notebook 11's famous errors.

Nothing here is part of the torch mirror; it only drives it.
"""
