"""The manager under load: big STATUS, silent observers, floods of bad lines, a hogging peer.

Mirrors: torch/lib/libshm/manager.cpp has no STATUS, no observers and no log, so there is no
torch side here; each docstring names the failure the test guards against. Each test runs
a real daemon, attacks it with shmlab.testing.faults over real sockets, and ends with the
daemon exiting on its own (exit 0, directory gone), so the leak checker finds nothing.
"""

from __future__ import annotations

import functools
import json
import os
import threading
import time

import pytest
from support.managers import GRACE

from shmlab.manager import client as mc
from shmlab.manager.daemon import Manager
from shmlab.manager.daemon_conn import MAX_BAD_LINES
from shmlab.testing import faults


@pytest.fixture
def daemon(manager_daemon):
    return functools.partial(manager_daemon, hold=False)


def hung_up(sock) -> bool:
    """Did the other end close? (ECONNRESET when it closed with our lines still unread.)"""
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def leave(sock) -> None:
    """Say BYE and hang up: the way a client leaves (a silent hang-up would keep us)."""
    sock.sendall(b"BYE\n")
    sock.close()


@pytest.mark.timeout(120)
def test_status_of_8000_segments_drops_nobody_and_frees_nothing(daemon):
    """A STATUS answer for 8,000 live segments does not fit the socket buffer: a manager that
    drops a client "not reading its replies" would unlink all 8,000 after the grace period.
    Answers are pages, queued and sent as the reader takes them: a reader that asks for 20
    pages before reading a byte is slowed down, not dropped, and all 8,000 survive."""
    d = daemon()
    sock, names = faults.fill(d.path, 8000)  # the family's only client
    try:
        sock.sendall(b"STATUS 0 1000\n" * 20)  # ~0.8 MB of answers, nothing read yet
        time.sleep(float(GRACE) + 1.0)  # longer than the grace: had it dropped us...
        buf = bytearray()
        pages = [json.loads(faults.readline(sock, buf)) for _ in range(20)]
        assert {p["count"] for p in pages} == {8000} and all(len(p["segments"]) == 1000
                                                             for p in pages)
        full = mc.ManagerClient(d.path.encode())  # the client API pages through all names
        try:
            st = full.status()
        finally:
            full.close()
        assert st["segments"] == sorted(names) and st["count"] == 8000
        assert faults.alive(names) == 8000
        print(f"8000 segments: 20 unread STATUS pages, then {faults.alive(names)} alive")
        leave(sock)
        assert d.wait(30) == (0, "")
        assert faults.alive(names) == 0  # the client left: now they are reclaimed
    finally:
        sock.close()
        faults.unlink_all(names)


@pytest.mark.timeout(120)
def test_400_silent_observers_are_capped_and_dropped_quietly(daemon):
    """400 WATCH observers that never read must not crash the manager (dropping one must not
    emit an event that is sent, and drops, ...: RecursionError, nothing reclaimed). 64 are
    admitted (the cap), their events are queued, each is dropped once it is 256 KiB behind,
    without any event about it, and a reading observer sees every event."""
    d = daemon()
    seen: list[dict] = []
    reader = mc.watch(d.path.encode(), timeout=20)
    follow = threading.Thread(target=lambda: seen.extend(reader), daemon=True)
    follow.start()
    silent = faults.flood_observers(d.path, 400)
    names: list[str] = []
    try:
        deadline = time.monotonic() + 10  # the manager takes them in at its own pace
        while mc.peek_status(d.path.encode())["observers"] < 64 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert mc.peek_status(d.path.encode())["observers"] == 64  # the cap, reader included
        last = faults.readline(silent[-1], bytearray())
        assert last == b"ERR too many observers (64)" and hung_up(silent[-1])
        sock, names = faults.fill(d.path, 3000)  # 3,000 registered events, ~400 KB each
        slow = [e for e in d.log() if "observer not reading" in (e["reason"] or "")]
        assert len(slow) == 63  # every silent one was dropped (logged, not broadcast) ...
        assert mc.peek_status(d.path.encode())["observers"] == 1  # ... and our reader stays
        leave(sock)
        rc, err = d.wait(30)
        follow.join(10)
        assert (rc, err) == (0, "") and not os.path.exists(d.dir)
        assert faults.alive(names) == 0
    finally:
        faults.close_all(silent)
        faults.unlink_all(names)
    kinds = [e["event"] for e in seen]
    assert kinds.count("registered") == 3000 and kinds.count("reclaimed") == 3000
    assert kinds[-1] == "exiting"
    assert "refused" not in kinds  # over the cap or too slow: logged, never broadcast
    print(f"400 observers: exit {rc}, {kinds.count('reclaimed')} reclaimed, 64 admitted")


@pytest.mark.timeout(60)
def test_shutdown_unlinks_and_removes_its_dir_even_if_events_fail(monkeypatch, tmp_path):
    """shutdown() may raise only after the segments are unlinked and the directory is gone."""
    manager = Manager(0.1, 8)
    name = faults.make_segment()
    manager.segments[name] = None

    def broken(*args, **kwargs):
        raise RuntimeError("an observer exploded")

    monkeypatch.setattr(manager, "event", broken)
    with pytest.raises(RuntimeError, match="exploded"):
        manager.shutdown()
    assert faults.alive([name]) == 0 and not os.path.exists(manager.dir)


@pytest.mark.timeout(60)
def test_a_free_flood_is_cut_off_and_refusals_are_rate_limited(daemon):
    """5 MiB of b"FREE\n" (replies never read) must not write an event per line (a million
    "refused" events, a log of 100+ MB): the connection is closed after MAX_BAD_LINES bad lines
    and refusals are rate-limited per connection: a few dozen events, a few KB."""
    d = daemon()
    keep = faults.connect(d.path)
    flood = faults.free_flood(d.path, 5 << 20)
    try:
        assert hung_up(flood)  # closed by the manager, no reply (FREE has none)
        refused = [e for e in d.log() if e["event"] == "refused"]
        size = os.path.getsize(os.path.join(d.dir, "events.jsonl"))
    finally:
        flood.close()
        keep.close()
    print(f"5 MiB FREE flood: {len(refused)} refused events, log {size} bytes")
    assert len(refused) == MAX_BAD_LINES + 1  # each bad line, then "closed", then nothing
    assert refused[-1]["reason"] == f"{MAX_BAD_LINES} bad lines: closed"
    assert size < 16 << 10
    # FREE of a name never registered is not a bad line (two processes may both free a name
    # that is gone), so it does not close the connection; its refusals are rate-limited.
    sock, buf, pid = faults.connect(d.path), bytearray(), os.getpid()
    sock.sendall(b"".join(f"FREE {pid} shmlab_{pid}_never{i}_0\n".encode() for i in range(5000)))
    sock.sendall(b"STATUS 0 0\n")
    assert faults.readline(sock, buf).startswith(b"{")  # served all 5,000, still connected
    time.sleep(0.6)  # one more token: the next refusal is logged, with the count held back
    sock.sendall(f"FREE {pid} shmlab_{pid}_late_0\nSTATUS 0 0\n".encode())
    assert faults.readline(sock, buf).startswith(b"{")
    mine = [e for e in d.log() if e["event"] == "refused" and e["pid"] == pid][len(refused):]
    print(f"5,000 FREEs of unknown names: {len(mine)} refused events logged")
    assert 32 <= len(mine) <= 40 and "more refused, not logged" in mine[-1]["reason"]
    leave(sock)
    assert d.wait(30) == (0, "")


@pytest.mark.timeout(60)
def test_the_event_log_rotates_at_its_cap(daemon):
    """A log that grows with every tensor must not grow forever: events.jsonl rotates to
    events.jsonl.1 past --log-bytes, at most twice the cap on disk."""
    cap = 64 << 10
    d = daemon("--log-bytes", str(cap))
    sock, names = faults.fill(d.path, 1500)  # ~200 KB of "registered" events
    try:
        sizes = [os.path.getsize(os.path.join(d.dir, f)) for f in ("events.jsonl",
                                                                    "events.jsonl.1")]
        with open(os.path.join(d.dir, "events.jsonl")) as log:
            first = json.loads(log.readline())
        assert all(0 < s <= cap for s in sizes), sizes
        assert first["event"] == "registered"  # whole lines: a fresh file starts on one
        print(f"1500 registrations, cap {cap}: files {sizes} bytes")
        leave(sock)
        assert d.wait(30) == (0, "")
    finally:
        sock.close()
        faults.unlink_all(names)


@pytest.mark.timeout(120)
def test_a_status_storm_and_a_pipelining_peer_cannot_starve_register(daemon):
    """STATUS storms must not starve REGISTER (with a whole-table STATUS of 262,144 names,
    every REGISTER timed out): a STATUS is one page, and each connection gets LINES_PER_TURN
    lines a loop turn, so REGISTER answers within ~0.1 s while two threads storm STATUS and a
    third peer pipelines 2,000 STATUS it never reads."""
    d = daemon()
    sock, buf, pid = faults.connect(d.path, timeout=60), bytearray(), os.getpid()
    total = 50_000  # names need not exist to be registered; enough to make STATUS costly
    for i in range(0, total, 5000):
        sock.sendall(b"".join(f"REGISTER {pid} shmlab_{pid}_bogus{j}_0\n".encode()
                              for j in range(i, i + 5000)))
        assert all(faults.readline(sock, buf) == b"OK" for _ in range(5000))
    hog = faults.connect(d.path)
    hog.sendall(b"STATUS 0 1000\n" * 2_000)  # never read: back-pressured, not served ahead
    storm: dict = {}
    stormer = threading.Thread(target=lambda: storm.update(faults.status_storm(d.path, 2, 3)))
    stormer.start()
    try:
        time.sleep(0.5)
        latency = faults.register_latency(d.path, 20)
        stormer.join(30)
    finally:
        hog.close()
    print(f"{total} names + storm {storm} + hog: REGISTER max {max(latency):.3f} s")
    assert storm["errors"] == 0 and storm["answers"] > 10
    assert max(latency) < 0.5, latency
    leave(sock)
    assert d.wait(30) == (0, "")


@pytest.mark.timeout(120)
def test_the_stress_faults_start_and_stop_cleanly_and_free_nothing_live(daemon):
    """The API the stress tool calls: faults.start(kind, handle, pid, rng) ... .stop()."""
    import random

    d = daemon()
    sock, names = faults.fill(d.path, 3)  # the family: three live segments
    pid = mc.peek_status(d.path.encode())["pid"]
    records = []
    try:
        for kind in faults.KINDS:
            fault = faults.start(kind, d.path, pid, random.Random(kind))
            time.sleep(0.2)
            records.append(fault.stop())
            assert "error" not in records[-1]
        time.sleep(float(GRACE) + 0.5)
        assert faults.alive(names) == 3
        print(records)
        assert records[2]["pages"] == 20 and records[2]["own_names_unlinked"] == records[2]["names"]
        deadline = time.monotonic() + 20  # our FREEs shrink it back, at the manager's pace
        while mc.peek_status(d.path.encode())["count"] > 3 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert mc.peek_status(d.path.encode())["count"] == 3
        leave(sock)
        assert d.wait(30) == (0, "") and faults.alive(names) == 0
    finally:
        sock.close()
        faults.unlink_all(names)
