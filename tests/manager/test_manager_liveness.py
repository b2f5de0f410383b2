"""The manager never unlinks a live segment: stalls, dropped connections, reused pids.

Mirrors: torch/lib/libshm/manager.cpp, which counts connections; we count live processes
(see Note [A dropped connection is not a dead process] in shmlab/manager/liveness.py).
Real processes, real sockets, SIGSTOP/SIGCONT on the real daemon; torch side by side where it
has the behaviour.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import psutil
import pytest

from shmlab.manager.liveness import Member, start_time
from shmlab.testing import faults

LIBS = ("torch", "shmlab")

# A family member that holds three file_system tensors, then keeps allocating (one every
# 50 ms) until an allocation fails, as a producer that gives up would; then waits, and on
# request allocates once more and reads its first tensor back.
HOLDER = r'''
import os, select, sys, time
lib, mode = sys.argv[1], sys.argv[2]
if lib == "torch":
    import torch, torch.multiprocessing as mp
else:
    import shmlab as torch, shmlab.multiprocessing as mp
mp.set_sharing_strategy("file_system")
held = []
def alloc(value):
    t = torch.zeros(16); t.share_memory_(); t.numpy()[0] = value
    held.append(t)
    return t.untyped_storage()._share_filename_cpu_()[1].decode().lstrip("/")
print(" ".join(alloc(i + 1) for i in range(3)), flush=True)
if mode == "churn":  # keep the newest 20, allocate and drop 20 a second; count the lost
    allocs = failed = lost = 0
    while not select.select([sys.stdin], [], [], 0)[0]:
        try:
            alloc(1); allocs += 1
        except Exception:
            failed += 1
        del held[3:-20]
        lost += sum(not os.path.exists("/dev/shm/" + t.untyped_storage()._share_filename_cpu_()
                                       [1].decode().lstrip("/")) for t in held)
        time.sleep(0.05)
    print("churn", allocs, failed, lost, flush=True)
elif mode == "drop":  # hang up on the manager without a word: our socket becomes /dev/null
    null = os.open(os.devnull, os.O_RDWR)
    for fd in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # the fd listdir itself used, closed by now
            continue
        if link.startswith("socket:"):
            os.dup2(null, int(fd))
    print("dropped", flush=True)
else:
    failed = 0
    while not failed:  # allocate until the stall makes one time out
        try:
            alloc(0); held.pop()
        except Exception:
            failed += 1
        time.sleep(0.05)
    print("failed", failed, flush=True)
sys.stdin.readline()
try:
    alloc(9); after = "ok"
except Exception as exc:
    after = type(exc).__name__
print(after, [float(t.numpy()[0]) for t in held[:3]], flush=True)
sys.stdin.readline()
'''


def manager_of(pid: int, lib: str) -> int:
    marker = "torch_shm_manager" if lib == "torch" else "shmlab.manager"
    for child in psutil.Process(pid).children(recursive=True):
        if marker in " ".join(child.cmdline()):
            return child.pid
    raise AssertionError(f"no {lib} manager under pid {pid}")


class Holder:
    def __init__(self, lib: str, mode: str):
        env = dict(os.environ, SHMLAB_MANAGER_GRACE="2")  # torch's SHUTDOWN_TIMEOUT
        self.proc = subprocess.Popen([sys.executable, "-c", HOLDER, lib, mode], env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.names = self.proc.stdout.readline().split()
        assert len(self.names) == 3, self.names
        self.manager = manager_of(self.proc.pid, lib)

    def say(self) -> str:
        self.proc.stdin.write("\n")
        self.proc.stdin.flush()
        return self.proc.stdout.readline().strip()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)
        self.proc.stdin.close()
        self.proc.stdout.close()


@pytest.fixture
def holders():
    made: list[Holder] = []

    def start(lib: str, mode: str) -> Holder:
        made.append(Holder(lib, mode))
        return made[-1]

    yield start
    for h in made:
        h.close()


@pytest.mark.timeout(90)
@pytest.mark.parametrize("lib", LIBS)
def test_a_stalled_manager_keeps_every_live_segment(holders, lib):
    """SIGSTOP the manager 2.2 s while the family allocates. The allocation in the stall fails
    on the 1 s timeout, as torch's does; the client must not close its socket for it (after
    SIGCONT and the 2 s grace the manager would unlink the family's 3 live segments). Both
    keep all 3."""
    h = holders(lib, "stall")
    time.sleep(0.3)
    faults.stall(h.manager, 2.2)
    assert h.proc.stdout.readline().split() == ["failed", "1"]  # the 1 s timeout, as torch
    time.sleep(2.0 + 1.5)  # the whole grace period after SIGCONT, and some
    live = faults.alive(h.names)
    after = h.say()
    print(f"{lib}: stall 2.2 s -> {live} of 3 live segments kept; then: {after}")
    assert live == 3
    assert after == "ok [1.0, 2.0, 3.0]"  # allocations work again, the data is intact
    h.say()  # exits; its manager reclaims after the grace (the leak checker waits)
    h.proc.wait(30)


@pytest.mark.timeout(120)
def test_random_stalls_never_unlink_a_live_segment(holders):
    """Four stalls of 0.5-3 s at random moments (shmlab.testing.faults.stall_later, as the
    stress tool injects them) while a member allocates 20 tensors a second and keeps the
    newest 20: every allocation in a stall may fail after 1 s, none may lose a segment."""
    import random

    rng = random.Random(15)
    h = holders("shmlab", "churn")
    stalls = []
    for _ in range(4):
        stalls.append(faults.stall_later(h.manager, rng, 0.5, 3.0, within=1.0))
        stalls[-1].join(10)
    time.sleep(2.0 + 1.0)  # past the grace period after the last SIGCONT
    _, allocs, failed, lost = h.say().split()
    print(f"stalls {[round(t.stall_s, 2) for t in stalls]} s: {allocs} allocations, "
          f"{failed} timed out, {lost} live segments lost")
    assert int(lost) == 0 and int(allocs) > 20
    assert faults.alive(h.names) == 3
    h.say()
    h.proc.wait(30)


@pytest.mark.timeout(90)
@pytest.mark.parametrize("lib", LIBS)
def test_a_dropped_connection_of_a_live_process_frees_nothing(holders, lib):
    """The process lives on and holds its segments, but its manager connection is gone.
    torch counts connections: after its 2 s it unlinks all 3 segments in use (the process
    still reads them, through its mapping, but nobody else can attach). shmlab keeps all 3
    until the process is dead (pidfd), then reclaims them."""
    h = holders(lib, "drop")
    assert h.proc.stdout.readline().strip() == "dropped"
    time.sleep(2.0 + 1.5)
    live = faults.alive(h.names)
    print(f"{lib}: connection dropped, process alive -> {live} of 3 segments kept")
    assert live == (0 if lib == "torch" else 3)
    assert h.say().endswith("[1.0, 2.0, 3.0]")  # its own mappings still read back
    h.proc.kill()
    h.proc.wait(10)
    deadline = time.monotonic() + 2.0 + 3.0  # dead now: reclaimed after the grace period
    while faults.alive(h.names) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert faults.alive(h.names) == 0


@pytest.mark.timeout(30)
def test_liveness_is_pid_reuse_aware():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        member = Member(child.pid)
        assert member.alive() and member.start == start_time(child.pid) is not None
        # Without a pidfd, the start time decides: a pid that now shows another start time
        # belongs to a newer process, so *our* member is dead.
        reused = Member(child.pid)
        reused.close()
        assert reused.alive()  # same start time: the same process
        reused.start -= 1
        assert not reused.alive()
        child.kill()
        deadline = time.monotonic() + 5
        while member.alive() and time.monotonic() < deadline:  # pidfd readable at exit,
            time.sleep(0.01)  # before anyone reaps the zombie
        assert not member.alive() and start_time(child.pid) is None  # a zombie is dead too
        member.close()
    finally:
        child.kill()
        child.wait()
