"""Ctrl-C in the middle of a request to the manager: the client stays in step, nothing is lost.

Mirrors: torch/lib/libshm/socket.h (ClientSocket), whose request runs in C++ and so cannot be
cut by a KeyboardInterrupt; shmlab's client is Python, and reconnects after a cut instead
(client.py, Note [A request Ctrl-C cannot split]). The trials run a worker process that the
test interrupts at random points of share, attach and put (shmlab.testing.interrupt_trial),
shmlab and torch side by side; `python -m shmlab stress interrupt` prints the same counts.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from shmlab.manager import client as mc
from shmlab.testing.interrupt_trial import run_interrupt_trials


def _interrupt(signum, frame):
    raise KeyboardInterrupt


@pytest.mark.timeout(30)
def test_a_request_cut_by_ctrl_c_reconnects_and_loses_nothing(fresh_client, segment):
    first, second = segment(), segment()
    client = mc.get_client()
    pid = client.status()["pid"]
    events = client.watch(timeout=5)
    os.kill(pid, signal.SIGSTOP)  # the REGISTER goes out, its OK cannot come back
    signal.signal(signal.SIGALRM, _interrupt)
    signal.setitimer(signal.ITIMER_REAL, 0.2)
    try:
        with pytest.raises(KeyboardInterrupt):
            client.register(first)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, signal.SIG_DFL)
        os.kill(pid, signal.SIGCONT)
    client.register(second)  # a fresh connection: answered at once, its own OK
    deadline = time.monotonic() + 5
    while (st := client.status())["segments"] != sorted([first, second]):
        assert time.monotonic() < deadline, st  # the cut REGISTER was served all the same
        time.sleep(0.02)
    # The old connection closed without BYE: the manager keeps us as a member while we
    # live (liveness.py), so nothing of ours could be reclaimed in between.
    left = next(e for e in events if e["event"] == "left")
    assert left["pid"] == os.getpid() and "kept while the process lives" in left["reason"]
    assert st["clients"] == 1, st  # the new connection only


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("lib", ["shmlab", "torch"])
def test_500_interrupts_leave_no_client_out_of_step_and_lose_no_message(lib):
    # Shares and attaches in the loop, puts after each interrupt: an interrupt inside
    # Queue.put itself can leave the Queue's own lock held (CPython; `stress interrupt`
    # counts those), which is not the client's doing.
    rec = run_interrupt_trials(lib, 500, seed=26, ops=("share", "attach"))
    assert rec["trials"] == 500 and rec["out_of_step"] == 0, rec  # each next share answered
    if lib == "torch":
        # torch's manager request cannot be cut (C++), but its Python wrapper around a share
        # (torch/storage.py, _share_memory_lock_protected) can: a KeyboardInterrupt between
        # taking a storage's RLock and its try/finally leaves the lock held, and a later share
        # of a storage at that address (in the feeder thread) waits forever: a stuck worker,
        # its messages never sent. Seen in about 1 run of 500 trials in 3; not asserted.
        return
    assert rec["stuck"] == 0, rec
    assert rec["lost"] == rec["bad_data"] == 0, rec  # every put after an interrupt arrived
    assert rec["leaked"] == 0, rec  # and the manager reclaimed whatever a cut left behind
