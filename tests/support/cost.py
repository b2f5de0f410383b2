"""What each test costs: wall time and CPU time, its own and its reaped children's.

On the 2-core CI machine the suite is bound by CPU, not by waiting: with more workers than
cores, a test's wall time says mostly how busy the others were, while its CPU seconds (the
worker's, plus every child process it started and reaped: kernels, spawn children, pip) say
what it costs everybody. Each worker writes its records to test-artifacts/test-cost-<worker>.json
at its end; the run's summary lists the costliest tests and the totals, so a change to the
suite's speed starts from numbers. A daemon that reparents itself (a manager after setsid())
is nobody's reaped child and is not counted.
"""

from __future__ import annotations

import json
import os
import resource
import time

import pytest

from support.nbutil import ARTIFACTS

SHOW = 25  # rows in the summary


def _cpu() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


_records: dict[str, dict] = {}


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    wall, cpu = time.monotonic(), _cpu()
    yield
    _records[item.nodeid] = {"wall_s": round(time.monotonic() - wall, 2),
                             "cpu_s": round(_cpu() - cpu, 2)}


def _path(worker: str):
    return ARTIFACTS / f"test-cost-{worker}.json"


def pytest_sessionstart(session):
    if not hasattr(session.config, "workerinput"):  # the controller (or a run without xdist)
        for old in ARTIFACTS.glob("test-cost-*.json"):
            old.unlink()


def pytest_sessionfinish(session):
    if _records:
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        ARTIFACTS.mkdir(exist_ok=True)
        _path(worker).write_text(json.dumps(_records, indent=0))


def pytest_terminal_summary(terminalreporter):
    if hasattr(terminalreporter.config, "workerinput"):
        return
    records: dict[str, dict] = {}
    for path in sorted(ARTIFACTS.glob("test-cost-*.json")):
        records.update(json.loads(path.read_text()))
    if not records:
        return
    cpu = sum(r["cpu_s"] for r in records.values())
    wall = sum(r["wall_s"] for r in records.values())
    terminalreporter.write_sep("=", f"test cost: {len(records)} tests, {cpu:.0f} CPU s, "
                                    f"{wall:.0f} wall s summed over workers")
    for nodeid, r in sorted(records.items(), key=lambda kv: -kv[1]["cpu_s"])[:SHOW]:
        terminalreporter.write_line(f"{r['cpu_s']:8.1f} cpu s {r['wall_s']:8.1f} wall s  {nodeid}")
