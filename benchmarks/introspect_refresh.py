"""Time one full shmlab.introspect.snapshot() with 10, 100 and 1,000 open shared-memory fds.

The watched family is this process and one forked child; each holds half of the fds, opened
the way torch's file_descriptor strategy leaves them (shm_open + unlink: the link reads
"/dev/shm/.../shmlab_... (deleted)"). Twenty named 4 KiB segments with a refcount header sit
beside them, so the segment probe has headers to read. All of it lives in a private folder on
the /dev/shm tmpfs (same costs), so leak checkers of test runs going on meanwhile never see it.
Prints the median and 90th percentile of a refresh and of each probe alone, plus psutil's own
calls for comparison.

    python benchmarks/introspect_refresh.py [--repeat 200]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import shutil
import statistics
import tempfile
import time

import psutil

from shmlab import introspect

SIZES = (10, 100, 1000)
NAMED = 20


def open_unlinked(folder: str, count: int, tag: str) -> list[int]:
    fds = []
    for i in range(count):
        path = f"{folder}/shmlab_{os.getpid()}_{tag}_{i}"
        fds.append(os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600))
        os.unlink(path)  # like torch's fd strategy: only the fd keeps the memory alive
    return fds


def hold(folder: str, count: int, ready, done) -> None:
    """Child: hold ``count`` unlinked shm fds until the parent has finished timing."""
    fds = open_unlinked(folder, count, "c")
    ready.set()
    done.wait(120)
    for fd in fds:
        os.close(fd)


def timed(fn, repeat: int) -> tuple[float, float, float]:
    """Median and p90 wall ms, and median CPU ms: on a busy machine the wall time includes
    waiting for a CPU, while the CPU time (ours, kernel included) is what an idle one sees."""
    wall, cpu = [], []
    for _ in range(repeat):
        start, start_cpu = time.perf_counter(), time.process_time()
        fn()
        wall.append((time.perf_counter() - start) * 1e3)
        cpu.append((time.process_time() - start_cpu) * 1e3)
    wall.sort()
    return statistics.median(wall), wall[int(len(wall) * 0.9)], statistics.median(cpu)


def make_named(folder: str) -> None:
    for i in range(NAMED):
        with open(f"{folder}/shmlab_{os.getpid()}_bench_{i}", "wb") as f:
            f.write((1).to_bytes(4, "little") + bytes(4096 + 60))  # refcount 1 | pad | data


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=200)
    repeat = parser.parse_args().repeat
    ctx = mp.get_context("fork")
    folder = tempfile.mkdtemp(prefix="introspect-bench-", dir=introspect.SHM_DIR)
    make_named(folder)
    load = os.getloadavg()[0]
    print(f"{len(psutil.pids())} processes, {os.cpu_count()} CPUs, load {load:.1f}, "
          f"{NAMED} named segments; {repeat} runs ({repeat // 4} for psutil's)")
    print("each cell: wall median / wall p90 / CPU median, in ms")
    probes = {
        "snapshot()": lambda: introspect.snapshot(shm_dir=folder),
        "fd_counts x2": lambda: [introspect.fd_counts(p) for p in family],
        "process_family": lambda: introspect.process_family(),
        "shm_segments": lambda: introspect.shm_segments(folder),
        "managers": lambda: introspect.managers(),
        "limits": lambda: introspect.limits(),
        "psutil open_files x2": lambda: [psutil.Process(p).open_files() for p in family],
        "psutil children": lambda: psutil.Process().children(recursive=True),
    }
    print(f"{'probe':22}" + "".join(f"{f'{n} fds':>24}" for n in SIZES))
    rows: dict[str, list[str]] = {name: [] for name in probes}
    try:
        for n in SIZES:
            ready, done = ctx.Event(), ctx.Event()
            child = ctx.Process(target=hold, args=(folder, n - n // 2, ready, done), daemon=True)
            child.start()
            mine = open_unlinked(folder, n // 2, "p")
            try:
                ready.wait(30)
                family = introspect.process_family()
                counts = introspect.snapshot().fds
                held = sum(c["shm-deleted"] for c in counts.values())
                assert held == n, f"expected {n} shm fds in the family, saw {held}"
                for name, fn in probes.items():
                    median, p90, cpu = timed(fn, repeat if "psutil" not in name else repeat // 4)
                    rows[name].append(f"{median:6.2f} / {p90:6.2f} / {cpu:6.2f}")
            finally:
                for fd in mine:
                    os.close(fd)
                done.set()
                child.join(10)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    for name, cells in rows.items():
        print(f"{name:22}" + "".join(f"{c:>24}" for c in cells))


if __name__ == "__main__":
    main()
