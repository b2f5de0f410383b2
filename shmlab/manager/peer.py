"""Who is at the other end of a manager handle: a shmlab manager of our own user, or not.

Mirrors: the uid check torch/lib/libshm/manager.cpp makes on its side (SO_PEERCRED), made here
from the client's side too, because a handle arrives inside a pickle.

Client side: client.py checks every handle with these before it sends a line over it.
"""

from __future__ import annotations

import os
import socket
import stat
import struct

from .errors import NotAManagerError
from .protocol import DAEMON_MODULE

__all__ = ["check_path", "check_peer"]


def _not_a_manager(handle: bytes, why: object) -> NotAManagerError:
    return NotAManagerError(
        f"{handle.decode(errors='replace')!r} is not a shmlab manager's socket ({why}), so "
        "nothing was sent to it: the manager handle in the message does not name a manager "
        "of this user. Fix: check what the sender pickled (a handle is the socket path its "
        "manager printed)."
    )


# Note [Checking a handle before talking to it]
# A handle arrives inside a pickle, and REGISTER lines name our pid and our segments: they must
# reach a shmlab manager of our own user and nothing else. Before connecting, the path must be a
# socket owned by our uid; after connecting, SO_PEERCRED names the process listening there, which
# must have our uid and run `python -m shmlab.manager` (the daemon checks our uid the same way).
# A path that does not exist is let through to connect(), whose error says the manager is gone.
def check_path(handle: bytes) -> None:
    try:
        st = os.lstat(handle)
    except FileNotFoundError:
        return
    except (OSError, ValueError) as exc:  # ValueError: an embedded NUL byte
        raise _not_a_manager(handle, exc) from exc
    if not stat.S_ISSOCK(st.st_mode):
        raise _not_a_manager(handle, "not a socket")
    if st.st_uid != os.geteuid():
        raise _not_a_manager(handle, f"owned by uid {st.st_uid}, not by us ({os.geteuid()})")


def check_peer(sock: socket.socket, handle: bytes) -> None:
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, _ = struct.unpack("3i", creds)
    if uid != os.geteuid():
        raise _not_a_manager(handle, f"the process listening there runs as uid {uid}")
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().decode(errors="replace").split("\0")
    except OSError:  # pid 0 (another pid namespace) or already gone
        argv = []
    script = DAEMON_MODULE.replace(".", "/") + "/__main__.py"
    if not any(a == DAEMON_MODULE or a.endswith(script) for a in argv):
        raise _not_a_manager(handle, f"the process listening there, pid {pid}, is not "
                                     f"`python -m {DAEMON_MODULE}`")
