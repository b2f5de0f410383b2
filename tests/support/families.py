"""torch and shmlab side by side: the one "run on both libraries" helper of the tests.

``LIBS`` names the two libraries (loop or parametrize over it), ``both(scenario, ...)`` runs one
scenario on each and returns ``{lib: observation}`` for a parity test to compare, and the
``families`` fixture starts one process family per library for the file_system and fault tests.
Loaded as a plugin by conftest.py; nothing here is autouse.
"""

from __future__ import annotations

import pytest

from shmlab.testing.family import Family

# The same tuple as shmlab.harness.libs.LIBS (the package's own helper for notebooks and stress).
LIBS = ("torch", "shmlab")
FD = "file_descriptor"


def both(scenario, *args):
    """Run ``scenario(lib, *args)`` for torch and shmlab; return {lib: observation}."""
    return {lib: scenario(lib, *args) for lib in LIBS}


@pytest.fixture
def default_strategy_afterwards():
    """The strategy is process-global: whatever a test does, leave both on the default."""
    import torch.multiprocessing as tmp

    import shmlab.multiprocessing as smp

    try:
        yield
    finally:
        tmp.set_sharing_strategy(FD)
        smp.set_sharing_strategy(FD)


@pytest.fixture
def families(default_strategy_afterwards):
    """Start one Family per library (side by side); kill whatever is left at the end."""
    made: list[Family] = []

    def start(strategy: str, **kw) -> dict[str, Family]:
        fams = {lib: Family(lib, strategy, **kw) for lib in LIBS}
        made.extend(fams.values())
        return fams

    yield start
    for fam in made:
        fam.close()
