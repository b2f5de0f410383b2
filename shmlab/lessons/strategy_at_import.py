"""A main script that sets the sharing strategy at its top level, or inside its main guard.

Notebooks 02 and 03 (claims C12.3, C12.9) run it as a *script* — the fork server preloads
``__main__`` by its path, so ``python -m`` would hide what this shows:

    SHMLAB_SET_AT=top   python shmlab/lessons/strategy_at_import.py   # or guard
    SHMLAB_IMPORT_LOG=/tmp/log ...   # every process that runs this top level appends a line
    SHMLAB_LIB=shmlab ...            # shmlab's strategy instead of torch's (a faster import)

It prints one JSON object: this process's pid, the fork server's pid, and for each start
method the pid and the sharing strategy a child reports.

Mirrors: CPython multiprocessing/spawn.py (``_fixup_main_from_path``: a spawn child re-runs the
main script as ``__mp_main__``) and forkserver.py (``main``: the server imports it the same way,
once, before forking any child).
"""

import json
import multiprocessing
import os

from shmlab.harness.libs import load

LIB = os.environ.get("SHMLAB_LIB", "torch")
_, lib_mp = load(LIB)
if os.environ.get("SHMLAB_IMPORT_LOG"):
    with open(os.environ["SHMLAB_IMPORT_LOG"], "a") as log:
        log.write(f"{os.getpid()} {__name__}\n")
if os.environ.get("SHMLAB_SET_AT") == "top":
    lib_mp.set_sharing_strategy("file_system")  # top level: re-run wherever this file is


def main() -> dict:
    from multiprocessing import forkserver

    from shmlab.lessons import channels

    if os.environ.get("SHMLAB_SET_AT") == "guard":
        lib_mp.set_sharing_strategy("file_system")  # here: only this process
    out = {"lib": LIB, "main": os.getpid()}
    for method in ("fork", "spawn", "forkserver"):
        ctx = multiprocessing.get_context(method)
        q = ctx.Queue()
        p = ctx.Process(target=channels.report_strategy, args=(LIB, q))
        p.start()
        _, pid, strategy = q.get(timeout=120)
        p.join(60)
        out[method] = {"pid": pid, "strategy": strategy}
    out["forkserver pid"] = forkserver._forkserver._forkserver_pid
    return out


if __name__ == "__main__":
    print(json.dumps(main()))
