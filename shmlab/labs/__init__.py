"""Lab support: the checks that hidden test cells call, and the release and grade commands.

``shmlab/labs/source/*.ipynb`` are instructor copies in nbgrader's format (solution regions,
grader-only hidden tests, ``metadata.nbgrader``), shipped in the wheel as package data.
``python -m shmlab.labs release`` writes the learner copies into ``labs/`` of the current
directory; ``python -m shmlab.labs grade NOTEBOOK...`` re-runs a learner's notebook with every
test cell restored from the instructor copy and prints a score per exercise (from a checkout or
an installed wheel alike).
"""

from .report import Cases

__all__ = ["Cases"]
