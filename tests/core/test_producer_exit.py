"""A torch producer that exits before the consumer calls get(): what each strategy does.

Real torch, real processes: a script (run by this interpreter, so the test process never changes
its own sharing strategy) puts a tensor on a Queue in a child, lets the child exit cleanly, and
only then calls get(). Under file_descriptor the fd must be fetched from the producer's
resource_sharer, which died with it; under file_system the file outlives the producer at refcount 1
(reduce_storage increfs for the message) until the producer's torch_shm_manager, left with no
client, unlinks it about 2 s later (SHUTDOWN_TIMEOUT); a fork producer whose parent started the
manager first shares it, and the file stays while the parent is still its client.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

SCRIPT = r'''
import glob, json, sys, time
import torch, torch.multiprocessing as mp
from shmlab._shm import read_refcount


def producer(q, strategy, settle):
    mp.set_sharing_strategy(strategy)  # a spawn child does not inherit the parent's strategy
    q.put(torch.full((1000,), 7.0))
    if settle:
        time.sleep(0.5)  # the queue's feeder thread has pickled and written the message


def main(strategy, method, wait_gone, settle, parent_first):
    mp.set_sharing_strategy(strategy)
    if parent_first:  # this process starts a manager: a fork child then uses it too
        kept = torch.zeros(10).share_memory_()
    ctx = mp.get_context(method)
    q = ctx.Queue()
    p = ctx.Process(target=producer, args=(q, strategy, settle))
    p.start()
    # join() with no timeout: waitpid. join(60) waits on the sentinel pipe instead, and a spawn
    # child's torch_shm_manager inherits its write end, so that join would return only when the
    # manager exits, after its grace, with the file already gone (the subprocess has a timeout)
    p.join()
    files = sorted(glob.glob(f"/dev/shm/torch_{p.pid}_*"))
    out = {"exitcode": p.exitcode, "files": len(files),
           "refcount": read_refcount(files[0][len("/dev/shm"):]) if files else None}
    if wait_gone:  # wait out the manager's grace: the file goes with nobody holding it
        deadline = time.monotonic() + 15
        while glob.glob(f"/dev/shm/torch_{p.pid}_*") and time.monotonic() < deadline:
            time.sleep(0.1)
        out["gone after grace"] = not glob.glob(f"/dev/shm/torch_{p.pid}_*")
    if parent_first:  # past the grace: this process is still the manager's client
        time.sleep(3.0)
        out["files after 3 s"] = len(glob.glob(f"/dev/shm/torch_{p.pid}_*"))
    try:
        t = q.get(timeout=20)
        out["get"] = {"ok": True, "value": t[0].item(), "shared": t.is_shared()}
        del t
    except Exception as exc:
        out["get"] = {"ok": False, "error": type(exc).__name__, "text": str(exc)}
    print(json.dumps(out))


if __name__ == "__main__":  # spawn and forkserver children import this file again
    main(sys.argv[1], sys.argv[2], sys.argv[3] == "1", sys.argv[4] == "1",
         sys.argv[5] == "1")
'''

METHODS = ("fork", "spawn")


def run(tmp_path, strategy: str, method: str, *, wait_gone=False, settle=True,
        parent_first=False) -> dict:
    script = tmp_path / "producer_exits.py"
    script.write_text(SCRIPT)
    paths = [os.getcwd(), os.environ.get("PYTHONPATH")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, paths))}
    argv = [strategy, method, *(str(int(x)) for x in (wait_gone, settle, parent_first))]
    done = subprocess.run([sys.executable, str(script), *argv], capture_output=True, text=True,
                          timeout=120, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.claim("C25.1", start_methods=("fork", "spawn"))
@pytest.mark.claim("C25.10", start_methods=("fork", "spawn"))
@pytest.mark.parametrize("method", METHODS)
def test_file_system_message_outlives_its_producer_until_the_manager_grace_ends(tmp_path, method):
    for _ in range(3):  # a loaded machine can let the 2 s grace pass before the parent looks
        within = run(tmp_path, "file_system", method)
        if within["files"]:
            break
    # the producer is gone, its file is not: the message's incref is never given back
    assert within["exitcode"] == 0 and within["files"] == 1 and within["refcount"] == 1, within
    assert within["get"] == {"ok": True, "value": 7.0, "shared": True}, within
    after = run(tmp_path, "file_system", method, wait_gone=True)
    # (read at join: on a loaded machine the grace may already be over, the file gone)
    assert after["refcount"] in (1, None) and after["gone after grace"], after
    assert not after["get"]["ok"] and after["get"]["error"] == "RuntimeError", after
    assert "No such file or directory" in after["get"]["text"], after


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.claim("C25.1", "C25.10", start_methods=("fork",))
def test_file_system_message_outlives_its_producer_while_the_parent_keeps_the_manager(tmp_path):
    # the parent allocated under file_system before forking: the producer used the parent's
    # manager, which still has a client, so no grace starts when the producer exits
    kept = run(tmp_path, "file_system", "fork", parent_first=True)
    assert kept["exitcode"] == 0 and kept["files after 3 s"] == 1, kept
    assert kept["get"] == {"ok": True, "value": 7.0, "shared": True}, kept


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.claim("C25.2", start_methods=("fork", "spawn"))
@pytest.mark.claim("C25.10", start_methods=("fork", "spawn"))
@pytest.mark.parametrize("method", METHODS)
def test_file_descriptor_message_dies_with_its_producer(tmp_path, method):
    settled = run(tmp_path, "file_descriptor", method)
    assert settled["exitcode"] == 0 and settled["files"] == 0, settled
    # the resource_sharer's listener socket was unlinked at the clean exit (or, when the feeder
    # thread was still pickling during the exit, nobody listens on it any more)
    assert settled["get"]["error"] in ("FileNotFoundError", "ConnectionRefusedError"), settled
    if method == "fork":  # the race below does not depend on the start method
        racing = run(tmp_path, "file_descriptor", method, settle=False)
        # the feeder thread pickled the message during the exit, after the socket's clean-up ran
        assert racing["get"]["error"] in ("FileNotFoundError", "ConnectionRefusedError"), racing
