"""Command-line tools: ``python -m shmlab.stress`` and ``python -m shmlab.bench``."""
