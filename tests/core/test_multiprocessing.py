"""shmlab.multiprocessing: the strategy API and the drop-in re-export of multiprocessing.

Mirrors: torch/multiprocessing/__init__.py.
"""

import multiprocessing
import subprocess
import sys

import pytest

import shmlab.multiprocessing as mp


def test_strategy_api():
    assert mp.get_all_sharing_strategies() == {"file_descriptor", "file_system"}
    assert mp.get_sharing_strategy() == "file_descriptor"
    with pytest.raises(ValueError, match="file_descriptor.*file_system"):
        mp.set_sharing_strategy("shared_memory")
    assert mp.get_sharing_strategy() == "file_descriptor"  # nothing changed
    mp.set_sharing_strategy("file_descriptor")


def test_strategy_check_survives_python_O():
    # A real check, not an assert: `python -O` must not turn bad input into silent acceptance.
    code = ("import shmlab.multiprocessing as mp\n"
            "try:\n    mp.set_sharing_strategy('bogus')\nexcept ValueError as e:\n"
            "    print('refused', e)\n")
    out = subprocess.run([sys.executable, "-O", "-c", code], capture_output=True, text=True,
                         timeout=60)
    assert out.stdout.startswith("refused invalid sharing strategy 'bogus'"), out.stderr


def test_drop_in_reexports_all_of_multiprocessing():
    import torch.multiprocessing as tmp

    missing = [n for n in multiprocessing.__all__ if not hasattr(mp, n)]
    assert missing == []
    # torch adds spawn/start_processes helpers to its __all__; shmlab does not have them.
    assert set(mp.__all__) == set(tmp.__all__) - {"spawn", "start_processes"}
    assert mp.get_context("spawn").Process is multiprocessing.get_context("spawn").Process
