"""pytest plugin: make `--dist loadgroup` keep each `xdist_group` on one worker under pytest 9.

Note [xdist groups under pytest 9]
pytest-xdist (3.8.0, the newest release) groups tests by appending ``@<group>`` to each marked
item's node id in the worker (``item._nodeid = ...``); its scheduler then puts every node id
with the same suffix on one worker. pytest 9 no longer reads ``_nodeid`` (``item.nodeid`` is
``str(item._id)``), so the suffix never reaches the scheduler and every group is silently spread
over the workers: the upstream port, one run per (lib, method) group, ran again on each worker
that took one of the group's cases. Rewriting ``item._id`` instead works but shows the suffix in
every test id (and a stray ``]`` in the summary). So the groups travel beside the ids: each
worker writes {node id: group} for its marked items into the run's base temporary folder (the
controller's; the workers' own are its subfolders) while it collects, and the controller's
scheduler, xdist's own LoadGroupScheduling, reads it when it splits the collection into work
units, which it does only once every worker has collected. Where xdist's own suffix arrives (an
older pytest, a fixed xdist), the suffix decides, as before. tests/meta/test_harness.py proves
the grouping in a run of its own.
"""

from __future__ import annotations

import json
import os

import pytest

GROUPS_FILE = "xdist-groups.json"


def _group(item) -> str | None:
    names = sorted({str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                    for m in item.iter_markers("xdist_group")})
    return "_".join(names) or None


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    if not hasattr(config, "workerinput") or not config.getvalue("loadgroup"):
        return
    groups = {item.nodeid: g for item in items if (g := _group(item)) is not None}
    shared = config._tmp_path_factory.getbasetemp().parent  # the controller's base folder
    mine = shared / f"{GROUPS_FILE}.{config.workerinput['workerid']}"
    mine.write_text(json.dumps(groups))
    os.replace(mine, shared / GROUPS_FILE)  # every worker writes the same map: any one will do


@pytest.hookimpl(optionalhook=True)  # a pytest-xdist hook: the controller picks its scheduler
def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling

    class GroupsBesideIds(LoadGroupScheduling):
        groups: dict[str, str] | None = None

        def schedule(self) -> None:
            if self.groups is None:
                path = config._tmp_path_factory.getbasetemp() / GROUPS_FILE
                self.groups = json.loads(path.read_text()) if path.exists() else {}
            super().schedule()

        def _split_scope(self, nodeid: str) -> str:
            if nodeid.rfind("@") > nodeid.rfind("]"):  # xdist's own suffix: it decides
                return super()._split_scope(nodeid)
            group = (self.groups or {}).get(nodeid)
            return f"group:{group}" if group is not None else nodeid

    return GroupsBesideIds(config, log)
