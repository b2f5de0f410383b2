"""SIGKILL in a sharing family, torch beside shmlab: what survives, what leaks, who cleans up.

Every file_system scenario ends with files that only the manager can remove (a dead process
never gave its refcount back), so each one fails if the manager does not reclaim them within
RECLAIM_LIMIT_S of the family's last exit: run it with SHMLAB_MANAGER_GRACE=100 to see that.
Under file_descriptor nothing is ever named in /dev/shm, so nothing can leak.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest
from support.families import LIBS
from support.namespaces import run_unshared

from shmlab._shm import read_refcount
from shmlab.testing.family import FAMILY, RECLAIM_LIMIT_S, Family, wait_reclaimed

P, C = "producer", "consumer"
FS, FD = "file_system", "file_descriptor"
STRATEGIES = (FS, FD)
VALUES = [1.0, 2.0]  # the producer shares two tensors, [0] = 1.0 and 2.0


def send_two(fams: dict[str, Family], receive: bool = True) -> dict[str, list[str]]:
    """Producer shares two tensors and puts them on the queue; the consumer takes them."""
    names = {}
    for lib, fam in fams.items():
        segs = fam.ask(P, "share", 2, 1024)["segments"]
        names[lib] = [s[1] for s in segs if s]
        fam.ask(P, "put")  # flushed: both messages are in the pipe
        if receive:
            assert fam.ask(C, "get", 2, 10)["values"] == VALUES
    return names


def counts(names: list[str]) -> list[int | None]:
    return [read_refcount("/" + n) for n in names]


def no_named_segments(fams: dict[str, Family]) -> None:
    for lib, fam in fams.items():
        assert fam.files() == [] and fam.managers == set(), lib  # nothing named, no manager


def assert_reclaimed(fams: dict[str, Family], strategy: str) -> dict[str, float | None]:
    """Every file and manager of each family gone within the limit after its last exit."""
    recs = wait_reclaimed(list(fams.values()), deadline_s=RECLAIM_LIMIT_S + 3)
    took = {}
    for (lib, fam), rec in zip(fams.items(), recs, strict=True):
        took[lib] = rec["reclaim_s"]
        assert rec["files_left"] == [], f"{lib} left {rec['files_left']} after its family died"
        assert rec["managers_left"] == [], f"{lib}'s manager {rec['managers_left']} lives on"
        if strategy == FS:
            assert rec["files_at_exit"], f"{lib}: nothing was left for the manager to reclaim"
            assert rec["reclaim_s"] <= RECLAIM_LIMIT_S, (lib, rec)
        else:
            assert rec["files_at_exit"] == [] and fam.managers == set()
    print(f"reclaim after the last exit ({strategy}): {took}")
    return took


# -- the four faults ----------------------------------------------------------------------------
@pytest.mark.timeout(180)
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_kill_the_producer_after_sharing(families, strategy):
    fams = families(strategy)
    names = send_two(fams)
    for fam in fams.values():
        fam.kill(P)
    for lib, fam in fams.items():
        assert fam.ask(C, "read")["values"] == VALUES, lib  # the memory outlived its creator
        fam.ask(C, "release")
        if strategy == FS:  # the dead producer's count is never given back: the file stays
            assert counts(names[lib]) == [1, 1], lib
    for fam in fams.values():  # both exit together: the grace of the first must not run out
        fam.finish(C)  # while the second is still being checked (a loaded machine)
    if strategy == FD:
        no_named_segments(fams)
    assert_reclaimed(fams, strategy)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_kill_the_producer_with_a_message_in_flight(families, strategy):
    fams = families(strategy)
    names = send_two(fams, receive=False)
    if strategy == FS:
        for lib in LIBS:
            assert counts(names[lib]) == [2, 2], lib  # the sender's own count + one in flight
    for fam in fams.values():
        fam.kill(P)
    if strategy == FS:  # the consumer is no client yet: the grace runs from the kill
        recs = wait_reclaimed(list(fams.values()), deadline_s=RECLAIM_LIMIT_S + 3)
        for lib, rec in zip(LIBS, recs, strict=True):
            assert rec["files_left"] == rec["managers_left"] == [], (lib, rec)
            assert rec["reclaim_s"] <= RECLAIM_LIMIT_S, (lib, rec)
        print(f"reclaim after the producer's death (in flight): "
              f"{ {lib: r['reclaim_s'] for lib, r in zip(LIBS, recs, strict=True)} }")
    errors = {lib: fam.ask(C, "get", 2, 5, check=False).get("error")
              for lib, fam in fams.items()}
    print(f"late get ({strategy}): {errors}")
    kind, message = errors["shmlab"]
    if strategy == FD:  # the fd lived in the dead sender; its resource_sharer is gone
        assert errors["torch"][0] == kind == "ConnectionRefusedError"
        no_named_segments(fams)
    else:
        assert errors["torch"] == ["RuntimeError", "No such file or directory"]
        assert kind == "FileNotFoundError" and "is gone" in message
    # torch's error is bare; shmlab's says why and what to do
    assert "exited before the message was received" in message
    assert "Keep the sender" in message
    for fam in fams.values():
        fam.finish(C)
        assert fam.files() == [] and fam.live_managers() == []


@pytest.mark.timeout(180)
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_kill_the_consumer_while_it_holds_the_tensor(families, strategy):
    fams = families(strategy)
    names = send_two(fams)
    for fam in fams.values():
        fam.kill(C)
    for lib, fam in fams.items():
        fam.ask(P, "write", FAMILY, 7.0)
        assert fam.ask(P, "read")["values"] == [7.0, 7.0], lib
        fam.ask(P, "release")
        if strategy == FS:  # now the dead consumer's count keeps the file
            assert counts(names[lib]) == [1, 1], lib
    for fam in fams.values():  # both exit together (see test_kill_the_producer_after_sharing)
        fam.finish(P)
    if strategy == FD:
        no_named_segments(fams)
    assert_reclaimed(fams, strategy)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_kill_both(families, strategy):
    fams = families(strategy)
    names = send_two(fams)
    for fam in fams.values():
        fam.kill(P, C)
    if strategy == FS:
        for lib in LIBS:
            assert counts(names[lib]) == [2, 2], lib  # two dead holders
    else:
        no_named_segments(fams)
    assert_reclaimed(fams, strategy)


# -- killing the manager itself -----------------------------------------------------------------
def _wait_dead(pid: int, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return  # dead; its parent (the producer) has not waited for it yet
        except psutil.NoSuchProcess:
            return
        time.sleep(0.01)
    raise TimeoutError(f"manager {pid} still alive after SIGKILL")


@pytest.mark.timeout(180)
def test_killing_the_manager_keeps_segments_in_use_and_refuses_new_ones(families):
    fams = families(FS)
    names = send_two(fams)
    old = {}
    for lib, fam in fams.items():
        (mgr,) = fam.managers
        old[lib] = fam.ask(P, "read")["segments"][0][0]  # its socket path: the handle
        os.kill(mgr, signal.SIGKILL)
        _wait_dead(mgr)
    errors = {}
    for lib, fam in fams.items():
        fam.ask(P, "write", FAMILY, 5.0)  # still one memory, both ways
        assert fam.ask(C, "read")["values"] == [5.0, 5.0], lib
        errors[lib] = fam.ask(P, "share", 1, 8, check=False).get("error")  # a new segment
    print(f"new registration with the manager dead: {errors}")
    assert errors["torch"] == ["RuntimeError", "Broken pipe"]
    kind, message = errors["shmlab"]
    assert kind == "ManagerError" and "keep working" in message and "reset()" in message
    time.sleep(2.5)  # longer than any grace: nobody unlinked what is in use
    for lib, fam in fams.items():
        assert counts(names[lib]) == [2, 2] and fam.ask(C, "read")["values"] == [5.0, 5.0]
        assert len(fam.files()) == 2, lib  # the failed allocation left no file either
    # shmlab, as its error says: reset() and the next allocation starts a fresh manager.
    shm = fams["shmlab"]
    shm.ask(P, "reset_manager")
    fresh = shm.ask(P, "share", 1, 8)["segments"][-1][0]
    assert fresh != old["shmlab"] and len(shm.live_managers()) == 1
    # Clean up. shmlab: releasing needs no manager; the last closer unlinks.
    shm.ask(C, "release")
    assert counts(names["shmlab"]) == [1, 1]
    shm.finish(P, C)
    assert counts(names["shmlab"]) == [None, None]
    # torch: freeing a tensor whose manager is gone throws in a destructor -> abort().
    fams["torch"].finish(C, P)
    print("torch exit codes after its manager died:",
          {r: p.exitcode for r, p in fams["torch"].procs.items()})
    assert {p.exitcode for p in fams["torch"].procs.values()} == {-signal.SIGABRT}
    for name in fams["torch"].files():  # by hand: no manager is left to reclaim them
        os.unlink(f"/dev/shm/{name}")
    for lib in LIBS:  # a SIGKILLed manager cannot remove its private directory
        shutil.rmtree(os.path.dirname(old[lib]), ignore_errors=True)
    recs = wait_reclaimed([shm])  # the fresh manager exits after its grace, as usual
    assert recs[0]["files_left"] == recs[0]["managers_left"] == []


# -- /dev/shm full ------------------------------------------------------------------------------
FULL_SHM = textwrap.dedent(r'''
    import gc, json, os, subprocess, sys
    mount = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", "/dev/shm"],
                           capture_output=True, text=True)
    if mount.returncode:
        print(json.dumps({"skip": "mount -t tmpfs failed: " + mount.stderr.strip()}))
        sys.exit(0)
    import torch, torch.multiprocessing as tmp
    import shmlab, shmlab.multiprocessing as smp
    files = lambda: sorted(os.listdir("/dev/shm"))
    out = {}
    for lib, mp, zeros in (("torch", tmp, torch.zeros), ("shmlab", smp, shmlab.zeros)):
        for strategy in ("file_descriptor", "file_system"):
            mp.set_sharing_strategy(strategy)
            first = zeros(150_000).share_memory_()  # 600 kB of the 1 MiB: fits
            before = files()
            try:
                zeros(150_000).share_memory_()  # 600 kB more than the space left
                error = None
            except Exception as exc:
                error = [type(exc).__name__, getattr(exc, "errno", None), str(exc)]
            partial = sorted(set(files()) - set(before))
            out[f"{lib} {strategy}"] = {"error": error, "partial": partial}
            del first
            gc.collect()
            mp.set_sharing_strategy("file_descriptor")
        out[f"{lib} left"] = files()  # after everything it made was freed
    # The stdlib only ftruncates: the segment is made, and the first write past the space
    # kills the writer with SIGBUS.
    code = ("from multiprocessing import shared_memory as s\n"
            "m = s.SharedMemory(create=True, size=2 << 20)\n"
            "m.buf[:] = b'x' * (2 << 20)\n")
    out["stdlib_returncode"] = subprocess.run([sys.executable, "-c", code],
                                              capture_output=True).returncode
    print(json.dumps(out))
''')


@pytest.mark.claim("C25.308")
@pytest.mark.timeout(180)
@pytest.mark.claim("C25.308")
def test_full_dev_shm_raises_enospc_under_both_strategies_torch_too_stdlib_gets_sigbus(
        tmp_path):
    rc, res = run_unshared(tmp_path, FULL_SHM, timeout=100)
    assert rc == 0  # no SIGBUS in the process that shared
    for strategy in STRATEGIES:
        kind, code, message = res[f"shmlab {strategy}"]["error"]
        assert kind == "OSError" and code == errno.ENOSPC, res
        assert re.search(r"[\d,]+ bytes needed, [\d,]+ free", message), message
        assert "--shm-size" in message, message  # and what to do about it
        assert res[f"shmlab {strategy}"]["partial"] == []  # no half-made file
        t_kind, _, t_message = res[f"torch {strategy}"]["error"]  # torch 2.13 raises too...
        assert t_kind == "RuntimeError" and "No space left on device (28)" in t_message
        # ...but leaves the half-made file behind (posix_fallocate fails before the unlink).
        (partial,) = res[f"torch {strategy}"]["partial"]
        assert partial in t_message and partial in res["torch left"]
    assert [n for n in res["shmlab left"] if n.startswith("shmlab_")] == []
    assert res["stdlib_returncode"] == -signal.SIGBUS  # 135 from a shell


# -- the stress command, bounded ----------------------------------------------------------------
@pytest.mark.timeout(180)
def test_stress_command_leaks_nothing():
    out = subprocess.run([sys.executable, "-m", "shmlab", "stress", "--trials", "16", "--parallel",
                          "4", "--seed", "7", "--json"], capture_output=True, text=True,
                         timeout=140)
    summary = json.loads(out.stdout)
    print({k: v for k, v in summary.items() if k != "incidents"})
    assert summary["trials"] == 16
    assert summary["leaked_files"] == 0 and summary["stuck"] == 0 and summary["bad_data"] == 0
    # A manager whose starter is killed while it boots has no segment and no client; on a
    # loaded machine it may outlive the deadline, but it must leave on its own.
    assert summary["managers_stuck"] == 0, summary["incidents"]
    for incident in summary["incidents"]:
        assert incident["files_at_exit"] == 0 and incident["left_on_their_own"], incident
    assert summary["reclaim_s"]["median"] <= RECLAIM_LIMIT_S
    assert out.returncode == 0


def _stress_faults(tmp_path, *args: str, pythonpath: str | None = None,
                   timeout: float = 240) -> tuple[int, dict]:
    """`python -m shmlab stress --faults ... --json` with a 0.5 s grace, in a private mount
    namespace with its own /dev/shm tmpfs where the machine allows one (root, unshare)."""
    env = dict(os.environ, SHMLAB_MANAGER_GRACE="0.5")
    if pythonpath:  # and run there: `python -m` puts the working directory first on sys.path
        env["PYTHONPATH"] = pythonpath
    argv = [sys.executable, "-m", "shmlab", "stress", *args, "--json"]
    if os.geteuid() == 0 and shutil.which("unshare"):
        argv = ["unshare", "--mount", "sh", "-c", 'mount -t tmpfs -o size=256m tmpfs /dev/shm'
                ' && exec "$@"', "sh", *argv]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env,
                         cwd=pythonpath)
    assert out.stdout, out.stderr[-2000:]
    return out.returncode, json.loads(out.stdout)


@pytest.mark.timeout(300)
def test_stress_faults_never_unlink_a_live_segment(tmp_path):
    """Two trials or more of every fault kind (this seed draws each one), a live family
    allocating, sending and checking data through each: nothing live unlinked, nothing
    leaked, no crash, nothing stuck, good data; exit status 0."""
    from shmlab.testing.fault_trial import FAULT_KINDS

    rc, summary = _stress_faults(tmp_path, "--trials", "16", "--faults", "all", "--seed", "102",
                                 "--parallel", "2")
    table = summary["faults"]
    print(json.dumps(table, indent=1), summary["wall_s"], "s")
    assert sorted(table) == sorted(FAULT_KINDS)
    assert all(row["trials"] >= 2 for row in table.values()), table
    for kind, row in table.items():
        bad = {k: row[k] for k in ("live_unlinked", "leaked", "crashes", "stuck", "bad_data",
                                   "managers_stuck") if row[k]}
        assert not bad, (kind, bad, summary["incidents"])
        assert row["exits_seen"] == row["trials"], (kind, row)  # every exit status was read
        assert row["rounds"] >= 2 * row["trials"], (kind, row)
    assert rc == 0


@pytest.mark.timeout(200)
def test_stress_faults_fail_against_a_manager_that_counts_connections(tmp_path):
    """The detector is not vacuous: a scratch copy of shmlab whose manager forgets a member
    the moment its connection drops (torch's rule) loses live segments under `drop`, and
    the tool says so and exits 1."""
    import shmlab

    copy = tmp_path / "broken"
    shutil.copytree(os.path.dirname(shmlab.__file__), copy / "shmlab",
                    ignore=shutil.ignore_patterns("__pycache__"))
    liveness = copy / "shmlab" / "manager" / "liveness.py"
    text = liveness.read_text()
    rule = "return [m.pid for m in self.by_pid.values() if m.open_conns <= 0 and m.kept]"
    assert rule in text
    liveness.write_text(text.replace(rule, "return []  # broken on purpose"))
    rc, summary = _stress_faults(tmp_path, "--trials", "3", "--faults", "drop", "--seed", "3",
                                 pythonpath=str(copy))
    row = summary["faults"]["drop"]
    print(row)
    assert row["live_unlinked"] > 0 and rc == 1
