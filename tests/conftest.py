import json
import os
import sys

import pytest

# The helpers are the package tests/support/ (leakcheck, families, waiting, nbutil). This folder
# goes first on sys.path so `support` imports the same way here, in every folder of tests (one
# per layer: core, manager, observing, driving, notebooks, labs, browser, pythons, meta) and in a
# pytester run: the harness's own tests load the leak checker into one (`-p support.leakcheck`)
# and prove that it fails a leaking test.
sys.path.insert(0, os.path.dirname(__file__))
pytest_plugins = ["support.leakcheck", "pytester", "support.families", "support.managers",
                  "support.xdistgroups", "support.cost"]

# Note [The longest tests first]
# `make test` runs the suite on pytest-xdist workers (--dist loadgroup --no-loadscope-reorder),
# which take the tests in collection order, each worker one test ahead. Collected by folder, the
# Python installs (minutes each) and the headless notebooks came last, and the run ended with one
# worker installing a Python while the others sat idle. So every worker (they must all agree on
# the order) sorts its collection, stable, longest kind first: the installs, then notebook and
# browser runs and the xdist groups (a whole group runs on one worker), then the `slow` tests,
# then the rest. Tests marked skip go last: each worker is handed two tests at the start, and
# skipped installs ahead of the real ones once left two real installs queued on one worker.
# A run without workers keeps the folder order.


def _rank(item) -> int:
    marks = {m.name for m in item.iter_markers()}
    if "skip" in marks:
        return 4
    if "slow" in marks and item.nodeid.startswith("tests/pythons/"):
        return 0
    if marks & {"notebook", "browser", "xdist_group"}:
        return 1
    return 2 if "slow" in marks else 3


def pytest_collection_modifyitems(config, items):
    if hasattr(config, "workerinput"):  # an xdist worker: see Note [The longest tests first]
        items.sort(key=_rank)


# Headless notebook times: recorded in the process that ran the notebook (support/nbutil.py's
# TIMES). Under xdist that is a worker, which hands its records to the controller at its end.
_WORKER_TIMES: dict[str, dict] = {}


def pytest_sessionfinish(session):
    if hasattr(session.config, "workeroutput"):
        nbutil = sys.modules.get("support.nbutil")
        session.config.workeroutput["notebook_times"] = json.dumps(nbutil.TIMES if nbutil else {})


@pytest.hookimpl(optionalhook=True)  # a pytest-xdist hook: the controller, as a worker ends
def pytest_testnodedown(node, error):
    _WORKER_TIMES.update(json.loads(getattr(node, "workeroutput", {}).get("notebook_times", "{}")))


def pytest_terminal_summary(terminalreporter):
    """After a run that executed notebooks headless: their times against their budgets."""
    nbutil = sys.modules.get("support.nbutil")  # not imported: no notebook ran here
    times = {**(nbutil.TIMES if nbutil is not None else {}), **_WORKER_TIMES}
    if times:
        from support import nbutil

        terminalreporter.write_sep("=", "notebook times (headless)")
        for line in nbutil.times_table(times):
            terminalreporter.write_line(line)
