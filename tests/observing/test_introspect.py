"""shmlab.introspect against real torch, real processes, real sockets and real /dev/shm files.

Children are forked (torch is already imported here, so they start in milliseconds) and their
workers are module-level functions. This process never makes a file_system tensor itself: a
process that does stays a client of torch_shm_manager until it exits, which would keep the
daemon alive for the whole session. Files we name ourselves go into a private folder on the
/dev/shm tmpfs, so leak checkers of other test runs going on at the same time never see them.
"""

from __future__ import annotations

import gc
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

import psutil
import pytest
import torch
import torch.multiprocessing as tmp
from support.waiting import wait_for

from shmlab import introspect
from shmlab.labs.report import run_in_child

FORK = tmp.get_context("fork")
N_TENSORS = 20


@pytest.fixture
def shm_folder():
    folder = tempfile.mkdtemp(prefix="introspect-test-", dir=introspect.SHM_DIR)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)




def stop(*procs):
    for proc in procs:
        if proc.is_alive():
            proc.kill()
        proc.join(10)


# -- workers (run in forked children) ---------------------------------------------------------


def receive_and_hold(queue, ready, got, release):
    ready.set()
    held = [queue.get(timeout=20) for _ in range(N_TENSORS)]
    got.set()
    release.wait(30)
    del held


def fs_producer(queue, pids, go, release):
    tmp.set_sharing_strategy("file_system")  # this child only; it starts its own manager
    tensor = torch.zeros(1000)  # 4,000 bytes
    tensor.share_memory_()
    pids.put(os.getpid())
    go.wait(30)
    queue.put(tensor)
    release.wait(30)
    del tensor
    gc.collect()


def fs_consumer(queue, got, release, freed):
    tensor = queue.get(timeout=20)
    got.set()
    release.wait(30)
    del tensor
    gc.collect()  # detach now (refcount -1), not at exit, where destructors may not run
    freed.set()


def create_segment_and_sleep(folder, ready):
    with open(f"{folder}/shmlab_{os.getpid()}_{1234567}_0", "wb") as f:
        f.write((1).to_bytes(4, "little") + bytes(60 + 400))  # refcount 1 | pad | 400 data
    ready.set()
    time.sleep(60)


# -- fds ---------------------------------------------------------------------------------------


@pytest.mark.timeout(20)
def _open_one_of_each(shm_folder, tmp_path):
    """Open one fd of each kind; return their kinds and how the counts moved."""
    # A collection between the two counts could close an unreachable socket left by an
    # earlier test (seen: socket +1 instead of +2). Collect now, then keep gc out of the way.
    gc.collect()
    gc.disable()
    before = introspect.fd_counts()
    r, w = os.pipe()
    pair = socket.socketpair()
    a, b = (end.fileno() for end in pair)
    regular = os.open(tmp_path / "plain.txt", os.O_CREAT | os.O_RDWR)
    folder = os.open(tmp_path, os.O_RDONLY)
    named = os.open(f"{shm_folder}/shmlab_1_2_3", os.O_CREAT | os.O_RDWR, 0o600)
    deleted = os.open(f"{shm_folder}/shmlab_1_2_4", os.O_CREAT | os.O_RDWR, 0o600)
    os.unlink(f"{shm_folder}/shmlab_1_2_4")
    try:
        kinds = {info.fd: info.kind for info in introspect.open_fds()}
        after = introspect.fd_counts()
    finally:
        for fd in (r, w, regular, folder, named, deleted):
            os.close(fd)
        for end in pair:
            end.close()
    return ([kinds[fd] for fd in (r, w, a, b, regular, folder, named, deleted)],
            {k: after[k] - before[k] for k in after})


@pytest.mark.timeout(30)
def test_open_fds_classifies_each_kind(shm_folder, tmp_path):
    # In a fork child: it has one thread, so no background thread of an earlier test (a
    # resource sharer, a queue feeder) can move the counts; gc is paused in there too.
    kinds, moved = run_in_child(_open_one_of_each, shm_folder, tmp_path)
    assert kinds == ["pipe"] * 2 + ["socket"] * 2 + ["file", "other", "shm-named", "shm-deleted"]
    expected = {"pipe": 2, "socket": 2, "file": 1, "other": 1, "shm-named": 1, "shm-deleted": 1}
    assert {k: moved[k] for k in expected} == expected
    assert moved["total"] == 8


@pytest.mark.timeout(20)
def test_gone_process_raises_and_snapshot_skips_it():
    child = subprocess.Popen(["true"])
    child.wait()
    with pytest.raises(psutil.NoSuchProcess):
        introspect.open_fds(child.pid)
    assert list(introspect.snapshot(pids=[os.getpid(), child.pid]).fds) == [os.getpid()]


@pytest.mark.timeout(30)
def test_probes_survive_fds_and_processes_vanishing_while_they_read(tmp_path):
    stop_churn = threading.Event()

    def churn():  # fds open and close, children start and exit, as fast as they can
        while not stop_churn.is_set():
            fds = [os.open(tmp_path / f"f{i}", os.O_CREAT | os.O_RDWR) for i in range(20)]
            fds += os.pipe()
            for fd in fds:
                os.close(fd)
            subprocess.run(["true"])

    worker = threading.Thread(target=churn)
    worker.start()
    try:
        deadline = time.monotonic() + 1.5
        while time.monotonic() < deadline:
            shot = introspect.snapshot()
            introspect.open_fds()
    finally:
        stop_churn.set()
        worker.join(10)
    assert os.getpid() in shot.fds and shot.fds[os.getpid()]["total"] > 0


@pytest.mark.timeout(20)
def test_process_family_lists_descendants():
    shell = subprocess.Popen(["sh", "-c", "sleep 30 & wait"])
    try:
        sleeper = wait_for(lambda: psutil.Process(shell.pid).children())[0].pid
        assert introspect.process_family(shell.pid) == [shell.pid, sleeper]
        family = introspect.process_family()
        assert family[0] == os.getpid() and {shell.pid, sleeper} <= set(family)
    finally:
        for proc in psutil.Process(shell.pid).children():
            proc.kill()  # the shell's `wait` returns and the shell exits by itself
        shell.wait(10)


@pytest.mark.timeout(40)
def test_fd_strategy_receiver_holds_one_deleted_shm_fd_per_tensor():
    assert tmp.get_sharing_strategy() == "file_descriptor"
    queue, ready, got, release = FORK.Queue(), FORK.Event(), FORK.Event(), FORK.Event()
    child = FORK.Process(target=receive_and_hold, args=(queue, ready, got, release))
    child.start()
    try:
        assert ready.wait(20)
        before = introspect.fd_counts(child.pid)
        old = {info.fd for info in introspect.open_fds(child.pid)}  # inherited at fork, too
        tensors = [torch.full((256,), float(i)) for i in range(N_TENSORS)]
        for tensor in tensors:
            queue.put(tensor)
        assert got.wait(20)
        after = introspect.fd_counts(child.pid)
        new = [info for info in introspect.open_fds(child.pid) if info.fd not in old]
        family_fds = introspect.snapshot().fds
        release.set()
        child.join(20)
    finally:
        stop(child)
        queue.close()
        queue.join_thread()
    assert after["shm-deleted"] - before["shm-deleted"] == N_TENSORS
    assert after["total"] - before["total"] == N_TENSORS
    assert len(new) == N_TENSORS and {info.kind for info in new} == {"shm-deleted"}
    # "/dev/shm/torch_<our pid>_<rand>_<n> (deleted)": made by us, the sender, then unlinked
    assert all(info.target.startswith(f"/dev/shm/torch_{os.getpid()}_") for info in new)
    assert all(info.target.endswith(" (deleted)") for info in new)
    assert family_fds[child.pid] == after  # snapshot() watches the whole family
    assert family_fds[os.getpid()]["shm-deleted"] >= N_TENSORS  # the sender keeps its fds too


@pytest.mark.timeout(40)
def test_file_system_segment_refcount_and_torch_shm_manager():
    queue, pids = FORK.Queue(), FORK.Queue()
    go, got, release, freed, done = (FORK.Event() for _ in range(5))
    producer = FORK.Process(target=fs_producer, args=(queue, pids, go, done))
    consumer = FORK.Process(target=fs_consumer, args=(queue, got, release, freed))
    producer.start()
    try:
        creator = pids.get(timeout=20)
        mine = lambda: [s for s in introspect.shm_segments() if s.creator_pid == creator]
        first = wait_for(mine)[0]
        go.set()
        consumer.start()
        assert got.wait(20)
        held = mine()[0]
        running = [m for m in introspect.managers() if m.ppid == creator]
        release.set()
        assert freed.wait(20)
        after_consumer = mine()[0]
        done.set()
        producer.join(20)
        consumer.join(20)
        assert mine() == []  # the last closer unlinked it
    finally:
        stop(producer, consumer)
    assert first.name.startswith(f"torch_{creator}_") and first.owner == "torch"
    assert first.size == 4000 + 64 and first.refcount == 1
    assert first.creator_alive and not first.leaked and first.age_s >= 0
    assert (held.refcount, after_consumer.refcount) == (2, 1)
    assert tmp.get_sharing_strategy() == "file_descriptor"  # only the child switched
    [manager] = running
    assert manager.kind == "torch" and manager.sid == manager.pid != os.getsid(0)
    assert "torch-shm-dir-" in manager.socket_path and manager.socket_path.endswith(".sock")
    assert introspect.events(manager) == []  # torch's daemon keeps no event log


@pytest.mark.timeout(20)
def test_killed_creator_leaves_a_leaked_segment(shm_folder):
    with open(f"{shm_folder}/psm_0badf00d", "wb") as f:
        f.write(bytes(128))
    ready = FORK.Event()
    child = FORK.Process(target=create_segment_and_sleep, args=(shm_folder, ready))
    child.start()
    try:
        assert ready.wait(20)
        by_owner = lambda: {s.owner: s for s in introspect.shm_segments(shm_folder)}
        alive = by_owner()
        os.kill(child.pid, signal.SIGKILL)
        # Nobody has reaped the child yet: a zombie, which already counts as dead.
        zombie = wait_for(lambda: by_owner()["shmlab"].leaked)
        assert psutil.Process(child.pid).status() == psutil.STATUS_ZOMBIE
        child.join(10)
        reaped = by_owner()["shmlab"]
    finally:
        stop(child)
    seg, stdlib = alive["shmlab"], alive["stdlib"]
    assert seg.name == f"shmlab_{child.pid}_1234567_0" and seg.creator_pid == child.pid
    assert (seg.size, seg.refcount, seg.creator_alive, seg.leaked) == (464, 1, True, False)
    assert zombie and (reaped.leaked, reaped.creator_alive, reaped.refcount) == (True, False, 1)
    assert (stdlib.creator_pid, stdlib.leaked, stdlib.refcount) == (None, None, None)


# -- managers, limits ---------------------------------------------------------------------------

STAND_IN = r"""
import json, os, socket, sys, tempfile, time
folder = tempfile.mkdtemp(prefix="shmlab-shm-dir-")
server = socket.socket(socket.AF_UNIX)
server.bind(os.path.join(folder, "manager.sock"))
server.listen(1)
with open(os.path.join(folder, "events.jsonl"), "w") as log:
    log.write(json.dumps({"t": time.time(), "event": "started", "pid": os.getpid()}) + "\n")
    log.write('{"t": 1, "event": "joi')  # a line still being written
    log.flush()
    print(os.path.join(folder, "manager.sock"), flush=True)
    sys.stdin.read()
"""


@pytest.mark.timeout(20)
def test_shmlab_manager_found_with_its_socket_and_event_log():
    # A stand-in: a real process, socket and log laid out as docs/ARCHITECTURE.md specifies,
    # so this test does not wait for shmlab.manager itself. Its TMPDIR is short: pytest's
    # tmp_path under an xdist worker makes the socket path longer than AF_UNIX's 108 bytes.
    short = tempfile.mkdtemp(prefix="intro-")
    env = dict(os.environ, TMPDIR=short)
    argv = [sys.executable, "-c", STAND_IN, "shmlab.manager"]
    daemon = subprocess.Popen(argv, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        path = daemon.stdout.readline().decode().strip()
        found = [m for m in introspect.managers() if m.pid == daemon.pid]
    finally:
        daemon.stdin.close()
        daemon.wait(10)
        daemon.stdout.close()
    try:
        [manager] = found
        assert (manager.kind, manager.ppid, manager.socket_path) == ("shmlab", os.getpid(), path)
        [started] = introspect.events(os.path.dirname(path))
        assert started["event"] == "started" and started["pid"] == daemon.pid
    finally:
        shutil.rmtree(short, ignore_errors=True)


def test_events_skip_damaged_and_unfinished_lines(tmp_path):
    lines = ['{"event": "started"}', "not json", '{"event": "joined"}', '{"event": "le']
    (tmp_path / "events.jsonl").write_text("\n".join(lines))
    assert introspect.events(tmp_path) == [{"event": "started"}, {"event": "joined"}]
    assert introspect.events(tmp_path / "manager.sock") == introspect.events(tmp_path)
    assert introspect.events(tmp_path / "gone" / "manager.sock") == []


@pytest.mark.timeout(20)
def test_limits_match_getrlimit_statvfs_and_another_process():
    mine, vfs = introspect.limits(), os.statvfs("/dev/shm")
    assert (mine.nofile_soft, mine.nofile_hard) == resource.getrlimit(resource.RLIMIT_NOFILE)
    assert mine.shm_total == vfs.f_blocks * vfs.f_frsize
    assert 0 <= mine.shm_free <= mine.shm_total
    code = (
        "import resource, sys; hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1];"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (64, hard)); print(flush=True);"
        "sys.stdin.read()"
    )
    child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE)  # fmt: skip
    try:
        child.stdout.readline()
        theirs = introspect.limits(child.pid)
    finally:
        child.stdin.close()
        child.wait(10)
        child.stdout.close()
    assert (theirs.nofile_soft, theirs.nofile_hard) == (64, mine.nofile_hard)


def test_partial_snapshot_reads_the_table_it_is_given_and_keeps_the_parts_it_is_given(shm_folder):
    table = introspect.process_table()
    me = table[os.getpid()]
    assert isinstance(me, introspect.ProcStat) and me.ppid == os.getppid() and me.state != "Z"
    assert introspect.process_family(table=table)[0] == os.getpid()
    with pytest.raises(psutil.NoSuchProcess):  # the table given is the one read, not a fresh one
        introspect.process_family(table={})
    with open(f"{shm_folder}/shmlab_{os.getpid()}_7_0", "wb") as f:
        f.write(bytes(64))
    [seg] = introspect.shm_segments(shm_folder, table={})  # nobody alive in an empty table
    assert seg.creator_pid == os.getpid() and seg.creator_alive is False and seg.leaked
    kept_managers, kept_limits = [], introspect.limits()
    shot = introspect.snapshot([os.getpid()], shm_folder, table=table, managers=kept_managers,
                               limits=kept_limits)
    assert shot.managers is kept_managers and shot.limits is kept_limits  # not probed again
    assert list(shot.fds) == [os.getpid()] and [s.name for s in shot.segments] == [seg.name]
    assert introspect.managers(table={}) == []


@pytest.mark.timeout(60)
def test_events_read_the_rotated_log_first_then_the_current_one():
    """A real manager with the smallest log (--log-bytes 4096): 60 REGISTERs (~125 bytes
    each) rotate events.jsonl once into events.jsonl.1; events() gives all of them, oldest
    first, from "started" on (not only events.jsonl's, from the rotation on)."""
    from shmlab.testing import faults

    daemon = subprocess.Popen([sys.executable, "-m", "shmlab.manager", "--grace", "0.3",
                               "--log-bytes", "4096"], stdout=subprocess.PIPE)
    try:
        path = daemon.stdout.readline().decode().strip()
        folder = os.path.dirname(path)
        pid = os.getpid()  # names need not exist to be registered: nothing lands in /dev/shm
        names = [f"shmlab_{pid}_rotate{i}_0" for i in range(60)]
        with faults.connect(path) as sock:
            buf = bytearray()
            sock.sendall(b"".join(f"REGISTER {pid} {n}\n".encode() for n in names))
            assert [faults.readline(sock, buf) for _ in names] == [b"OK"] * len(names)
            older, current = (open(os.path.join(folder, f), "rb").read()
                              for f in ("events.jsonl.1", "events.jsonl"))
            found = introspect.events(path)
            sock.sendall(b"BYE\n")
        assert daemon.wait(30) == 0
    finally:
        daemon.kill()
        daemon.wait()
        daemon.stdout.close()
    lines = older.splitlines() + current.splitlines()
    print(f"{len(older)} + {len(current)} bytes, {len(lines)} events")
    assert older and current and len(older) <= 4096
    assert [e["event"] for e in found[:2]] == ["started", "joined"]
    assert [e["name"] for e in found if e["event"] == "registered"] == names
    assert len(found) == len(lines) == len(names) + 2
    assert [e["t"] for e in found] == sorted(e["t"] for e in found)


def test_a_process_start_time_is_exact_to_a_tick_not_to_a_second():
    """alive_since() tells a reused pid by its start time against a file's ctime with one second
    of slack, so the start time itself must not be off by up to a second more (it was, with
    /proc/stat's whole-second btime as the boot time: notebook 11's C12.41 failed on a machine
    booted at .8 of a second)."""
    from shmlab.introspect.processes import process_table

    before = time.time()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    after = time.time()
    try:
        started = process_table()[child.pid].started
    finally:
        child.kill()
        child.wait(timeout=30)
    tick = 1 / os.sysconf("SC_CLK_TCK")
    assert before - 2 * tick <= started <= after + 2 * tick, (before, started, after)
