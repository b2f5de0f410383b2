"""How much memory a process holds, and how big a tensor this machine has room for.

Mirrors: nothing (teaching aid); it reads what the kernel counts: /proc/self/status (RssAnon,
RssShmem, VmHWM), /proc/self/smaps_rollup (AnonHugePages), /proc/self/clear_refs (the peak
reset), getrusage (page faults), and a segment's st_blocks (tmpfs pages really allocated).
Used by notebook 13 and ``shmlab.lessons.share_parts``.
"""

from __future__ import annotations

import os
import resource
import time

PAGE = os.sysconf("SC_PAGE_SIZE")
WANTED = 256 * 2**20  # the 256 MiB ...
SMALLEST = 32 * 2**20  # ... halved while the machine is short of room, down to this


# --- how big a tensor this machine allows -------------------------------------------------------
def _meminfo(key: str) -> int:
    with open("/proc/meminfo") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(key + ":"))


def _cgroup_room() -> int | None:
    """Bytes left under this cgroup's memory.max (v2), if there is such a limit."""
    try:
        limit = open("/sys/fs/cgroup/memory.max").read().strip()
        used = int(open("/sys/fs/cgroup/memory.current").read())
    except OSError:
        return None
    return None if limit == "max" else int(limit) - used


def pick_size(wanted: int = WANTED, smallest: int = SMALLEST) -> tuple[int | None, str]:
    """(bytes, why): ``wanted`` halved until 3 copies fit in memory (two live at the peak, one
    spare) and 2 in /dev/shm; (None, the reason) if not even ``smallest`` fits."""
    st = os.statvfs("/dev/shm")
    shm_free = st.f_bavail * st.f_frsize
    room = [_meminfo("MemAvailable")] + [r for r in [_cgroup_room()] if r is not None]
    mem_free = min(room)
    size = wanted
    while size >= smallest:
        if 3 * size <= mem_free and 2 * size <= shm_free:
            return size, f"{size // 2**20} MiB ({mem_free // 2**20:,} MiB of memory and " \
                         f"{shm_free // 2**20:,} MiB of /dev/shm free)"
        size //= 2
    return None, (f"not enough room for even {smallest // 2**20} MiB: {mem_free // 2**20:,} MiB "
                  f"of memory and {shm_free // 2**20:,} MiB of /dev/shm free (3 and 2 copies "
                  "are needed)")


# --- what one process holds: private pages, shared pages, its peak -------------------------------
def _kb_fields(path: str, keys) -> dict:
    try:
        with open(path) as f:
            rows = [line.split() for line in f]
    except OSError:  # smaps_rollup: Linux >= 4.14
        return {}
    return {r[0][:-1]: int(r[1]) * 1024 for r in rows if r and r[0][:-1] in keys}


def memory(huge: bool = True) -> dict:
    """In bytes: RssAnon (private pages), RssShmem (tmpfs pages mapped and touched), VmRSS, VmHWM
    (the peak RSS since ``reset_peak``), and AnonHugePages (private memory in 2 MiB pages;
    ``huge=False`` skips it: smaps_rollup walks every mapping, too slow inside a timed part)."""
    found = _kb_fields("/proc/self/status", ("RssAnon", "RssShmem", "VmRSS", "VmHWM"))
    if huge:
        found.update(_kb_fields("/proc/self/smaps_rollup", ("AnonHugePages",)))
    return found


def reset_peak() -> bool:
    """Set VmHWM back to the current RSS (``echo 5 > /proc/self/clear_refs``, Linux >= 4.0)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def faults() -> int:
    """Minor page faults of this process so far (every thread)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def shmem_page() -> int:
    """The page a write fault maps into a /dev/shm mapping: 2 MiB where that tmpfs hands out
    huge pages to files (its ``huge=always`` or ``within_size`` mount option, or ``force`` in
    /sys/kernel/mm/transparent_hugepage/shmem_enabled), else the base page (4 KiB on x86)."""
    try:
        opts = next(line.split()[3] for line in open("/proc/mounts")
                    if line.split()[1] == "/dev/shm")
        forced = "[force]" in open("/sys/kernel/mm/transparent_hugepage/shmem_enabled").read()
    except (OSError, StopIteration):
        return PAGE
    huge = {"huge=always", "huge=within_size"} & set(opts.split(","))
    return 2 * 2**20 if huge or forced else PAGE


def allocated(fd: int) -> int:
    """Bytes of tmpfs pages a segment really has (st_blocks), not its nominal size."""
    return os.fstat(fd).st_blocks * 512


class Clock:
    """Laps of one measurement: ``lap(name)`` ends the part begun at the previous lap."""

    def __init__(self):
        self.parts: dict[str, dict] = {}
        self._t, self._f = time.perf_counter(), faults()

    def lap(self, name: str, **extra) -> None:
        t, f = time.perf_counter(), faults()
        self.parts[name] = {"s": t - self._t, "faults": f - self._f, **extra}
        self._t, self._f = t, f
