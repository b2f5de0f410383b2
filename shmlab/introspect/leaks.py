"""The doctor's leak checks: leaked segments, orphaned manager daemons, orphans' deleted fds.

Everything is read through ``shmlab.introspect`` from one process table, so "is the creator
alive?", "who maps this file?" and "is this daemon's parent gone?" are asked of the same
moment. Nothing here signals, unlinks or writes; ``doctor.clean`` removes what these checks
mark ``cleanable``, after checking again.
"""

from __future__ import annotations

import os
import pwd
import time

from .. import introspect
from ..manager.client import peek_status
from ..manager.errors import ManagerError
from ..messages import tr
from .checks import Finding, mib

# A segment younger than this may be a message in flight: its creator sent the name and exited,
# and the receiver has not attached yet (or a manager is about to reclaim it). Leave it be.
MIN_AGE_S = 5.0
# torch_shm_manager exits ~2 s after its last client leaves (a shmlab one after its --grace):
# an orphan seen once may just be winding down, so it is looked at again after this long.
SETTLE_S = 3.0


def _user(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)  # a uid with no passwd entry (common in containers)


def segment_facts(seg: introspect.ShmSegment, uid: int, users: list[int]) -> dict:
    """The JSON details of one segment."""
    return {"name": seg.name, "path": seg.path, "owner": seg.owner, "uid": uid,
            "user": _user(uid), "size": seg.size, "age_s": round(seg.age_s, 1),
            "creator_pid": seg.creator_pid, "creator_alive": seg.creator_alive,
            "used_by": users, "refcount": seg.refcount, "cleanable": False}


def _segment_finding(seg, uid: int, users: list[int], min_age_s: float) -> Finding | None:
    facts = segment_facts(seg, uid, users)
    what = tr("{path} ({owner}, {size}, {age:.0f} s old, user {user}, refcount {refcount})",
              path=seg.path, owner=seg.owner, size=mib(seg.size), age=seg.age_s,
              user=facts["user"], refcount=seg.refcount if seg.refcount is not None else "-")
    if seg.creator_alive:
        return None  # its creator still runs: in use, not a leak
    if users:
        return Finding("segment", "info",
                       tr("{what}: its creator is gone but pid(s) {pids} still use it",
                          what=what, pids=", ".join(map(str, users))), details=facts)
    if seg.creator_pid is None:  # psm_: the stdlib's names carry no pid
        return Finding("segment", "info",
                       tr("{what}: a stdlib SharedMemory segment nobody maps; it lives until "
                          "someone calls unlink()", what=what),
                       tr("rm {path}   (if no program of yours will attach to it again)",
                          path=seg.path),
                       facts)
    gone = tr("{what}: creator pid {pid} is gone and no process maps it", what=what,
              pid=seg.creator_pid)
    if seg.age_s < min_age_s:
        return Finding("segment", "info",
                       tr("{gone}, but it is only {age:.1f} s old (a message in flight, or a "
                          "manager about to reclaim it): look again", gone=gone, age=seg.age_s),
                       details=facts)
    if uid != os.geteuid():
        return Finding("segment", "warn",
                       tr("{gone}: a leak, owned by {user}", gone=gone, user=facts["user"]),
                       tr("ask {user} (or root) to run: rm {path}", user=facts["user"],
                          path=seg.path), facts)
    facts["cleanable"] = True
    return Finding("segment", "warn",
                   tr("{gone}: a leak ({size} of RAM held for nothing)", gone=gone,
                      size=mib(seg.size)),
                   tr("python -m shmlab doctor --clean   (or: rm {path})", path=seg.path), facts)


def segments(shm_dir: str = introspect.SHM_DIR, *, table=None,
             min_age_s: float = MIN_AGE_S) -> list[Finding]:
    """torch_/shmlab_/psm_ files whose creator is gone: leaked, in use by others, or young."""
    table = introspect.process_table() if table is None else table
    found = introspect.shm_segments(shm_dir, table=table)
    paths = [s.path for s in found]
    mapped, held = introspect.mapped_by(paths, table=table), introspect.held_by(paths, table=table)
    findings, in_use, vanished = [], 0, 0
    for seg in found:
        try:
            uid = os.lstat(seg.path).st_uid
        except FileNotFoundError:
            vanished += 1  # unlinked while we looked: its owner cleaned up
            continue
        users = sorted(set(mapped[seg.path]) | set(held[seg.path]))
        finding = _segment_finding(seg, uid, users, min_age_s)
        in_use += finding is None
        if finding is not None:
            findings.append(finding)
    gone = tr(" ({n} more went away while we looked)", n=vanished) if vanished else ""
    summary = Finding("segment", "ok",
                      tr("{n} segment(s) in {path}, {live} of them with a live creator{gone}",
                         n=len(found) - vanished, path=shm_dir, live=in_use, gone=gone),
                      details={"count": len(found) - vanished, "live": in_use,
                               "vanished": vanished})
    return [summary, *findings]


def _clients(info: introspect.ManagerInfo) -> int | None:
    """How many clients a manager serves now; None when we cannot tell."""
    if info.kind == "shmlab" and info.socket_path:
        try:  # STATUS on a fresh connection: it neither counts as a client nor restarts grace
            return int(peek_status(info.socket_path.encode())["clients"])
        except (ManagerError, OSError, KeyError, ValueError):
            return None
    try:  # torch_shm_manager: one listening socket, plus one accepted socket per client
        return max(0, introspect.fd_counts(info.pid)["socket"] - 1)
    except (OSError, Exception):  # noqa: BLE001 - exited, or not ours to read
        return None


def managers(*, table=None) -> list[Finding]:
    """torch_shm_manager and shmlab.manager daemons whose starter died and whose clients left."""
    table = introspect.process_table() if table is None else table
    findings = []
    infos = introspect.managers(table=table)
    if any(introspect.orphaned(i.pid, table) for i in infos):
        time.sleep(SETTLE_S)  # let a daemon that is winding down finish (see SETTLE_S)
        later = introspect.process_table()
        infos = [i for i in infos if later.get(i.pid, (0, "Z"))[1] != "Z"
                 and later[i.pid].started == table[i.pid].started]  # the same process
        table = later
    for info in infos:
        clients, gone = _clients(info), introspect.orphaned(info.pid, table)
        facts = {"pid": info.pid, "kind": info.kind, "ppid": info.ppid, "parent_gone": gone,
                 "clients": clients, "socket": info.socket_path}
        name = "torch_shm_manager" if info.kind == "torch" else "shmlab.manager"
        what = f"{name} pid {info.pid}"
        if gone and clients == 0:
            fix = (tr("kill -INT {pid}   (it reclaims its segments and exits)", pid=info.pid)
                   if info.kind == "shmlab" else
                   tr("kill {pid}   (then run the doctor again: its segments show as leaked)",
                      pid=info.pid))
            findings.append(Finding("manager", "warn",
                                    tr("{what}: orphaned, its starter is gone and it has no "
                                       "clients left", what=what), fix, facts))
        else:
            state = (tr("its starter is gone") if gone
                     else tr("started by pid {pid}", pid=info.ppid))
            findings.append(Finding("manager", "info",
                                    tr("{what}: {state}, {clients} client(s)", what=what,
                                       state=state, clients="?" if clients is None else clients),
                                    details=facts))
    return findings


def fd_leaks(*, table=None) -> list[Finding]:
    """Orphaned processes holding deleted /dev/shm fds: file_descriptor memory nobody will use."""
    table = introspect.process_table() if table is None else table
    findings = []
    for pid, proc in sorted(table.items()):
        if pid == os.getpid() or proc.state == "Z" or not introspect.orphaned(pid, table):
            continue
        try:
            fds = [f for f in introspect.open_fds(pid) if f.kind == "shm-deleted"]
            nbytes = sum(os.stat(f"/proc/{pid}/fd/{f.fd}").st_size for f in fds)
        except Exception:  # noqa: BLE001 - exited, or not ours to read (psutil or OSError)
            continue
        if fds:
            findings.append(Finding(
                "fd_leak", "warn",
                tr("pid {pid} ({name}) holds {n} deleted shm fd(s) ({size}) and its parent is "
                   "gone: memory no other process can reach", pid=pid, name=proc.name,
                   n=len(fds), size=mib(nbytes)),
                tr("kill {pid}   (if it is not a job you still run; the kernel frees the memory "
                   "with its last fd)", pid=pid), {"pid": pid, "name": proc.name, "fds": len(fds),
                                      "bytes": nbytes, "ppid": proc.ppid}))
    return findings


def leaks(shm_dir: str = introspect.SHM_DIR, *, min_age_s: float = MIN_AGE_S) -> list[Finding]:
    """Every leak check, from one process table."""
    table = introspect.process_table()
    return [*segments(shm_dir, table=table, min_age_s=min_age_s), *managers(table=table),
            *fd_leaks(table=table)]
