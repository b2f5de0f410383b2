"""Run ``shmlab.lessons.strategy_at_import`` as a main script, both ways at once (C12.3, C12.9).

Mirrors: nothing; it only starts two interpreters and reads what they print and log.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

SCRIPT = Path(__file__).resolve().with_name("strategy_at_import.py")


def run(*runs: tuple[str, str], timeout: float = 240.0) -> dict:
    """Run the script once per (where, lib) — where: "top" or "guard" — all at once.
    {(where, lib): report}; each report is the script's JSON plus "ran": the (pid, __name__)
    of every process that executed the script's top level."""
    return start(*runs).results(timeout)


class start:  # noqa: N801 - reads as a verb: start(...).results()
    """The runs of ``run``, started now in the background; ``results()`` waits for them."""

    def __init__(self, *runs: tuple[str, str]):
        self._dir = tempfile.TemporaryDirectory(prefix="shmlab-main-")
        tmp = self._dir.name
        self.procs = procs = {}
        for where, lib in runs:
            env = {**os.environ, "SHMLAB_SET_AT": where, "SHMLAB_LIB": lib,
                   "SHMLAB_IMPORT_LOG": str(Path(tmp) / f"{where}-{lib}")}
            procs[(where, lib)] = subprocess.Popen([sys.executable, str(SCRIPT)], env=env,
                                                   stdout=subprocess.PIPE, text=True)

    def results(self, timeout: float = 240.0) -> dict:
        out, tmp = {}, self._dir.name
        for (where, lib), p in self.procs.items():
            stdout, _ = p.communicate(timeout=timeout)
            report = json.loads(stdout.strip().splitlines()[-1])
            lines = (Path(tmp) / f"{where}-{lib}").read_text().split()
            pairs = zip(lines[::2], lines[1::2], strict=True)
            report["ran"] = [(int(pid), name) for pid, name in pairs]
            out[(where, lib)] = report
        self._dir.cleanup()
        return out


def server_preloads_main() -> bool:
    """Whether this Python's fork server can preload ``__main__``. From 3.4 until the fix of
    CPython gh-126631 (3.14; backported to 3.13 in September 2025) it looked for a "main_path"
    key that ``spawn.get_preparation_data()`` never sets (it sets "init_main_from_path"), so
    the server preloaded nothing and every forkserver child re-ran the main script itself."""
    import inspect
    from multiprocessing import forkserver

    return "init_main_from" in inspect.getsource(forkserver.ForkServer.ensure_running)
