"""Command-line tools: ``python -m shmlab doctor`` and ``python -m shmlab bench``."""
