"""PyTorch's own test/test_multiprocessing.py CPU sharing tests, on torch and shmlab side by side.

The port itself (upstream names, helpers, assertions and repeat counts, every adaptation and
every test left out, with the reason) is tests/core/upstream_multiprocessing.py. For each library
and start method (fork, spawn, forkserver) the whole port runs once, in order, in a fresh
interpreter, as upstream's file runs in a process of its own: the sharing strategy, the
manager connection and the start method are process-global, and a file_system share keeps a
manager alive for as long as its process lives. Each upstream test then reports here as
``test_upstream[<test>-<method>-<lib>]``, torch's result beside shmlab's. The interpreter runs
inside the first test of its group, so the leak check holds that test to account for
whatever the whole group leaves behind.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import unittest

import pytest
import upstream_multiprocessing

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))  # the repository
LIBS = ("torch", "shmlab")
METHODS = ("fork", "spawn", "forkserver")
NAMES = unittest.TestLoader().getTestCaseNames(upstream_multiprocessing.TestMultiprocessing)
# Measured on the loaded 2-core machine: the slowest group (torch, spawn) takes ~3 min.
LIMIT_S = 480

# One run of the port answers a whole (lib, method) group: under pytest-xdist the group's cases
# stay on one worker (one xdist_group each), or every worker would run the port again. The fork
# groups are the fast set's (`make test-fast`); spawn and forkserver start a fresh interpreter
# per child, minutes per group, so they are `slow` and run in `make test`.
CASES = [pytest.param(name, method, lib, id=f"{name}-{method}-{lib}",
                      marks=[pytest.mark.xdist_group(f"upstream-{lib}-{method}")]
                      + ([] if method == "fork" else [pytest.mark.slow]))
         for method in METHODS for lib in LIBS for name in NAMES]
_groups: dict[tuple[str, str], dict] = {}


def run_group(lib: str, method: str, tmp_path) -> dict:
    """Run the whole port for one library and start method; {test: result} (see run_to_json)."""
    out_json = tmp_path / f"upstream-{lib}-{method}.json"
    env = dict(os.environ, SHMLAB_UPSTREAM_LIB=lib, SHMLAB_UPSTREAM_METHOD=method,
               PYTHONPATH=os.pathsep.join(filter(None, [ROOT, HERE, os.environ.get("PYTHONPATH")])))
    code = f"import sys, upstream_multiprocessing as u; sys.exit(u.run_to_json({str(out_json)!r}))"
    # A session of its own, so that a hang can be killed with every child it started.
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=HERE, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        log, _ = proc.communicate(timeout=LIMIT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        log, _ = proc.communicate()
        log += f"\n(killed: still running after {LIMIT_S} s)"
    try:
        report = json.loads(out_json.read_text())
    except (OSError, ValueError):
        report = {name: {"status": "error", "detail": f"no result (exit code "
                         f"{proc.returncode}); its output:\n{log[-6000:]}"} for name in NAMES}
    return {"report": report, "log": log}


def test_the_port_has_the_tests_its_docstring_names():
    assert len(NAMES) == 14, NAMES


@pytest.mark.timeout(LIMIT_S + 60)
@pytest.mark.parametrize(("name", "method", "lib"), CASES)
def test_upstream(name, method, lib, tmp_path):
    if (lib, method) not in _groups:
        _groups[lib, method] = run_group(lib, method, tmp_path)
    result = _groups[lib, method]["report"][name]
    print(result)
    if result["status"] == "skip":
        pytest.skip(result["detail"])
    assert result["status"] == "ok", f"{name} ({method}, {lib}): {result['detail']}"
