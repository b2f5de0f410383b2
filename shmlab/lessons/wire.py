"""What crosses the wire when a tensor goes through a Queue, read from ``strace`` (C12.12).

``trace(script, strategy)`` runs ``python SCRIPT STRATEGY`` under ``strace -f`` (the script,
which notebook 04 writes, sends one tensor through a Queue and prints ``MARK <pid>`` just
before) and returns, from that ``MARK`` on, every ``write`` and ``sendmsg``: who made it, how
many bytes, and what they are. ``None`` (with the reason in ``SKIP``) where strace is missing
or not allowed. ``trace_each(script, strategies)`` does the same for several strategies, the
runs side by side.

Mirrors: nothing in torch; it reads CPython's connection.py / resource_sharer.py at work.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile

SKIP = ""
_CALL = re.compile(r'^(\d+) +(write|sendmsg)\((\d+), (.*)\) += (\d+)$')


def _bytes(literal: str) -> bytes:
    """strace's "\\x00\\x01..." (with -x) back into bytes (a trailing ... is cut off)."""
    body = literal.split('"')[1]
    return bytes(int(h, 16) for h in re.findall(r"\\x([0-9a-f]{2})", body)) if "\\x" in body \
        else body.encode()


def describe(call: str, data: bytes, rest: str) -> str:
    if call == "sendmsg":
        fds = re.search(r"cmsg_type=SCM_RIGHTS, cmsg_data=\[([\d, ]+)\]", rest)
        iov = re.search(r'iov_base="([^"]*)"', rest)
        return (f"{len(_bytes(chr(34) + iov.group(1) + chr(34)))} byte of data + SCM_RIGHTS "
                f"fd {fds.group(1)}" if fds and iov else "sendmsg")
    if len(data) >= 4 and data[4:15] == b"#CHALLENGE#":
        return "authkey handshake: #CHALLENGE# + random bytes"
    if data[4:13] == b"#WELCOME#" or data == b"#WELCOME#":
        return "authkey handshake: #WELCOME#"
    if len(data) >= 5 and data[4] == 0x80:  # a length prefix, then a pickle (protocol >= 2)
        names = [n.decode() for n in re.findall(rb"(rebuild_\w+|/torch_\w+)", data)]
        what = f"{names}" if names else "(the fd request: key, pid)"
        return f"length {int.from_bytes(data[:4], 'big')} + pickle {what}"
    if len(data) == 20 and data[:4] == b"\x00\x00\x00\x10":
        return "authkey handshake: HMAC digest"
    return "other (not the tensor)"


def _seccomp_bpf() -> list[str]:
    """strace 5.3+ can stop the tracee only at the traced calls (a seccomp filter) instead of
    at every one of the ~30,000 system calls of ``import torch``: the same trace, 2-3x faster."""
    try:
        version = subprocess.run(["strace", "-V"], capture_output=True, text=True, timeout=30)
        major, minor = re.search(r"version (\d+)\.(\d+)", version.stdout).groups()
    except (OSError, subprocess.SubprocessError, AttributeError):
        return []
    return ["--seccomp-bpf"] if (int(major), int(minor)) >= (5, 3) else []


def _start(script: str, strategy: str, log: str) -> subprocess.Popen:
    return subprocess.Popen(["strace", "-f", "-qq", *_seccomp_bpf(), "-s", "400", "-x", "-o", log,
                             "-e", "trace=sendmsg,write", sys.executable, script, strategy],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _events(proc: subprocess.Popen, log: str, timeout: float) -> list[dict] | None:
    global SKIP
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        stdout, stderr = proc.communicate()
        stderr += f" [killed after {timeout} s]"
    if proc.returncode != 0 or "MARK" not in stdout:
        SKIP = f"strace could not trace here: {stderr.strip()[:200]}"
        return None
    lines = _joined(open(log).read().splitlines())
    mark = next(i for i, line in enumerate(lines) if "MARK" in line)
    events = []
    for line in lines[mark + 1:]:
        m = _CALL.match(line)
        if not m or m.group(3) in ("1", "2"):  # stdout/stderr are not the wire
            continue
        pid, call, fd, rest, n = m.groups()
        data = _bytes(rest) if call == "write" else b""
        events.append({"pid": int(pid), "call": call, "fd": int(fd), "bytes": int(n),
                       "what": describe(call, data, rest)})
    return events


def _joined(lines: list[str]) -> list[str]:
    """strace -f splits a call that another process interrupts into ``PID call(args
    <unfinished ...>`` and, later, ``PID <... call resumed>) = N``: join the two halves (at the
    second's place), or the call would be missed."""
    out, pending = [], {}
    for line in lines:
        pid, _, rest = line.partition(" ")
        if line.endswith(" <unfinished ...>"):
            pending[pid] = line.removesuffix(" <unfinished ...>")
        elif rest.lstrip().startswith("<... ") and pid in pending:
            out.append(pending.pop(pid) + rest.split(" resumed>", 1)[-1])
        else:
            out.append(line)
    return out


def trace_each(script: str, strategies,
               timeout: float = 120.0) -> dict[str, list[dict] | None]:
    """``{strategy: trace(script, strategy)}``, the traced runs started together (they share
    nothing: each is its own parent and fork child, on its own pipe and, for file_descriptor,
    its own resource_sharer socket), so two cost about the time of one on two cores."""
    global SKIP
    if shutil.which("strace") is None:
        SKIP = "strace is not installed (apt-get install strace)"
        return dict.fromkeys(strategies)
    with tempfile.TemporaryDirectory(prefix="shmlab-wire-") as tmp:
        logs = {s: os.path.join(tmp, f"strace-{s}.log") for s in strategies}
        procs = {s: _start(script, s, logs[s]) for s in strategies}
        return {s: _events(procs[s], logs[s], timeout) for s in strategies}


def trace(script: str, strategy: str, timeout: float = 120.0) -> list[dict] | None:
    return trace_each(script, [strategy], timeout)[strategy]
