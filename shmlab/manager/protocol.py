"""Check what the shm manager hears: request lines, segment names, command-line options.

Mirrors: the AllocInfo checks of torch/lib/libshm (socket.h, alloc_info.h, core.cpp), as a
text protocol.

Shared by the daemon (`shmlab.manager.daemon`) and its client (`shmlab.manager.client`), so
both refuse the same names for the same reason. Everything here is a pure function of its
input, except `segment_exists`, which looks at /dev/shm.
"""

from __future__ import annotations

import argparse
import os
import re
import stat

from .._shm import PREFIX, SHM_DIR

# `python -m DAEMON_MODULE` starts the daemon; introspect and the leak checkers recognise a
# running one by this word in its command line.
DAEMON_MODULE = "shmlab.manager"
MAX_LINE = 4096  # bytes; a longer line is refused and its sender dropped
DEFAULT_GRACE_S = 2.0  # torch: SHUTDOWN_TIMEOUT = 2000 ms
MAX_SEGMENTS = 1 << 18  # names one manager keeps: a runaway client must not grow it unbounded
# The kernel's own ceiling on pid numbers (PID_MAX_LIMIT on 64-bit Linux, 2^22): no pid, and so
# no pid field of a line, can be larger, whatever /proc/sys/kernel/pid_max says today.
PID_LIMIT = 1 << 22
MAX_DIGITS = 12  # a numeric field longer than this is refused before int() ever sees it
DEFAULT_IDLE_TIMEOUT_S = 30.0  # see Note [Who may be evicted] in daemon.py
DEFAULT_MAX_OBSERVERS = 64  # WATCH connections at once; each costs a queue of events
DEFAULT_LOG_BYTES = 4 << 20  # events.jsonl rotates to events.jsonl.1 past this size
STATUS_PAGE = 100  # names in a STATUS answer unless the caller asks for fewer or more ...
MAX_STATUS_PAGE = 1000  # ... but never more than this: an answer stays ~40 KB at most
# Our own names only: no "/" and no "." at all, so "..", "/etc/passwd" and "torch_*" never match.
# POSIX shm names start with one "/" (shm_open's convention); we accept it and drop it. This is
# looser than _shm.name_pattern() on purpose: it decides what is safe to unlink as ours, not
# whether new_name() made it (lab checks register names of their own under our prefix).
_NAME_RE = re.compile(rf"/?({PREFIX}_[A-Za-z0-9_-]{{1,120}})")


def parse_name(raw: str) -> str:
    """Return the bare /dev/shm file name for a segment name, or raise ValueError saying why."""
    match = _NAME_RE.fullmatch(raw)
    if match is None:
        raise ValueError(f"{raw[:80]!r} is not a shmlab segment name ({PREFIX}_<pid>_<rand>_<n>)")
    return match.group(1)


# Note [Every field bounded]
# Any process of our uid can connect and write anything, and one exception out of the daemon's
# loop stops the reclaim for every family it serves. So each numeric field is checked as text
# first (ASCII digits only, at most MAX_DIGITS of them: int() never sees 10^4000 or a
# non-ASCII digit), then as a number against the largest value that can make sense: a pid
# below PID_LIMIT, an offset at most MAX_SEGMENTS (there are never more names than that), a
# page clipped to MAX_STATUS_PAGE. What passes here cannot overflow anything downstream
# (islice included).
_DIGITS_RE = re.compile(rf"[0-9]{{1,{MAX_DIGITS}}}")


def parse_number(text: str, what: str, low: int, high: int) -> int:
    """`text` as an int in low..high, or ValueError saying what was expected."""
    if _DIGITS_RE.fullmatch(text) is None or not low <= int(text) <= high:
        raise ValueError(f"{what} must be a number from {low} to {high}, not {text[:24]!r}")
    return int(text)


def parse_request(line: bytes) -> tuple[str, int | None, str | tuple[int, int] | None]:
    """b"REGISTER 12 shmlab_12_7_0" -> ("REGISTER", 12, "shmlab_12_7_0"); ValueError if bad.

    b"STATUS [offset [limit]]" -> ("STATUS", None, (offset, limit)), offset at most
    MAX_SEGMENTS, limit clipped to MAX_STATUS_PAGE; WATCH and BYE take no arguments:
    ("WATCH", None, None). See Note [Every field bounded].
    """
    parts = line.decode("ascii", "replace").split()  # undecodable bytes cannot match below
    cmd = parts[0] if parts else ""
    if cmd in ("REGISTER", "FREE"):
        if len(parts) != 3:
            raise ValueError(f"usage: {cmd} <pid> <name>")
        return cmd, parse_number(parts[1], "pid", 1, PID_LIMIT - 1), parse_name(parts[2])
    if cmd == "STATUS":
        if len(parts) > 3:
            raise ValueError("usage: STATUS [<offset> [<limit>]]")
        offset = parse_number(parts[1], "offset", 0, MAX_SEGMENTS) if len(parts) > 1 else 0
        limit = (parse_number(parts[2], "limit", 0, 10**MAX_DIGITS - 1) if len(parts) > 2
                 else STATUS_PAGE)
        return cmd, None, (offset, min(limit, MAX_STATUS_PAGE))
    if cmd in ("WATCH", "BYE") and len(parts) == 1:
        return cmd, None, None
    raise ValueError(f"unknown command {line[:40]!r} (REGISTER, FREE, STATUS, WATCH or BYE)")


def segment_exists(name: str) -> bool:
    """Is /dev/shm/<name> a regular file of ours? torch asks shm_open(O_RDONLY); lstat opens
    nothing, so a FIFO or a symlink planted under our prefix cannot block or redirect us."""
    try:
        st = os.lstat(os.path.join(SHM_DIR, name))
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid()


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # raise instead of exiting: the daemon says "ERROR: ..." instead
        raise ValueError(message)


def parse_options(argv: list[str]) -> argparse.Namespace:
    """The daemon's options: --grace (or $SHMLAB_MANAGER_GRACE), --max-clients,
    --max-observers and --log-bytes (or $SHMLAB_MANAGER_LOG_BYTES)."""
    parser = _Parser(prog="python -m shmlab manager",  # = python -m shmlab.manager
                     description="The shm manager daemon (see shmlab/manager/daemon.py).")
    parser.add_argument("--grace", type=float,
                        default=os.environ.get("SHMLAB_MANAGER_GRACE", DEFAULT_GRACE_S),
                        help="seconds to wait after the last member leaves (says BYE or dies) "
                             "(default: $SHMLAB_MANAGER_GRACE or 2)")
    parser.add_argument("--max-clients", type=int, default=None,
                        help="connections served at once (default: what the fd limit allows, "
                             "see daemon.default_max_clients)")
    parser.add_argument("--idle-timeout", type=float, default=DEFAULT_IDLE_TIMEOUT_S,
                        help="seconds a connection that is not yet a client or an observer may "
                             "stay silent or in the middle of a line (default 30)")
    parser.add_argument("--max-observers", type=int, default=DEFAULT_MAX_OBSERVERS,
                        help="WATCH connections at once; more are refused (default 64)")
    parser.add_argument("--log-bytes", type=int,
                        default=os.environ.get("SHMLAB_MANAGER_LOG_BYTES", DEFAULT_LOG_BYTES),
                        help="events.jsonl rotates to events.jsonl.1 past this many bytes "
                             "(default: $SHMLAB_MANAGER_LOG_BYTES or 4 MiB)")
    args = parser.parse_args(argv)
    if not args.grace >= 0 or not (args.max_clients is None or args.max_clients >= 1):
        raise ValueError("--grace (or SHMLAB_MANAGER_GRACE) must be a number of seconds >= 0 "
                         "and --max-clients >= 1")  # `not >=` also rejects NaN
    if not args.idle_timeout > 0:
        raise ValueError("--idle-timeout must be a number of seconds > 0")
    if args.max_observers < 0 or args.log_bytes < 4096:
        raise ValueError("--max-observers must be >= 0 and --log-bytes (or "
                         "SHMLAB_MANAGER_LOG_BYTES) >= 4096")
    return args
