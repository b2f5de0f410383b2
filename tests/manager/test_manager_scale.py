"""The manager under hostile lines and a thousand clients: alive, serving, reclaiming.

Mirrors: torch/lib/libshm/manager.cpp, whose binary AllocInfo protocol has no numeric field to
overflow and whose poll() loop has no fd ceiling; shmlab's text protocol and Python loop must
match that. Real daemons, real sockets, real /dev/shm files; the member processes of the scale
test are forked by shmlab/testing/clients.py (the stress tool's clients scenario, which runs
torch's manager side by side) and the fuzz corpus is tests/support/linefuzz.py.
"""

from __future__ import annotations

import functools
import json
import os
import resource
import secrets
import signal
import socket
import subprocess
import sys
import time

import pytest
from support import linefuzz
from support.managers import SHM, exists

from shmlab.manager.daemon import Manager, default_max_clients
from shmlab.manager.liveness import Member
from shmlab.manager.protocol import MAX_SEGMENTS, MAX_STATUS_PAGE, parse_request
from shmlab.testing import clients

# A member process: registers the name it is given under its own pid, says "ok", then waits
# to be killed (stdin closing ends it too, so a failed test leaves no orphan).
MEMBER = r'''
import socket, sys
s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1])
s.sendall(f"REGISTER {__import__('os').getpid()} {sys.argv[2]}\n".encode())
print(s.recv(64).decode().strip(), flush=True)
sys.stdin.read()
'''


@pytest.fixture
def daemon(manager_daemon):
    return functools.partial(manager_daemon, hold=True)


@pytest.fixture
def member():
    """Start member processes that register a name and hold it until killed."""
    procs: list[subprocess.Popen] = []

    def start(path: str, name: str) -> subprocess.Popen:
        proc = subprocess.Popen([sys.executable, "-c", MEMBER, path, name],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        procs.append(proc)
        assert proc.stdout.readline() == b"OK\n"
        return proc

    yield start
    for proc in procs:
        proc.kill()
        proc.wait(10)
        proc.stdin.close()
        proc.stdout.close()


def gone_within(name: str, seconds: float) -> bool:
    end = time.monotonic() + seconds
    while exists(name) and time.monotonic() < end:
        time.sleep(0.02)
    return not exists(name)


# -- every field bounded -------------------------------------------------------------------------
@pytest.mark.parametrize("line", [b"STATUS 99999999999999999999 5", b"STATUS %d" % 2**63,
                                  b"STATUS 1 99999999999999999999",
                                  b"STATUS %d" % (MAX_SEGMENTS + 1),
                                  b"REGISTER 99999999999999999999 shmlab_1_2_3",
                                  b"REGISTER 0 shmlab_1_2_3",
                                  b"REGISTER %d shmlab_1_2_3" % 2**22,
                                  b"FREE -1 shmlab_1_2_3", b"STATUS +5", b"STATUS 0x10",
                                  "STATUS \u0663".encode(), b"STATUS " + b"9" * 4000,
                                  b"STATUS 0 0 0", b"REGISTER 1", b"\x00", b"NOPE 1"])
def test_every_field_is_bounded_or_refused(line):
    with pytest.raises(ValueError):
        parse_request(line)


def test_bounded_fields_still_take_every_sensible_value():
    assert parse_request(b"STATUS %d 1" % MAX_SEGMENTS) == ("STATUS", None, (MAX_SEGMENTS, 1))
    assert parse_request(b"STATUS 0 99999") == ("STATUS", None, (0, MAX_STATUS_PAGE))
    assert parse_request(b"STATUS") == ("STATUS", None, (0, 100))
    assert parse_request(b"REGISTER %d shmlab_1_2_3" % (2**22 - 1))[1] == 2**22 - 1


@pytest.mark.timeout(30)
def test_status_with_an_offset_past_2_63_answers_err_and_the_manager_still_reclaims(
        daemon, member, segment):
    """The line that ended the daemon (ValueError inside islice): now an ERR to its sender,
    and a member SIGKILLed afterwards still has its segment reclaimed."""
    d = daemon()
    name = segment()
    proc = member(d.path, name)
    assert d.ask(b"STATUS 99999999999999999999 5\n").startswith(b"ERR offset must be")
    assert json.loads(d.ask(b"STATUS\n"))["segments"] == [name]
    proc.kill()
    assert d.wait() == (0, "")
    assert not exists(name)


@pytest.mark.timeout(60)
def test_fuzzed_lines_leave_the_manager_alive_and_reclaiming(daemon, member, segment):
    """10,000 hostile lines (tests/support/linefuzz.py, seeded) over ~1,300 connections: every
    connection ends, no line reaches the internal-error guard, the daemon lives, and a member
    SIGKILLed afterwards has its segment reclaimed after the grace."""
    d = daemon()
    name = segment()
    proc = member(d.path, name)
    out = subprocess.run([sys.executable, linefuzz.__file__, d.path, "26", "10000"],
                         capture_output=True, text=True, timeout=45)
    report = json.loads(out.stdout)
    print(report)
    assert report["errors"] == [] and report["replies"]["ERR"] > 1000, report
    assert d.proc.poll() is None
    assert json.loads(d.ask(b"STATUS\n"))["count"] >= 1
    assert not [e for e in d.log() if "internal error" in (e["reason"] or "")]
    proc.kill()
    assert d.wait() == (0, "")
    assert not exists(name)


@pytest.mark.timeout(30)
def test_a_bug_in_a_handler_answers_err_and_the_manager_keeps_serving(monkeypatch, segment):
    """Note [One peer's line cannot stop the reclaim]: a handler that raises answers
    `ERR internal error` to that peer, is logged with its traceback, and the next line (the
    same peer's) is served."""
    manager = Manager(5.0, 8)
    sock = socket.socket(socket.AF_UNIX)
    try:
        monkeypatch.setattr(manager, "status", lambda *args: 1 / 0)
        sock.connect(manager.path)
        sock.settimeout(5)
        sock.sendall(f"STATUS\nREGISTER {os.getpid()} {segment()}\n".encode())
        got = b""
        end = time.monotonic() + 10
        while got.count(b"\n") < 2 and time.monotonic() < end:
            manager.turn(0.05)
            try:
                sock.setblocking(False)
                got += sock.recv(4096)
            except BlockingIOError:
                pass
        assert got == b"ERR internal error\nOK\n"
        with open(os.path.join(manager.dir, "events.jsonl")) as f:
            reasons = [json.loads(line)["reason"] or "" for line in f]
        assert any("internal error" in r and "ZeroDivisionError" in r for r in reasons)
    finally:
        sock.close()
        manager.shutdown()


@pytest.mark.timeout(30)
def test_every_line_of_a_peer_that_closed_at_once_is_served(daemon):
    # A peer that pipelines 40 REGISTERs and closes: the first turn serves 16 (the budget), the
    # OKs then fail to send (EPIPE), and the other 24 names must still be registered: a
    # process that dies right after registering files it made has left them to the manager.
    d = daemon()
    token = secrets.token_hex(4)
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(d.path)
        s.sendall(b"".join(b"REGISTER %d shmlab_t%s_%d\n" % (os.getpid(), token.encode(), i)
                           for i in range(40)))
    deadline = time.monotonic() + 10
    while (count := json.loads(d.ask(b"STATUS 0 0\n"))["count"]) < 40:
        assert time.monotonic() < deadline, f"only {count} of 40 lines were served"
        time.sleep(0.05)
    assert count == 40


# -- no fd ceiling -------------------------------------------------------------------------------
def test_a_member_with_a_pidfd_past_1023_is_still_asked(tmp_path):
    """select() refuses fds >= 1024 (FD_SETSIZE); the liveness check must not."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1200:
        pytest.skip(f"the hard fd limit ({hard}) is below 1200")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1200), hard))
    fillers = []
    try:
        while len(fillers) < 1100 and (not fillers or fillers[-1] < 1100):
            fillers.append(os.open(os.devnull, os.O_RDONLY))
        child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                                 stdin=subprocess.PIPE)
        m = Member(child.pid)
        assert m.pidfd is not None and m.pidfd > 1023
        assert m.alive()
        child.kill()
        child.wait(10)
        child.stdin.close()
        assert not m.alive()
        m.close()
    finally:
        for fd in fillers:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_the_default_table_leaves_a_pidfd_per_member_and_our_own_fds():
    assert default_max_clients(20000) == (20000 - 64) // 2
    assert default_max_clients(64) == 1


@pytest.mark.timeout(30)
def test_idle_and_half_line_strangers_are_evicted_but_a_silent_client_is_not(daemon, segment):
    """Note [Who may be evicted]: a connection that never sent a line, and one stuck in the
    middle of one, are closed after --idle-timeout; a STATUS poller and a client silent as
    long keep their connections (a client: its names)."""
    d = daemon("--idle-timeout", "0.5")
    silent, half, poller, client = (socket.socket(socket.AF_UNIX) for _ in range(4))
    try:
        for s in (silent, half, poller, client):
            s.settimeout(5)
            s.connect(d.path)
        half.sendall(b"STATUS 0")  # ... and never the end of the line
        poller.sendall(b"STATUS 0 0\n")
        assert json.loads(poller.recv(4096))["clients"] == 0
        client.sendall(f"REGISTER {os.getpid()} {segment()}\n".encode())
        assert client.recv(64) == b"OK\n"
        assert silent.recv(64) == b"" and half.recv(64) == b""  # evicted, both
        time.sleep(0.5)
        for s in (poller, client):  # a STATUS poller and a client: both kept
            s.sendall(b"STATUS 0 0\n")
            assert json.loads(s.recv(4096))["clients"] == 1
        reasons = [e["reason"] or "" for e in d.log()]
        assert sum("evicted" in r for r in reasons) >= 2  # the holder may be a third
        assert any("in the middle of a line" in r for r in reasons)
        client.sendall(b"BYE\n")
    finally:
        for s in (silent, half, poller, client):
            s.close()
    assert d.wait() == (0, "")


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_1000_concurrent_member_processes_are_all_served_and_all_reclaimed(daemon):
    """Issue 26: ~510 members took the daemon's fds past 1,023 and the first one to exit
    without BYE crashed it (select() on a pidfd). 1,000 member processes, forked from one
    small parent, each register a real file; a third say BYE, a third exit, a third are
    SIGKILLed. Every REGISTER is answered OK, every file is unlinked after the last exit,
    and the manager exits 0 with nothing on stderr."""
    d = daemon()
    token = secrets.token_hex(4)
    forker = subprocess.Popen([sys.executable, clients.__file__, "--lib", "shmlab", "--handle",
                               d.path, "--n", "1000", "--token", token, "--deadline", "60"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                              start_new_session=True)  # its children share its group
    try:
        registered = json.loads(forker.stdout.readline())
        assert registered["served"] == 1000, registered
        st = json.loads(d.ask(b"STATUS 0 0\n"))
        assert st["clients"] == 1000 and st["count"] == 1000
        d.holder.close()
        forker.stdin.write("go\n")
        forker.stdin.flush()
        done = json.loads(forker.stdout.readline())
        print({k: v for k, v in done.items() if k != "left"})
        assert done["reclaimed"] == 1000 and done["left"] == [], done
        assert forker.wait(30) == 0
        assert d.wait(30) == (0, "")
    finally:
        try:
            os.killpg(forker.pid, signal.SIGKILL)  # the forker and every child still there
        except ProcessLookupError:
            pass
        forker.wait(30)
        forker.stdin.close()
        forker.stdout.close()
        clients.unlink_all("shmlab", token)
        assert not [f for f in os.listdir(SHM) if token in f]


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_the_stress_clients_scenario_runs_both_managers_side_by_side(capsys):
    """`python -m shmlab stress --clients N`: one row per manager, torch's beside ours, and
    exit status 0 when ours served and reclaimed every client."""
    from shmlab.testing import stress

    assert stress.main(["--clients", "60", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["lib"], r["served"], r["reclaimed"], r["leaked"], r["crashed"]) for r in rows] \
        == [("shmlab", 60, 60, 0, 0), ("torch", 60, 60, 0, 0)]
    assert all(r["reclaim_s"] is not None for r in rows)
