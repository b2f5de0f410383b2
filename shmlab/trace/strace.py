"""The system-call half of a trace: run ``strace``, read its log into events.

``command()`` is the strace command line (``SHMLAB_STRACE`` replaces the ``strace`` word, e.g.
``unshare --user strace`` to see a refused ptrace); ``attach(pid, log)`` attaches to a running
process and all its threads (the notebook's own kernel) and returns once every thread is
traced; ``stop(proc)`` detaches (SIGINT); ``parse(text, main_pid)`` turns the log into
``Event``s, keeping only the calls that move a segment: ``openat``/``unlink`` of
``/dev/shm``, ``ftruncate``/``fallocate``/``mmap``/``close`` of such an fd, ``munmap`` of
such a mapping, ``sendmsg``/``recvmsg`` carrying ``SCM_RIGHTS``, ``connect`` and writes to a
manager's or resource_sharer's socket, and the queue pipe's pickles. ``clone`` and
``execve`` are read for the process tree (threads to their process, argv for labels).

Mirrors: nothing in torch; it reads what MapAllocator.cpp, libshm and CPython's
resource_sharer.py do, as the kernel sees it.
"""

from __future__ import annotations

import codecs
import ctypes
import os
import re
import shlex
import shutil
import signal
import subprocess
import time

from .model import Event, StraceUnavailable, TraceError

CALLS = ("openat,ftruncate,fallocate,mmap,munmap,unlink,sendmsg,recvmsg,connect,sendto,write,"
         "close,execve,clone,clone3,fork,vfork")
OPTIONS = ["-f", "-ttt", "-T", "-y", "-yy", "-s", "512", "-e", f"trace={CALLS}"]
INSTALL = ("install it: apt-get install strace (Debian/Ubuntu), dnf install strace (Fedora), "
           "or trace(syscalls=False) for the Python-level trace alone")
PTRACE_FIX = ("ptrace is not permitted here: in Docker run with --cap-add=SYS_PTRACE (or "
              "--security-opt seccomp=unconfined); where Yama is on, set "
              "kernel.yama.ptrace_scope=0 or 1 (sysctl); inside a user namespace the tracer "
              "needs CAP_SYS_PTRACE over the traced process; or trace(syscalls=False) for the "
              "Python-level trace alone")
PR_SET_PTRACER, PR_SET_PTRACER_ANY = 0x59616D61, ctypes.c_ulong(-1).value


def command() -> list[str]:
    """The strace command (``SHMLAB_STRACE`` overrides it); StraceUnavailable if missing."""
    words = shlex.split(os.environ.get("SHMLAB_STRACE", "strace"))
    if not words or shutil.which(words[0]) is None:
        raise StraceUnavailable(f"strace was not found on PATH ({words[:1]}): {INSTALL}")
    return words


def allow_tracer() -> None:
    """Where Yama's ptrace_scope is 1, only an ancestor may trace us: let any process do it
    (prctl PR_SET_PTRACER_ANY; no privilege needed, and a no-op without Yama)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _tracers(pid: int) -> set[int]:
    found = set()
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/status") as f:
                found |= {int(line.split()[1]) for line in f if line.startswith("TracerPid:")}
        except OSError:
            continue  # a thread that ended meanwhile
    return found


def attach(pid: int, log: str, timeout: float = 15.0) -> subprocess.Popen:
    """strace -f -p PID, writing LOG; returns once every thread of PID is traced."""
    allow_tracer()
    err = open(log + ".err", "w+")
    proc = subprocess.Popen([*command(), *OPTIONS, "-o", log, "-p", str(pid)],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
                            start_new_session=True)  # a Ctrl-C in the notebook is not strace's
    deadline = time.monotonic() + timeout
    while True:
        if _tracers(pid) == {proc.pid}:
            err.close()
            return proc
        if proc.poll() is not None or time.monotonic() > deadline:
            stop(proc)
            err.seek(0)
            message = err.read().strip()
            err.close()
            raise _attach_error(message or f"strace exited with {proc.returncode}")
        time.sleep(0.005)


def _attach_error(message: str) -> TraceError:
    if "Operation not permitted" in message or "EPERM" in message:
        return TraceError(f"strace could not attach: {message.splitlines()[-1]}. {PTRACE_FIX}")
    return TraceError(f"strace could not attach: {message[-300:]}")


def run(argv: list[str], log: str, env: dict) -> subprocess.Popen:
    """strace -f ARGV (the command line's way): strace starts the command, so it may stop
    it at the traced calls only (``--seccomp-bpf``, strace 5.3+), not at every call."""
    return subprocess.Popen([*command(), *OPTIONS, *_seccomp(), "-o", log, "--", *argv],
                            env=env)


def _seccomp() -> list[str]:
    try:
        out = subprocess.run([*command(), "-V"], capture_output=True, text=True, timeout=30)
        major, minor = re.search(r"version (\d+)\.(\d+)", out.stdout).groups()
    except (OSError, subprocess.SubprocessError, AttributeError):
        return []
    return ["--seccomp-bpf"] if (int(major), int(minor)) >= (5, 3) else []


def stop(proc: subprocess.Popen, timeout: float = 10.0) -> None:
    """Detach: SIGINT makes strace let go of every traced process (they run on)."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# --- the log --------------------------------------------------------------------------------
_LINE = re.compile(r"^(\d+) +(\d+\.\d+) (\w+)\((.*)\) += (0x[0-9a-f]+|-?\d+|\?)(<[^>]*>+)?(.*)$")
_SHM = re.compile(r"/dev/shm(/[^ <>\"()]+)")
_SOCKET_PATH = re.compile(r"(?:sun_path=\"|,\")([^\"\]]*(?:manager\.sock|listener-[^\"\]]*))")


def _joined(lines: list[str], pending: dict) -> list[str]:
    """strace -f splits a call another process interrupts into ``PID T call(args <unfinished
    ...>`` and ``PID T <... call resumed>rest``: join the halves (at the first one's time).
    ``pending`` keeps the first halves whose second is still to come (a live read)."""
    out = []
    for line in lines:
        pid = line.split(" ", 1)[0]
        if line.endswith(" <unfinished ...>"):
            pending[pid] = line.removesuffix(" <unfinished ...>")
        elif "<... " in line and " resumed>" in line and pid in pending:
            out.append(pending.pop(pid) + line.split(" resumed>", 1)[1])
        else:
            out.append(line)
    return [line for line in out if line]


class Reader:
    """Turns strace's log into events, keeping state across calls (mappings, threads)."""

    def __init__(self, main_pid: int | None, main_tids=()):
        self.process_of = {tid: main_pid for tid in main_tids}
        if main_pid is not None:
            self.process_of[main_pid] = main_pid
        self.parent: dict[int, int] = {}
        self.argv: dict[int, list[str]] = {}
        self.maps: dict[tuple[int, str], str] = {}  # (pid, address) -> segment
        self.manager_sockets: set[str] = set()  # inodes of client sockets to a manager
        self._pending: dict = {}  # unfinished calls, by thread
        self._rest = ""  # a line not yet complete (a live read)

    def events(self, text: str) -> list[Event]:
        """The events of more of the log (complete lines only; the rest waits for more)."""
        text = self._rest + text
        complete, _, self._rest = text.rpartition("\n")
        out = []
        for line in _joined(complete.splitlines(), self._pending):
            m = _LINE.match(line)
            if m:
                event = self._one(*m.groups())
                if event is not None:
                    out.append(event)
        return out

    def _one(self, tid, t, call, args, ret, ret_path, rest) -> Event | None:
        tid = int(tid)
        pid = self.process_of.setdefault(tid, tid)
        if call in ("clone", "clone3", "fork", "vfork"):
            if ret.isdigit() and int(ret) > 0:
                child = int(ret)
                is_thread = "CLONE_THREAD" in args
                self.process_of[child] = pid if is_thread else child
                if not is_thread:
                    self.parent[child] = pid
            return None
        if call == "execve":
            if ret == "0" or not ret.startswith("-"):
                self.argv[pid] = re.findall(r'"((?:[^"\\]|\\.)*)"', args.split("], [", 1)[0])[1:]
            return None
        seg, fd, detail = self._what(pid, call, args, ret, ret_path or "")
        if (seg is None and detail is None) or (seg or "").startswith("/sem."):
            return None  # not a segment's call, or a multiprocessing semaphore
        return Event(t=float(t), pid=pid, tid=tid, thread="", layer="syscall", name=call,
                     lib=None, detail=f"{call}(...) = {ret}" + (f" {detail}" if detail else ""),
                     segment=seg, fd=fd, duration=_duration(rest))

    def _what(self, pid, call, args, ret, ret_path):
        """(segment, fd, detail) for a call that matters, (None, None, None) otherwise."""
        first = args.split(",", 1)[0]
        fd = _fd(first)
        failed = ret.startswith("-")
        if call == "openat":
            m = _SHM.search(args.split(",", 2)[1]) if "," in args else None
            if m:
                return m.group(1), _fd(ret) if not failed else None, _flags(args) + _err(ret)
        elif call == "unlink":
            m = _SHM.search(first)
            if m:
                return m.group(1), None, _err(ret)
        elif call in ("ftruncate", "fallocate", "close"):
            m = _SHM.search(first)
            if m:
                return m.group(1).removesuffix(" (deleted)"), fd, _err(ret)
        elif call == "mmap":
            parts = [p.strip() for p in args.split(",")]
            m = _SHM.search(parts[4]) if len(parts) > 4 else None
            if m and not failed:
                self.maps[(pid, ret)] = m.group(1)
                return m.group(1), _fd(parts[4]), f"{parts[1]} bytes at {ret}"
        elif call == "munmap":
            seg = self.maps.pop((pid, first.strip()), None)
            if seg:
                return seg, None, f"{args.split(',')[1].strip()} bytes at {first}"
        elif call in ("sendmsg", "recvmsg") and "SCM_RIGHTS" in args:
            m = _SHM.search(args.split("SCM_RIGHTS", 1)[1])
            fds = re.search(r"cmsg_data=\[(\d+)", args)
            return (m.group(1) if m else None, int(fds.group(1)) if fds else None,
                    "SCM_RIGHTS" + _err(ret))
        elif call == "connect":
            m = _SOCKET_PATH.search(args)
            if m:
                if "manager.sock" in m.group(1):
                    self.manager_sockets.add(_inode(first))
                return None, fd, _role(m.group(1)) + _err(ret)
        elif call in ("write", "sendto"):
            data = _data(args)
            if _inode(first) in self.manager_sockets:
                seg, said = _manager_message(data)
                return seg, fd, f"to the manager: {said}"
            m = _SOCKET_PATH.search(first)
            if m and "manager.sock" in m.group(1):
                return None, fd, f"the manager replies {data[:40].decode(errors='replace')!r}"
            if "pipe:" in first and b"rebuild_" in data:
                names = sorted(set(re.findall(r"rebuild_\w+", args)))
                return None, fd, f"pickle on the queue pipe ({', '.join(names)})"
        return None, None, None


def _inode(arg: str) -> str | None:
    m = re.search(r"UNIX-STREAM:\[(\d+)", arg)
    return m.group(1) if m else None


def _data(args: str) -> bytes:
    """The bytes of a write's buffer, from strace's escaped string."""
    m = re.search(r'"((?:[^"\\]|\\.)*)"', args)
    if not m:
        return b""
    try:
        return codecs.escape_decode(m.group(1).encode("latin-1", "replace"))[0]
    except ValueError:
        return m.group(1).encode("latin-1", "replace")


def _manager_message(data: bytes) -> tuple[str | None, str]:
    """shmlab's text line ("REGISTER 12 shmlab_...") or torch's 68-byte AllocInfo
    {pid_t pid; char free; char filename[60]}: (segment, what it says)."""
    if data.startswith((b"REGISTER ", b"FREE ")):
        line = data.split(b"\n", 1)[0].decode(errors="replace")
        name = line.split()[-1] if len(line.split()) >= 3 else ""
        return ("/" + name.lstrip("/")) if name else None, line
    if len(data) >= 6:
        pid = int.from_bytes(data[:4], "little")
        name = data[5:].split(b"\0", 1)[0].decode(errors="replace")
        verb = "free" if data[4] else "register"
        return name or None, f"AllocInfo {verb} pid {pid} {name}"
    return None, data[:40].decode(errors="replace")


def _role(path: str) -> str:
    return ("the manager's socket " if "manager.sock" in path else
            "the resource_sharer's listener ") + path


def _fd(text: str) -> int | None:
    m = re.match(r"\s*(\d+)", text or "")
    return int(m.group(1)) if m else None


def _flags(args: str) -> str:
    m = re.search(r"(O_[A-Z_|]+)", args)
    return m.group(1) if m else ""


def _err(ret: str) -> str:
    return f" (failed {ret})" if ret.startswith("-") else ""


def _duration(rest: str) -> float | None:
    m = re.search(r"<(\d+\.\d+)>", rest or "")
    return float(m.group(1)) if m else None
