"""The shared-memory files in /dev/shm: who made them, their refcount, and whether they leaked.

Reads torch's (``torch_*``), shmlab's (``shmlab_*``) and the stdlib's (``psm_*``) segments;
opens each only long enough to read its header, so looking never keeps a segment alive.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass

from .._shm import HEADER_SIZE, PREFIX, SHM_DIR, name_pattern
from .processes import ProcStat, alive_since, process_table

# torch_<pid>_<rand>_<n> and shmlab_<pid>_<rand>_<n> carry the creator's pid; psm_<hex> does not.
_SEGMENT_RE = re.compile(rf"(?:{name_pattern(f'(torch|{PREFIX})')}|psm_[0-9a-f]+)")


@dataclass(frozen=True)
class ShmSegment:
    name: str
    path: str
    owner: str  # 'torch' | 'shmlab' | 'stdlib'
    size: int  # bytes; a file_system segment is nbytes + HEADER_SIZE
    creator_pid: int | None  # from the name; None for psm_ (its name has no pid)
    creator_alive: bool | None
    age_s: float  # since the file's last metadata change: for a segment, its creation
    refcount: int | None  # header int32 of torch_/shmlab_ files >= HEADER_SIZE, else None
    leaked: bool | None  # creator dead, file still there; None when unknowable (psm_)


def _refcount(path: str) -> int | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        return None  # unlinked since we listed it, or another user's 0600 file
    try:
        raw = os.pread(fd, 4, 0)  # an aligned int32: one copy, never half an update
    finally:
        os.close(fd)  # hold nothing: an inspector must not keep a segment alive
    return int.from_bytes(raw, "little", signed=True) if len(raw) == 4 else None


def shm_segments(dir: str = SHM_DIR, *, table: dict[int, ProcStat] | None = None
                 ) -> list[ShmSegment]:
    """The torch_/shmlab_/psm_ files in ``dir``, each with its creator, refcount and leak state.

    ``table``: a process_table() to judge the creators by instead of a fresh one.
    """
    table = process_table() if table is None else table
    now, found = time.time(), []
    with os.scandir(dir) as entries:
        for entry in entries:
            match = _SEGMENT_RE.fullmatch(entry.name)
            try:
                if not match or not entry.is_file(follow_symlinks=False):
                    continue
                st = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue  # unlinked between the listing and the stat
            owner, creator = match.group(1) or "stdlib", match.group(2)
            pid = int(creator) if creator else None
            alive = None if pid is None else alive_since(pid, st.st_ctime, table)
            headed = owner != "stdlib" and st.st_size >= HEADER_SIZE
            found.append(ShmSegment(
                entry.name, entry.path, owner, st.st_size, pid, alive,
                age_s=max(0.0, now - st.st_ctime),
                refcount=_refcount(entry.path) if headed else None,
                leaked=None if alive is None else not alive))  # fmt: skip
    return sorted(found, key=lambda s: s.name)
