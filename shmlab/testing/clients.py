"""A thousand member processes on one shm manager: forked from one small parent, each registers
a real /dev/shm file, then leaves by BYE, by exiting, or by SIGKILL.

Mirrors: the client side of torch/lib/libshm (socket.h: ClientSocket.register_allocation sends
one 68-byte AllocInfo and reads "OK"), and of shmlab.manager.client (one "REGISTER" line, "OK").

Run as a script by its path (never `-m`: importing the shmlab package would cost every fork
its pages), by `drive()` (the stress tool's clients scenario: `python -m shmlab stress
--clients 1100,2000`) and by tests/manager/test_manager_scale.py:

    python .../clients.py --lib shmlab|torch --handle PATH --n 1000 --token T [--seed 0]

It forks N children, one at a time; each creates /dev/shm/<prefix>_<token>_<i>, connects to the
manager at PATH and registers the name in the manager's own protocol (a refused child unlinks
its file, as an allocation that fails does). When every child has answered, it prints one JSON
line {"served", "refused"} and waits for "go" on stdin (the caller lets go of its own
connection first); then a third of the children say BYE (shmlab; torch has no BYE) and exit,
a third exit without a word and a third are SIGKILLed. It reaps them all, then watches
/dev/shm until every served file is gone or --deadline seconds pass, and prints the last JSON
line: served, refused, reclaimed, left (names), last_exit_to_reclaim_s.

Note [Why not torch's share_memory_() in forked children]
torch's libshm keeps one socket per manager in a static map (core.cpp `managers`) that a fork
child inherits: children of a parent that allocated share its single connection (the manager
sees one client), and children of one that did not each start a manager of their own. Neither
is "N clients of one manager", which is what the issue measures. So each child speaks
torch's client protocol itself, byte for byte what register_allocation() sends, to one
torch_shm_manager the caller started, as shmlab's children speak shmlab's.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import random
import secrets
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time

SHM_DIR = "/dev/shm"
PREFIX = {"shmlab": "shmlab_clients", "torch": "torch_clients"}
ALLOC_INFO = struct.Struct("=ic60s3x")  # torch's AllocInfo: pid_t pid; char free; char[60]
MODES = ("bye", "exit", "kill")
ANSWER = struct.Struct("=I?")  # a child's index and "served": 5 bytes, one atomic pipe write


def names(lib: str, token: str, n: int) -> list[str]:
    return [f"{PREFIX[lib]}_{token}_{i}" for i in range(n)]


def _register(lib: str, handle: str, name: str, timeout: float) -> socket.socket | None:
    """Connect and register `name` as a client would; the socket if "OK", else None."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    # A blocking connect, as torch's ClientSocket does: with the listen backlog full it waits
    # for the manager to accept, where a socket with a timeout fails at once with EAGAIN.
    # SIGALRM (_child) bounds the wait instead.
    sock.connect(handle)
    sock.settimeout(timeout)
    if lib == "torch":
        sock.sendall(ALLOC_INFO.pack(os.getpid(), b"\0", ("/" + name).encode()))
        reply = sock.recv(2)
    else:
        sock.sendall(f"REGISTER {os.getpid()} {name}\n".encode())
        reply = sock.recv(256).split(b"\n")[0]
    if reply == b"OK":
        return sock
    sock.close()
    return None


def _child(i: int, lib: str, handle: str, name: str, mode: str, go_r: int, res_w: int,
           timeout: float) -> None:
    """One member process. Never returns: os._exit, so no parent's cleanup runs twice."""
    path = os.path.join(SHM_DIR, name)
    sock = None

    def too_slow(*_):
        raise TimeoutError(f"no answer in {timeout} s")

    signal.signal(signal.SIGALRM, too_slow)
    signal.alarm(max(1, int(timeout)))
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        os.write(fd, bytes(64))  # a header's worth, like a real segment
        os.close(fd)
        sock = _register(lib, handle, name, timeout)
    except OSError:  # TimeoutError included
        pass
    signal.alarm(0)
    if sock is None:  # refused or never answered: the allocation fails and cleans up
        try:
            os.unlink(path)
        except OSError:
            pass
    os.write(res_w, ANSWER.pack(i, sock is not None))
    os.read(go_r, 1)  # end of file: the parent said go
    if mode == "bye" and sock is not None and lib == "shmlab":
        try:
            sock.sendall(b"BYE\n")
        except OSError:
            pass
    if mode == "kill":
        time.sleep(120)  # the parent SIGKILLs us; an orphan still ends
    os._exit(0)


def run(lib: str, handle: str, n: int, token: str, seed: int = 0, deadline: float = 60.0,
        timeout: float = 60.0, go=None) -> dict:
    """Fork the N children, wait for their answers, let them go, reap, watch the reclaim."""
    rng = random.Random(seed)
    modes = [MODES[i % 3] for i in range(n)]
    rng.shuffle(modes)
    all_names = names(lib, token, n)
    go_r, go_w = os.pipe()
    res_r, res_w = os.pipe()
    pids = []
    start = time.monotonic()
    for i, (name, mode) in enumerate(zip(all_names, modes, strict=True)):
        pid = os.fork()
        if pid == 0:
            os.close(go_w)
            os.close(res_r)
            _child(i, lib, handle, name, mode, go_r, res_w, timeout)
        pids.append(pid)
    os.close(res_w)
    os.close(go_r)
    answers = b""
    while len(answers) < n * ANSWER.size:  # end of file early: a child died unanswered
        chunk = os.read(res_r, n * ANSWER.size)
        if not chunk:
            break
        answers += chunk
    os.close(res_r)
    served = [all_names[i] for i, ok in ANSWER.iter_unpack(answers) if ok]
    rec = {"lib": lib, "clients": n, "served": len(served), "refused": n - len(served),
           "register_s": round(time.monotonic() - start, 2)}
    if go is not None:
        go(rec)
    os.close(go_w)  # go
    for pid, mode in zip(pids, modes, strict=True):
        if mode == "kill":
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    for pid in pids:
        os.waitpid(pid, 0)
    last_exit = time.monotonic()
    end = last_exit + deadline
    left = list(served)
    while left and time.monotonic() < end:
        left = [name for name in left if os.path.lexists(os.path.join(SHM_DIR, name))]
        time.sleep(0.02)
    rec.update(reclaimed=len(served) - len(left), left=left,
               last_exit_to_reclaim_s=None if left else round(time.monotonic() - last_exit, 2))
    return rec


def unlink_all(lib: str, token: str) -> int:
    """Remove whatever a run with this token left in /dev/shm (a failed run's cleanup)."""
    gone = 0
    head = f"{PREFIX[lib]}_{token}_"
    for entry in os.listdir(SHM_DIR):
        if entry.startswith(head):
            try:
                os.unlink(os.path.join(SHM_DIR, entry))
                gone += 1
            except FileNotFoundError:
                pass
    return gone


# -- the driver: one manager, one forker, side by side for shmlab and torch ---------------------
def manager_command(lib: str) -> list[str]:
    """How to start a manager by hand, as the first allocation of a family would."""
    if lib == "shmlab":
        return [sys.executable, "-m", "shmlab.manager"]
    spec = importlib.util.find_spec("torch")  # found, not imported: the driver stays small
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("torch is not installed: the clients scenario compares with it")
    return [os.path.join(spec.submodule_search_locations[0], "bin", "torch_shm_manager")]


def drive(lib: str, n: int, seed: int = 0, deadline: float = 60.0) -> dict:
    """Start `lib`'s manager, run N member processes on it, and say what it served and
    reclaimed, how long after the last exit, and how the manager ended (0: it exited by
    itself after its grace; "stuck": still there `deadline` s later; else its exit status)."""
    token = secrets.token_hex(4)
    err = tempfile.TemporaryFile()
    manager = subprocess.Popen(manager_command(lib), stdout=subprocess.PIPE, stderr=err,
                               stdin=subprocess.DEVNULL)
    forker = None
    try:
        handle = manager.stdout.readline().decode().strip()
        manager.stdout.close()
        if not handle or handle.startswith("ERROR"):
            raise RuntimeError(f"{lib}'s manager did not start: {handle!r}")
        holder = socket.socket(socket.AF_UNIX)  # the starter's connection keeps it serving
        holder.connect(handle)
        forker = subprocess.Popen(
            [sys.executable, __file__, "--lib", lib, "--handle", handle, "--n", str(n),
             "--token", token, "--seed", str(seed), "--deadline", str(deadline)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, start_new_session=True)
        json.loads(forker.stdout.readline())  # every child has its answer
        holder.close()
        forker.stdin.write("go\n")
        forker.stdin.flush()
        rec = json.loads(forker.stdout.readline())
        try:
            rec["manager_exit"] = manager.wait(deadline)
        except subprocess.TimeoutExpired:
            rec["manager_exit"] = "stuck"
        err.seek(0)
        rec["manager_stderr"] = err.read()[-400:].decode(errors="replace")
        rec["leaked"] = len(rec.pop("left"))
        return rec
    finally:
        if forker is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(forker.pid, signal.SIGKILL)  # the forker and its children
            forker.wait()
            forker.stdin.close()
            forker.stdout.close()
        if manager.poll() is None:
            manager.kill()
            manager.wait()
        err.close()
        unlink_all(lib, token)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lib", choices=sorted(PREFIX), required=True)
    parser.add_argument("--handle", required=True, help="the manager's socket path")
    parser.add_argument("--n", type=int, required=True)
    parser.add_argument("--token", required=True, help="makes the file names unique")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--deadline", type=float, default=60.0)
    args = parser.parse_args(argv)

    def wait_for_go(rec: dict) -> None:
        print(json.dumps(rec), flush=True)
        sys.stdin.readline()

    print(json.dumps(run(args.lib, args.handle, args.n, args.token, args.seed, args.deadline,
                         go=wait_for_go)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
