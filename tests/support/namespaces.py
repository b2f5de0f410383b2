"""Run a Python script as root in a private mount namespace (a tiny tmpfs on /dev/shm, say).

The fault tests that fill /dev/shm or run it out of inodes must not touch the machine's real
/dev/shm: `unshare --mount` gives the script its own mount table, where it mounts what it
likes; everything it mounted vanishes with it. The script prints one JSON object: its result,
or {"skip": reason}.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest


def run_unshared(tmp_path, script: str, timeout: float, env: dict | None = None) -> tuple:
    """(returncode, result dict) of `script` in a private mount namespace; skips where the
    machine cannot make one (not root, no unshare, unshare refused)."""
    if os.geteuid() != 0:
        pytest.skip("needs root: a private mount namespace with a tiny tmpfs on /dev/shm")
    if shutil.which("unshare") is None:
        pytest.skip("needs unshare (util-linux) for a private mount namespace")
    log, errs = tmp_path / "out", tmp_path / "err"
    with open(log, "w") as out, open(errs, "w") as err:  # no pipes: the managers outlive it
        rc = subprocess.run(["unshare", "--mount", sys.executable, "-c", script],
                            stdout=out, stderr=err, timeout=timeout, env=env).returncode
    text = log.read_text()
    if rc != 0 and not text:
        pytest.skip(f"unshare --mount failed here: {errs.read_text()[-300:]}")
    res = json.loads(text)
    if "skip" in res:
        pytest.skip(res["skip"])
    print(json.dumps(res, indent=1))
    return rc, res
