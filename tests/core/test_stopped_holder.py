"""A process stopped while it holds a segment's header lock delays a Queue.put; it never loses it.

Mirrors: nothing to compare in torch: its refcount is an std::atomic<int> in the header, moved
with one atomic instruction, so there is no lock a stopped process could hold and its put never
waits. shmlab's count sits under a robust mutex beside it (headerlock.py): a dead holder hands
the lock over (test_refcount_race.py), a live one is waited for, however long (Note [Waiting
for a stopped holder]). Before that wait the feeder thread gave up after 10 s, printed a
traceback and dropped the message.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

OLD_TIMEOUT_S = 10.0  # how long the lock used to be waited for before the message was dropped

# The sender: a file_system tensor, a fork child that takes its lock and stops itself, a
# receiver, q.put(t) (the feeder thread's pickling needs the lock for the in-flight count),
# SIGCONT after longer than the old timeout; the receiver must then get the tensor.
SCRIPT = r"""
import os, signal, sys, time
import shmlab
import shmlab.multiprocessing as mp
from shmlab._shm import headerlock

def receive(q, done):
    done.put(float(q.get(timeout=120).numpy()[0]))

mp.set_sharing_strategy("file_system")
t = shmlab.zeros(256).fill_(7.0).share_memory_()
mapping = t.untyped_storage()._held
r, w = os.pipe()
holder = os.fork()
if holder == 0:
    mapping.lock.acquire()
    os.write(w, b"x")
    os.kill(os.getpid(), signal.SIGSTOP)
    headerlock.release(mapping.lock.mutex)  # resumed: let go, then leave
    os._exit(0)
try:
    assert os.read(r, 1) == b"x"
    ctx = mp.get_context("fork")
    q, done = ctx.Queue(), ctx.Queue()
    receiver = ctx.Process(target=receive, args=(q, done), daemon=True)
    receiver.start()
    q.put(t)
    time.sleep(float(sys.argv[1]))
    print("before resume:", "nothing" if done.empty() else "got it", flush=True)
    os.kill(holder, signal.SIGCONT)
    print("received:", done.get(timeout=30), flush=True)
    receiver.join(30)
finally:
    os.kill(holder, signal.SIGKILL)
    os.waitpid(holder, 0)
"""


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_put_waits_for_a_stopped_lock_holder_and_arrives_once_it_resumes():
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(OLD_TIMEOUT_S + 1.5)],
                          capture_output=True, text=True, timeout=100,
                          env={**os.environ, "PYTHONWARNINGS": "always"})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["before resume: nothing", "received: 7.0"], proc.stderr
    assert "Still waiting" in proc.stderr  # the wait said why it took so long
    assert "Traceback" not in proc.stderr, proc.stderr  # the feeder dropped nothing
