"""What crosses the wire when a tensor goes through a Queue, read from ``strace`` (C12.12).

``trace(strategy)`` runs ``shmlab.examples.wire`` under ``strace -f`` and returns, from the
parent's ``MARK`` on, every ``write`` and ``sendmsg``: who made it, how many bytes, and what
they are. ``None`` (with the reason in ``SKIP``) where strace is missing or not allowed.

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


def trace(strategy: str, timeout: float = 120.0) -> list[dict] | None:
    global SKIP
    if shutil.which("strace") is None:
        SKIP = "strace is not installed (apt-get install strace)"
        return None
    with tempfile.TemporaryDirectory(prefix="shmlab-wire-") as tmp:
        log = os.path.join(tmp, "strace.log")
        out = subprocess.run(["strace", "-f", "-qq", "-s", "400", "-x", "-o", log,
                              "-e", "trace=sendmsg,write", sys.executable, "-m",
                              "shmlab.examples.wire", strategy],
                             capture_output=True, text=True, timeout=timeout)
        if out.returncode != 0 or "MARK" not in out.stdout:
            SKIP = f"strace could not trace here: {out.stderr.strip()[:200]}"
            return None
        lines = open(log).read().splitlines()
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
