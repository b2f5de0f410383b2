"""What each test costs: wall time and CPU time, its own and its reaped children's.

On the 2-core CI machine the suite is bound by CPU, not by waiting: with more workers than
cores, a test's wall time says mostly how busy the others were, while its CPU seconds (the
worker's, plus every child process it started and reaped: kernels, spawn children, pip) say
what it costs everybody. Each worker writes its records to test-artifacts/test-cost-<worker>.json
at its end; the run's summary lists the costliest tests and the totals, so a change to the
suite's speed starts from numbers. A daemon that reparents itself (a manager after setsid())
is nobody's reaped child and is not counted.

The summary also says when each worker started its first test and ended its last (seconds
from the first start), and how long it was busy: a worker that ends long after the others
means the longest tests did not start first (Note [The longest tests first]); workers that end
together, busy all along, mean the run is bound by the work itself, and only less CPU makes it
shorter.
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
_span: dict[str, float] = {}  # this process's first test start and last test end (epoch s)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    _span.setdefault("start", time.time())  # wall clock: the workers' spans are compared
    wall, cpu = time.monotonic(), _cpu()
    yield
    _records[item.nodeid] = {"wall_s": round(time.monotonic() - wall, 2),
                             "cpu_s": round(_cpu() - cpu, 2)}
    _span["end"] = time.time()


def _path(worker: str):
    return ARTIFACTS / f"test-cost-{worker}.json"


def pytest_sessionstart(session):
    if not hasattr(session.config, "workerinput"):  # the controller (or a run without xdist)
        for old in [*ARTIFACTS.glob("test-cost-*.json"), *ARTIFACTS.glob("test-span-*.json")]:
            old.unlink()


def pytest_sessionfinish(session):
    if _records:
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        ARTIFACTS.mkdir(exist_ok=True)
        _path(worker).write_text(json.dumps(_records, indent=0))
        _span_path(worker).write_text(json.dumps(_span))


def _span_path(worker: str):
    return ARTIFACTS / f"test-span-{worker}.json"


def worker_lines(spans: dict[str, dict], busy: dict[str, float]) -> list[str]:
    """One line per worker: its first start and last end, in seconds from the earliest start,
    and the wall seconds its tests took."""
    if not spans:
        return []
    first = min(span["start"] for span in spans.values())
    last = max(span["end"] for span in spans.values())
    return [f"{worker:>6}: tests from {span['start'] - first:6.0f} s to "
            f"{span['end'] - first:6.0f} s (ends {last - span['end']:4.0f} s before the last), "
            f"busy {busy.get(worker, 0):6.0f} s" for worker, span in sorted(spans.items())]


def pytest_terminal_summary(terminalreporter):
    if hasattr(terminalreporter.config, "workerinput"):
        return
    records: dict[str, dict] = {}
    busy: dict[str, float] = {}
    for path in sorted(ARTIFACTS.glob("test-cost-*.json")):
        mine = json.loads(path.read_text())
        records.update(mine)
        busy[path.stem.removeprefix("test-cost-")] = sum(r["wall_s"] for r in mine.values())
    if not records:
        return
    spans = {path.stem.removeprefix("test-span-"): json.loads(path.read_text())
             for path in sorted(ARTIFACTS.glob("test-span-*.json"))}
    spans = {worker: span for worker, span in spans.items() if {"start", "end"} <= set(span)}
    cpu = sum(r["cpu_s"] for r in records.values())
    wall = sum(r["wall_s"] for r in records.values())
    terminalreporter.write_sep("=", f"test cost: {len(records)} tests, {cpu:.0f} CPU s, "
                                    f"{wall:.0f} wall s summed over workers")
    for nodeid, r in sorted(records.items(), key=lambda kv: -kv[1]["cpu_s"])[:SHOW]:
        terminalreporter.write_line(f"{r['cpu_s']:8.1f} cpu s {r['wall_s']:8.1f} wall s  {nodeid}")
    for line in worker_lines(spans, busy):
        terminalreporter.write_line(line)
