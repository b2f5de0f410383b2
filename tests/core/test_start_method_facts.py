"""What the start methods really do on this Python, run in real child processes: the fork
server and the main script's top level (CPython gh-126631), `torch.multiprocessing.spawn` with
another start method, and Python 3.12's fork warning under the default warning filters.

Mirrors: Lib/multiprocessing/forkserver.py, Lib/multiprocessing/spawn.py,
torch/multiprocessing/spawn.py.
"""

import inspect
import json
import os
import subprocess
import sys
import textwrap
from multiprocessing import forkserver

import pytest

# The main script logs "<pid> <__name__>" for every process that runs its top level, then (in its
# guard) starts one forkserver child that reports its pid and the server's.
MAIN = textwrap.dedent("""
    import json, multiprocessing, os, sys
    with open(os.environ["TOPLEVEL_LOG"], "a") as f:
        f.write(f"{os.getpid()} {__name__}\\n")


    def child(q):
        # imported by the fork server before it forked us; nothing in this child imports it
        q.put([os.getpid(), os.getppid(), "multiprocessing.forkserver" in sys.modules])


    if __name__ == "__main__":
        ctx = multiprocessing.get_context("forkserver")
        q = ctx.Queue()
        p = ctx.Process(target=child, args=(q,))
        p.start()
        pid, ppid, inherited = q.get(timeout=60)
        p.join(60)
        server = multiprocessing.forkserver._forkserver._forkserver_pid
        print(json.dumps({"main": os.getpid(), "child": pid, "server": server,
                          "child's parent": ppid, "server's modules": inherited}))
""")


def server_preloads_main() -> bool:
    """Until gh-126631 was fixed, the server looked for a 'main_path' key that
    spawn.get_preparation_data() never sets (it sets 'init_main_from_path')."""
    return "init_main_from" in inspect.getsource(forkserver.ForkServer.ensure_running)


@pytest.mark.timeout(120)
@pytest.mark.claim("C12.9", start_methods=("forkserver",))
@pytest.mark.claim("C25.30", start_methods=("forkserver",))
@pytest.mark.claim("C25.39", start_methods=("forkserver",))
def test_forkserver_runs_the_main_scripts_top_level_in_the_child_not_the_server(tmp_path):
    script, log = tmp_path / "main.py", tmp_path / "toplevel.log"
    script.write_text(MAIN)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         env={**os.environ, "TOPLEVEL_LOG": str(log)}, timeout=90)
    assert out.returncode == 0, out.stderr
    pids = json.loads(out.stdout.splitlines()[-1])
    ran = [(int(pid), name) for pid, name in map(str.split, log.read_text().splitlines())]
    assert (pids["main"], "__main__") in ran
    # a forkserver child is a fork of the server, not a fresh interpreter
    assert pids["child's parent"] == pids["server"] and pids["server's modules"], pids
    if server_preloads_main():  # a CPython with the gh-126631 fix (3.14, later 3.13 releases)
        assert (pids["server"], "__mp_main__") in ran, (pids, ran)
    else:  # every Python this suite tests (3.10-3.13.0): the server never ran it
        assert pids["server"] not in {pid for pid, _ in ran}, (pids, ran)
        assert (pids["child"], "__mp_main__") in ran, (pids, ran)
    assert server_preloads_main() is False or sys.version_info >= (3, 13)


CHILD_PPID = textwrap.dedent("""
    import json, os, sys, warnings
    import torch.multiprocessing as mp


    def report(rank, path):
        with open(path, "w") as f:
            json.dump({"ppid": os.getppid()}, f)


    if __name__ == "__main__":
        how, path = sys.argv[1], sys.argv[2]
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            if how == "spawn":
                mp.spawn(report, args=(path,), nprocs=1, start_method="forkserver")
            else:
                mp.start_processes(report, args=(path,), nprocs=1, start_method="forkserver")
        with open(path) as f:
            seen = json.load(f)
        print(json.dumps({"main": os.getpid(), "ppid": seen["ppid"],
                          "warnings": [f"{w.category.__name__}: {w.message}" for w in caught]}))
""")


@pytest.mark.timeout(180)
@pytest.mark.claim("C25.31", start_methods=("spawn", "forkserver"))
def test_mp_spawn_ignores_forkserver_but_start_processes_uses_it(tmp_path):
    script = tmp_path / "main.py"
    script.write_text(CHILD_PPID)
    seen = {}
    for how in ("spawn", "start_processes"):
        out = subprocess.run([sys.executable, str(script), how, str(tmp_path / f"{how}.json")],
                             capture_output=True, text=True, timeout=150)
        assert out.returncode == 0, out.stderr
        seen[how] = json.loads(out.stdout.splitlines()[-1])
    # mp.spawn warns (FutureWarning) and starts its child with spawn: the parent is the script
    spawn = seen["spawn"]
    assert spawn["ppid"] == spawn["main"], spawn
    assert any(w.startswith("FutureWarning: This method only supports start_method=spawn")
               for w in spawn["warnings"]), spawn
    # start_processes really uses the fork server: the child's parent is the server
    fs = seen["start_processes"]
    assert fs["ppid"] != fs["main"] and not fs["warnings"], fs


FORK_IN_THREADS = textwrap.dedent("""
    import multiprocessing, os, sys, threading


    def nothing():
        pass


    if __name__ == "__main__":
        stop = threading.Event()
        thread = threading.Thread(target=stop.wait)
        thread.start()
        if sys.argv[1] == "multiprocessing":
            p = multiprocessing.get_context("fork").Process(target=nothing)
            p.start()
            p.join()
        else:
            pid = os.fork()
            if pid == 0:
                os._exit(0)
            os.waitpid(pid, 0)
        stop.set()
        thread.join()
""")
WARNING = "is multi-threaded, use of fork() may lead to deadlocks in the child"


@pytest.mark.timeout(120)
@pytest.mark.claim("C25.32", start_methods=("fork",))
def test_fork_warning_is_a_deprecation_warning_the_default_filters_hide_for_multiprocessing(
        tmp_path):
    script = tmp_path / "main.py"
    script.write_text(FORK_IN_THREADS)

    def stderr(how, *flags):
        out = subprocess.run([sys.executable, *flags, str(script), how], capture_output=True,
                             text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        return out.stderr

    new = sys.version_info >= (3, 12)
    # os.fork() called from __main__: the default filters show DeprecationWarning there
    shown = stderr("os")
    assert ("DeprecationWarning: This process (pid=" in shown) == new
    assert (WARNING in shown) == new
    # multiprocessing's own fork (popen_fork): hidden by the default filters ...
    assert WARNING not in stderr("multiprocessing")
    # ... shown once DeprecationWarnings are turned on
    assert (WARNING in stderr("multiprocessing", "-W", "default::DeprecationWarning")) == new
