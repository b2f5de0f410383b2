"""Fixtures for the file_system and fault tests: torch and shmlab families side by side.

Loaded as a plugin by conftest.py; nothing here is autouse.
"""

from __future__ import annotations

import pytest

from shmlab.tools.family import Family

LIBS = ("torch", "shmlab")
FD = "file_descriptor"


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
