"""The shm manager daemon, with real processes, sockets and /dev/shm files.

Mirrors: torch/lib/libshm/manager.cpp (what torch_shm_manager promises).
Most tests use a 0.3 s grace period so the suite stays fast; the leak checker then sees the
daemon exit well inside its own wait. The client's own tests are in test_manager_client.py;
the `segment` and `fresh_client` fixtures both use are in support/managers.py.
"""

from __future__ import annotations

import json
import os
import pwd
import resource
import selectors
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time

import pytest
from support.managers import GRACE, SHM, exists

from shmlab.manager import client as mc
from shmlab.manager.errors import ManagerError


# -- helpers ------------------------------------------------------------------------------------
class Line:
    """A raw protocol connection, as a learner would type it."""

    def __init__(self, path: str, timeout: float = 3):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        self.sock.connect(path)
        self.buf = b""

    def send(self, data: bytes | str) -> None:
        self.sock.sendall(data.encode() if isinstance(data, str) else data)

    def readline(self) -> str:
        """One reply line, or '' once the manager has closed the connection."""
        while b"\n" not in self.buf:
            try:
                chunk = self.sock.recv(4096)
            except ConnectionResetError:
                chunk = b""
            if not chunk:
                return ""
            self.buf += chunk
        line, _, self.buf = self.buf.partition(b"\n")
        return line.decode()

    def ask(self, line: str) -> str:
        self.send(line + "\n")
        return self.readline()

    def close(self, bye: bool = True) -> None:
        """Leave: say BYE first (as ManagerClient.close() does), or just hang up (bye=False),
        which the manager treats as "maybe still alive" while this process lives."""
        if bye:
            try:
                self.sock.sendall(b"BYE\n")
            except OSError:
                pass  # the manager already closed us
        self.sock.close()


class Daemon:
    """A manager started the way the client starts one, read through its handshake line.

    Like a starter, we connect at once (`holder`): an open connection keeps it serving, so a
    slow moment of a loaded test machine cannot run out the short grace before a test begins.
    The holder never registers, so it is no client: no joined/left events, and `release()`
    lets the manager go as soon as no client is left.
    """

    def __init__(self, *args: str, preexec=None):
        self.proc = subprocess.Popen([sys.executable, "-m", "shmlab.manager", *args],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     preexec_fn=preexec)
        self.path = self.proc.stdout.readline().decode().strip()
        self.proc.stdout.close()
        self.dir = os.path.dirname(self.path)
        self.holder = Line(self.path)

    def release(self) -> None:
        self.holder.close()

    def wait(self, timeout: float = 5) -> int:
        self.release()
        return self.proc.wait(timeout=timeout)


@pytest.fixture
def daemon():
    started: list[Daemon] = []

    def start(*args: str, grace: str = GRACE, preexec=None) -> Daemon:
        d = Daemon("--grace", grace, *args, preexec=preexec)
        started.append(d)
        assert d.path.endswith("/manager.sock"), d.path
        return d

    yield start
    for d in started:  # every test leaves its manager to exit by itself; reap it
        d.release()
        try:
            d.wait(8)
        except subprocess.TimeoutExpired:
            d.proc.kill()
            d.proc.wait()
        d.proc.stderr.close()
        shutil.rmtree(d.dir, ignore_errors=True)  # only left behind by a killed manager


def status(path: str) -> dict:
    return mc.peek_status(path.encode())


def status_once_served(path: str, within: float = 5) -> dict:
    """STATUS, retried while the manager still refuses us (it has not yet seen a hang-up)."""
    deadline = time.monotonic() + within
    while True:
        try:
            return status(path)
        except ManagerError:  # refused: "ERR too many connections", or a reset
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


# -- start, handshake, detachment ---------------------------------------------------------------
@pytest.mark.timeout(20)
def test_handshake_private_dir_own_session_and_exit_when_nobody_comes(daemon):
    d = daemon()
    assert os.path.dirname(d.dir) == tempfile.gettempdir()
    assert os.path.basename(d.dir).startswith("shmlab-shm-dir-")
    assert stat.S_IMODE(os.stat(d.dir).st_mode) == 0o700  # nobody else may even look inside
    assert stat.S_ISSOCK(os.stat(d.path).st_mode)
    assert os.getsid(d.proc.pid) == d.proc.pid != os.getsid(0)  # setsid(): its own session
    with open(os.path.join(d.dir, "events.jsonl")) as log:
        first = json.loads(log.readline())
    assert first["event"] == "started" and first["pid"] == d.proc.pid
    assert d.wait() == 0  # no client within the grace period: it leaves
    assert not os.path.exists(d.dir)


@pytest.mark.timeout(20)
def test_ctrl_c_to_the_starters_process_group_does_not_kill_the_manager(tmp_path):
    # The starter runs in its own process group, as a notebook kernel or a terminal job does;
    # SIGINT to that whole group (Ctrl-C) kills the starter but not the detached daemon.
    script = ("from shmlab.manager.client import get_client; import time\n"
              "c = get_client(); print(c.handle.decode(), c.status()['pid'], flush=True)\n"
              "time.sleep(30)\n")
    env = dict(os.environ, SHMLAB_MANAGER_GRACE="1")
    starter = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL, start_new_session=True, env=env)
    path, pid = starter.stdout.readline().decode().split()
    holder = Line(path)  # keeps it serving (not a client) while we look, however slow we are
    os.killpg(starter.pid, signal.SIGINT)
    assert starter.wait(5) != 0
    starter.stdout.close()
    assert status(path)["pid"] == int(pid)  # still serving after the group's Ctrl-C
    holder.close()
    deadline = time.monotonic() + 6  # and still leaves on its own after the grace period
    while os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not os.path.exists(path)


# -- the protocol -------------------------------------------------------------------------------
@pytest.mark.timeout(20)
def test_register_free_status_and_free_only_drops_a_segment_that_is_gone(daemon, segment):
    d = daemon()
    a, b = segment(), segment()
    conn = Line(d.path)
    assert conn.ask(f"REGISTER {os.getpid()} {a}") == "OK"
    d.release()  # from now on `conn` is the client that keeps it alive
    assert conn.ask(f"REGISTER {os.getpid()} /{b}") == "OK"  # shm_open's leading "/" is fine
    st = json.loads(conn.ask("STATUS"))
    assert st["segments"] == sorted([a, b]) and st["clients"] == 1
    assert st["pid"] == d.proc.pid and st["grace_s"] == float(GRACE)
    conn.send(f"FREE {os.getpid()} {a}\n")  # no reply; the file still exists, so it stays
    assert json.loads(conn.ask("STATUS"))["segments"] == sorted([a, b])
    os.unlink(os.path.join(SHM, b))  # b's last user unlinked it, then says FREE
    conn.send(f"FREE {os.getpid()} {b}\n")
    assert json.loads(conn.ask("STATUS"))["segments"] == [a]
    conn.close()
    assert d.wait() == 0
    # Like torch: a FREE while the file still existed kept the name, so the reclaim took it.
    assert not exists(a)


@pytest.mark.timeout(20)
def test_killed_client_segment_is_reclaimed_and_watcher_sees_it_without_keeping_it_alive(
        daemon, segment):
    d = daemon()
    name = segment()
    events = mc.watch(d.path.encode(), timeout=5)  # subscribed once this returns
    client = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, time; from shmlab.manager.client import get_client\n"
         "get_client(sys.argv[1].encode()).register(sys.argv[2]); print('ready', flush=True)\n"
         "time.sleep(30)\n", d.path, name], stdout=subprocess.PIPE)
    assert client.stdout.readline() == b"ready\n"
    d.release()  # the holder never registered: no joined/left for it
    client.kill()  # SIGKILL: no FREE is ever sent
    client.wait()
    client.stdout.close()
    seen = [(e["event"], e["name"]) for e in events]  # ends when the manager exits
    assert seen == [("joined", None), ("registered", name), ("left", None), ("exited", None),
                    ("reclaimed", name), ("exiting", None)]  # left without BYE: kept till dead
    assert not exists(name)
    assert d.wait() == 0 and not os.path.exists(d.dir)


@pytest.mark.timeout(20)
def test_observer_alone_does_not_keep_the_manager_alive(daemon):
    d = daemon()
    watcher = Line(d.path)
    watcher.send("WATCH\n")
    d.release()
    assert json.loads(watcher.readline())["event"] == "exiting"
    assert watcher.readline() == ""  # then end of file
    assert d.wait() == 0


@pytest.mark.timeout(20)
def test_new_client_within_the_grace_period_keeps_everything(daemon, segment):
    grace = 1.5
    d = daemon(grace=str(grace))
    first, second = segment(), segment()
    events = mc.watch(d.path.encode(), timeout=5)
    a = Line(d.path)
    assert a.ask(f"REGISTER {os.getpid()} {first}") == "OK"
    d.release()
    a.close()  # last client gone: the grace period starts
    b = Line(d.path)
    assert b.ask(f"REGISTER {os.getpid()} {second}") == "OK"  # back within the grace
    log = [next(events) for _ in range(5)]  # joined registered left joined registered
    assert [e["event"] for e in log][2:4] == ["left", "joined"]
    left, joined = log[2]["t"], log[3]["t"]
    assert joined - left < grace  # (the events' own clock, not our sleeps, decides)
    time.sleep(max(0.0, left + grace + 0.3 - time.time()))  # past the first grace period
    assert exists(first) and status(d.path)["segments"] == sorted([first, second])
    b.close()
    log = list(events)
    left = [e["t"] for e in log if e["event"] == "left"][-1]
    reclaimed = [e for e in log if e["event"] == "reclaimed"]
    assert sorted(e["name"] for e in reclaimed) == sorted([first, second])
    assert reclaimed[0]["t"] - left >= grace  # it waited the whole grace period again
    assert d.wait() == 0


# -- who may talk to it -------------------------------------------------------------------------
def _as_nobody(path: str, nobody: pwd.struct_passwd) -> int:
    """Fork a child that drops to `nobody` and connects; its exit code says what happened:
    10 = connect refused by permissions, 11 = manager answered ERR and hung up, 12 = served."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.setgid(nobody.pw_gid)
            os.setuid(nobody.pw_uid)
            try:
                conn = Line(path)
            except PermissionError:
                code = 10
            else:
                reply = conn.readline()  # refused at accept: it speaks first, then hangs up
                code = 11 if reply.startswith("ERR peer uid") and conn.readline() == "" else 12
        finally:
            os._exit(code)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


@pytest.mark.timeout(20)
def test_only_peers_with_the_managers_uid_are_served(daemon):
    if os.geteuid() != 0:
        pytest.skip("needs root to switch a child to another uid (os.setuid)")
    try:
        nobody = pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("no 'nobody' user on this machine")
    d = daemon()
    events = mc.watch(d.path.encode(), timeout=5)
    assert _as_nobody(d.path, nobody) == 10  # first wall: the 0700 directory
    os.chmod(d.dir, 0o711)  # open the walls on purpose to reach the second one
    os.chmod(d.path, 0o777)
    assert _as_nobody(d.path, nobody) == 11  # second wall: SO_PEERCRED
    assert status(d.path)["clients"] == 0  # and it is still serving its own uid
    d.release()
    refused = [e for e in events if e["event"] == "refused"]
    assert len(refused) == 1 and f"peer uid {nobody.pw_uid}" in refused[0]["reason"]
    assert d.wait() == 0


# -- hostile input ------------------------------------------------------------------------------
HOSTILE_NAMES = ["torch_1_2_3", "psm_deadbeef", "shmlab_../../etc/passwd", "shmlab_a/b",
                 "/dev/shm/shmlab_1_2_3", "..", "shmlab_", "shmlab_" + "x" * 200, "shmlab_1.2"]


@pytest.mark.timeout(30)
def test_hostile_input_is_refused_and_foreign_files_are_never_unlinked(daemon, segment):
    d = daemon()
    owner = Line(d.path)
    mine = segment()
    foreign = [segment("psm"), segment("torch"), segment("shmlab")]  # exist, never registered
    victim = segment("psm")
    trap = f"shmlab_{os.getpid()}_symlink_0"  # a valid name, but a link to someone's file
    os.symlink(os.path.join(SHM, victim), os.path.join(SHM, trap))
    events = mc.watch(d.path.encode(), timeout=5)
    try:
        assert owner.ask(f"REGISTER {os.getpid()} {mine}") == "OK"
        d.release()
        for name in HOSTILE_NAMES:
            assert owner.ask(f"REGISTER {os.getpid()} {name}").startswith("ERR "), name
        for bad in ["HELLO", "\x00\xff\xfe garbage", "REGISTER", "REGISTER x shmlab_1_2_3",
                    "REGISTER -1 shmlab_1_2_3", "STATUS now", "WATCH"]:
            assert owner.ask(bad).startswith("ERR "), bad
        owner.send(f"FREE {os.getpid()} psm_deadbeef\nFREE 1 {foreign[2]}\n")  # no replies
        assert owner.ask(f"REGISTER {os.getpid()} {trap}") == "OK"  # valid name: accepted
        half = Line(d.path)
        half.send("REGISTER 12 shml")  # half a message, then gone
        half.close(bye=False)
        for payload in [b"A" * 10_000, b"STATUS " + b"x" * 5000 + b"\n"]:
            huge = Line(d.path)
            huge.send(payload)
            assert huge.readline() == ""  # cut off
            huge.close()
        assert json.loads(owner.ask("STATUS"))["segments"] == sorted([mine, trap])
        owner.close()
        log = list(events)
    finally:
        os.unlink(os.path.join(SHM, trap))
    assert d.wait() == 0
    reclaimed = [e["name"] for e in log if e["event"] == "reclaimed"]
    assert reclaimed == [mine]  # the symlink was registered but is not a file of ours
    assert all(exists(n) for n in foreign + [victim])
    reasons = [e["reason"] for e in log if e["event"] == "refused"]
    assert len(reasons) == len(HOSTILE_NAMES) + 7 + 2 + 3
    assert any("middle of a line" in r for r in reasons)
    assert sum("longer than 4096" in r for r in reasons) == 2


@pytest.mark.timeout(30)
def test_connection_flood_is_bounded_and_idle_strangers_make_room(daemon, segment):
    """A full table of connections that never became clients does not keep a newcomer out:
    the longest-idle one is evicted for it (torch has no cap at all). A table full of clients
    refuses the newcomer instead: a client is never evicted (Note [Who may be evicted])."""
    d = daemon("--max-clients", "8")
    idle = [d.holder] + [Line(d.path) for _ in range(7)]
    assert status_through(idle[-1])["clients"] == 0  # connected but never registered
    for _ in range(5):  # each newcomer is served; the oldest silent stranger goes
        extra = Line(d.path)
        assert json.loads(extra.ask("STATUS"))["pid"] == d.proc.pid
        idle.append(extra)
    assert [conn.readline() for conn in idle[:5]] == [""] * 5  # evicted, oldest first
    assert idle[0] is d.holder
    for conn in idle[5:]:  # now the table fills with clients, which nobody may evict
        assert conn.ask(f"REGISTER {os.getpid()} {segment()}") == "OK"
    refused = Line(d.path)
    assert refused.readline().startswith("ERR too many connections")
    refused.close()
    for conn in idle[5:]:
        conn.close()
    for conn in idle[:5]:
        conn.sock.close()
    assert d.proc.wait(10) == 0


@pytest.mark.timeout(30)
def test_a_full_fd_table_refuses_callers_instead_of_spinning_or_dying(daemon):
    # The manager cannot raise a hard limit of 64: its own fds plus ~55 callers fill it. By
    # default it would size its table to fit (default_max_clients); told a larger one, the
    # fd table fills first.
    d = daemon("--max-clients", "1000",
               preexec=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64)))
    conns = [d.holder] + [Line(d.path, timeout=10) for _ in range(79)]
    # Callers are accepted in the order they connected, so once the last one has its answer,
    # every earlier one has been dealt with: the refused have a line waiting, the rest none.
    last = conns[-1].readline()
    assert last.startswith("ERR out of fds"), last
    with selectors.DefaultSelector() as sel:
        for conn in conns[:-1]:
            sel.register(conn.sock, selectors.EVENT_READ, conn)
        replies = [last] + [key.data.readline() for key, _ in sel.select(0)]
    assert len(replies) > 10 and all(r.startswith("ERR out of fds") for r in replies), replies
    for conn in conns[:40]:
        conn.close()
    assert status_once_served(d.path)["pid"] == d.proc.pid  # fds free again: served again
    for conn in conns[40:]:
        conn.close()
    assert d.wait() == 0


def status_through(conn: Line) -> dict:
    return json.loads(conn.ask("STATUS"))


@pytest.mark.timeout(20)
def test_bad_options_answer_on_the_handshake_line(fresh_client, monkeypatch):
    out = subprocess.run([sys.executable, "-m", "shmlab.manager", "--grace", "-1"],
                         capture_output=True, text=True, timeout=10)
    assert out.returncode == 1 and out.stdout.startswith("ERROR: --grace")
    monkeypatch.setenv("SHMLAB_MANAGER_GRACE", "soon")
    with pytest.raises(ManagerError, match="could not start.*SHMLAB_MANAGER_GRACE"):
        mc.get_client()


@pytest.mark.timeout(20)
def test_a_socket_path_too_long_is_an_error_line_and_leaves_no_directory(tmp_path):
    deep = tmp_path / ("d" * 100)  # AF_UNIX paths stop at 107 bytes
    deep.mkdir()
    out = subprocess.run([sys.executable, "-m", "shmlab.manager"], capture_output=True,
                         text=True, timeout=10, env=dict(os.environ, TMPDIR=str(deep)))
    assert out.returncode == 1 and out.stdout.startswith("ERROR: "), out.stdout
    assert "set TMPDIR to a shorter directory" in out.stdout  # says what to do next
    assert list(deep.iterdir()) == []  # the half-made private directory was removed
