"""The shm manager's client: lazy start, one connection per process, timeouts, a dead manager.

Mirrors: torch/lib/libshm/core.cpp (THManagedMapAllocator's side of torch_shm_manager).
The `segment` and `fresh_client` fixtures are in support/managers.py; the daemon's own tests are
in test_manager_daemon.py.
"""

from __future__ import annotations

import os
import shutil
import signal
import time

import pytest
from support.managers import exists

from shmlab.manager import client as mc
from shmlab.manager.errors import ManagerError


# -- the client ---------------------------------------------------------------------------------
@pytest.mark.timeout(20)
def test_client_starts_lazily_and_fork_children_open_their_own_connection(fresh_client,
                                                                          segment):
    parent_seg, child_seg = segment(), segment()
    client = mc.get_client()  # no manager yet: this starts one
    assert mc.get_client() is client and mc.get_client(client.handle) is client
    client.register("/" + parent_seg)
    pid = os.fork()
    if pid == 0:  # the child: same manager, a connection of its own
        code = 1
        try:
            mine = mc.get_client()
            ok = mine is not client and mine.handle == client.handle
            mine.register(child_seg)
            code = 0 if ok and mine.status()["clients"] == 2 else 2
        finally:
            os._exit(code)
    assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0
    deadline = time.monotonic() + 5
    while client.status()["clients"] != 1 and time.monotonic() < deadline:
        time.sleep(0.02)  # the child's exit closed its connection, not ours
    st = client.status()
    assert st["clients"] == 1 and st["segments"] == sorted([parent_seg, child_seg])
    with pytest.raises(ValueError, match="not a shmlab segment name"):
        client.register("torch_1_2_3")  # checked before anything is sent
    with pytest.raises(TypeError):
        client.register(42)
    events = client.watch(timeout=5)
    mc.reset()  # closes our connection: the last client is gone
    assert sorted(e["name"] for e in events if e["event"] == "reclaimed") == sorted(
        [parent_seg, child_seg])


@pytest.mark.timeout(20)
def test_registration_times_out_after_one_second_when_the_manager_stalls(fresh_client,
                                                                         segment):
    client = mc.get_client()
    pid = client.status()["pid"]
    os.kill(pid, signal.SIGSTOP)
    try:
        start = time.monotonic()
        with pytest.raises(ManagerError, match="not answering.*reset"):
            client.register(segment())
        assert time.monotonic() - start < 10  # loose on purpose: "gave up", not "hung"
    finally:
        os.kill(pid, signal.SIGCONT)
    # A slow reply is not "I left": still connected, and the late OK is skipped, not taken
    # for the answer to the next request (STATUS must answer with its own JSON).
    assert not client.closed and client.status()["clients"] == 1


@pytest.mark.timeout(20)
def test_killed_manager_leaves_segments_and_the_client_says_what_to_do(fresh_client, segment):
    name = segment()
    client = mc.get_client()
    client.register(name)
    old = client.handle
    pid = client.status()["pid"]
    os.kill(pid, signal.SIGKILL)
    for proc in mc._started:  # it was our child: reap it
        proc.wait(5)
    assert exists(name)  # nothing reclaimed: the segment still works for whoever maps it
    client.free(name)  # best effort, silent: a storage finalizer calls this
    with pytest.raises(ManagerError, match="reset"):
        client.register(name)
    with pytest.raises(ManagerError, match="exited, was killed"):
        mc.get_client()  # this process's manager is that dead one: no silent restart
    mc.reset()  # the documented way forward: forget it, start afresh
    fresh = mc.get_client()
    assert fresh.handle != old and fresh.status()["segments"] == []
    shutil.rmtree(os.path.dirname(old.decode()))  # a SIGKILLed manager cannot clean its dir


RECEIVER = r'''
import json, os, sys, time
import shmlab.multiprocessing  # noqa: F401 - the reducers, as a real receiver has them
from shmlab.manager import client as mc
from shmlab.storage import UntypedStorage
manager, name, size = sys.argv[1].encode(), sys.argv[2].encode(), int(sys.argv[3])
start = time.monotonic()
views = [UntypedStorage._new_shared_filename_cpu(manager, name, size) for _ in range(3)]
took = time.monotonic() - start
mine = mc.get_client(manager)
owed = mine._owed
data = [v._data.tobytes().hex() for v in views]
del views  # three releases; others still hold the file, so no FREE is sent
print(json.dumps({"took": took, "owed": owed, "data": data, "pid": os.getpid()}), flush=True)
sys.stdin.read()  # wait here, stalled manager or not, until the test lets us go
print(json.dumps(mine.status()), flush=True)  # its own JSON: the owed "OK" was skipped
'''


@pytest.mark.timeout(60)
def test_a_receiver_joins_once_without_waiting_even_while_the_manager_stalls(fresh_client):
    # Note [What a receiver tells the manager]: the creator's REGISTER waited; a receiver
    # sends one line, on its first attach, without waiting, so a stalled manager does not
    # fail a receive (torch's would, after 1 s), and the FREEs of holders that leave others
    # behind are not sent: the manager hears only what changes what it knows.
    import json
    import subprocess
    import sys

    import shmlab

    t = shmlab.tensor([1.0, 2.0, 3.0, 4.0])
    manager, name, size = t.untyped_storage()._share_filename_cpu_()  # waited for its OK
    client = mc.get_client()
    events = client.watch(timeout=10)
    pid = client.status()["pid"]
    os.kill(pid, signal.SIGSTOP)
    try:
        child = subprocess.Popen([sys.executable, "-c", RECEIVER, manager, name, str(size)],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        first = json.loads(child.stdout.readline())
    finally:
        os.kill(pid, signal.SIGCONT)
    try:
        assert first["took"] < 0.5, "a receive waited for a stalled manager"
        assert first["data"] == [t.untyped_storage()._data.tobytes().hex()] * 3
        assert first["owed"] == 1  # one REGISTER for three attaches, its answer still to come
        child.stdin.close()
        status = json.loads(child.stdout.readline())
        assert status["segments"] == [name.decode().lstrip("/")]
    finally:
        child.stdin.close()
        assert child.wait(30) == 0
    seen = []
    for e in events:
        if e["pid"] == first["pid"]:
            seen.append(e["event"])
        if e["event"] == "left" and e["pid"] == first["pid"]:
            break
    assert seen.count("registered") == 1 and "freed" not in seen, seen
    del t  # the last holder: its decref unlinks the file and its FREE makes the manager forget
    assert client.status()["segments"] == []


# -- the creator's REGISTER, overlapped with making the segment (storage.py) -------------------
@pytest.mark.timeout(20)
def test_work_while_waiting_that_fails_leaves_the_connection_in_step(fresh_client, segment):
    client = mc.get_client()

    def boom():
        raise OSError(28, "no space (a stand-in for a failed segment creation)")

    with pytest.raises(OSError, match="no space"):
        client.register(segment(), while_waiting=boom)
    # Not the manager's fault: still connected, and the REGISTER's OK, owed, is skipped.
    assert not client.closed
    status = client.status()
    assert status["clients"] == 1 and status["count"] == 1
    client.register(segment())  # and the next request gets its own answer


@pytest.mark.timeout(30)
def test_a_share_the_stalled_manager_does_not_confirm_leaves_no_file_and_stays_private(
        fresh_client):
    import numpy as np

    import shmlab
    from shmlab.multiprocessing import get_sharing_strategy, set_sharing_strategy

    before = get_sharing_strategy()
    set_sharing_strategy("file_system")
    try:
        shmlab.zeros(4).share_memory_()  # starts the manager
        client = mc.get_client()
        pid = client.status()["pid"]
        t = shmlab.from_numpy(np.arange(256, dtype=np.float32))
        ours = {n for n in os.listdir("/dev/shm") if n.startswith(f"shmlab_{os.getpid()}_")}
        os.kill(pid, signal.SIGSTOP)
        try:
            # The segment is made while the REGISTER waits; without an OK the name must
            # never be used: the file goes again and the tensor stays private.
            with pytest.raises(ManagerError, match="not answering"):
                t.share_memory_()
        finally:
            os.kill(pid, signal.SIGCONT)
        left = {n for n in os.listdir("/dev/shm") if n.startswith(f"shmlab_{os.getpid()}_")}
        assert left == ours and not t.is_shared()
        assert t.numpy().tolist() == list(range(256))
        assert t.share_memory_().is_shared()  # the manager answers again: in step
    finally:
        set_sharing_strategy(before)


@pytest.mark.timeout(20)
def test_a_free_from_a_finalizer_while_waiting_does_not_deadlock(fresh_client, segment):
    # While the creator makes its segment, a GC pass may run another storage's finalizer
    # on the same thread, and that finalizer says FREE over the same connection.
    client = mc.get_client()
    old = segment()
    client.register(old)
    os.unlink(f"/dev/shm/{old}")  # its last holder unlinked it: the FREE that follows is real
    new = segment()
    client.register(new, while_waiting=lambda: client.free(old))
    assert client.status()["segments"] == [new]  # the REGISTER's OK, then STATUS: in step


@pytest.mark.timeout(30)
def test_a_free_from_a_finalizer_while_a_free_waits_for_room_waits_its_turn(
        fresh_client, segment, monkeypatch):
    # A FREE meets a full socket buffer (the manager is stopped) and waits in _wait(). A GC
    # pass there can run a storage's finalizer: its FREE must not cut in (a reconnect would
    # send the rest of a half-sent line on the new connection, out of step for good); it is
    # deferred and sent after, on the same connection.
    client = mc.get_client()
    names = [segment(), segment()]
    for name in names:
        client.register(name)
        os.unlink(f"/dev/shm/{name}")  # their last holder unlinked them: the FREEs are real
    pid, sock, wait, seen = client.status()["pid"], client._sock, mc._wait, []

    def wait_with_a_finalizer(s, event, deadline, what):
        if not seen:
            client.free(names[1])  # what a storage's finalizer does
            seen[:] = [client._sock is sock, list(client._deferred)]
            os.kill(pid, signal.SIGCONT)
        return wait(s, event, deadline, what)

    monkeypatch.setattr(mc, "_wait", wait_with_a_finalizer)
    os.kill(pid, signal.SIGSTOP)
    try:
        while not seen:  # the stopped manager reads nothing: the kernel soon says EAGAIN
            client.free(names[0])
    finally:
        os.kill(pid, signal.SIGCONT)
    monkeypatch.undo()
    assert seen == [True, [f"FREE {os.getpid()} {names[1]}\n".encode()]]
    assert client._sock is sock and not client._deferred
    assert client.status()["segments"] == []  # in step, and both FREEs arrived


@pytest.mark.timeout(20)
def test_a_free_from_a_finalizer_while_a_reply_is_read_waits_for_the_request(
        fresh_client, segment, monkeypatch):
    # A GC pass can run a finalizer anywhere inside a request, e.g. while its reply is read:
    # the finalizer's FREE must neither cut in (the stream is mid-exchange) nor be lost.
    client = mc.get_client()
    old = segment()
    client.register(old)
    os.unlink(f"/dev/shm/{old}")
    readline = mc.ManagerClient._readline
    fired = []

    def readline_with_a_finalizer(self, deadline):
        if not fired:
            fired.append(True)
            self.free(old)  # what a storage's finalizer does
        return readline(self, deadline)

    monkeypatch.setattr(mc.ManagerClient, "_readline", readline_with_a_finalizer)
    new = segment()
    client.register(new)  # answered, not timed out: the FREE waited for the request
    monkeypatch.undo()
    assert fired and client.status()["segments"] == [new]  # and then it was sent
