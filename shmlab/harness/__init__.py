"""The child-process harness the notebooks, tests, labs and the stress tool drive children with.

- ``actor``: THE child-process protocol: ``Actor`` (parent) and ``serve`` (child) over a Pipe.
- ``holder``: the command table of a child that holds tensors (notebooks 04/05; the stress
  family adds its own commands in ``shmlab.testing.family``).
- ``libs``: load torch or shmlab by name; fd counts. Every worker runs on both.
- ``session``: ``Session``, which starts, tracks and tears down what a notebook makes;
  ``show`` (tables, widgets), ``liveplot`` (training plots), ``watch`` (process probes).

What the children run, lesson by lesson, is ``shmlab.lessons``. Nothing here is part of the
torch mirror; it only drives it.
"""
