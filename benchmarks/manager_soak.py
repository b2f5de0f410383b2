"""Soak the shm manager with normal use and watch its memory and log stay bounded.

Normal use: a producer shares `--rate` file_system tensors a second (REGISTER), puts each on
a Queue to a consumer process, which attaches (REGISTER from a second member), reads it and
drops it (FREE); the producer drops its own after a short while (FREE). So each tensor is
the four events of the issue (registered twice, freed twice). Every `--every` seconds we
print the manager's resident memory (RSS), the size of its event log on disk (events.jsonl
plus the rotated events.jsonl.1), how many names it holds, and how far behind the rate we
are. A benchmark, not a timed test: it asserts nothing, it prints figures.

    python benchmarks/manager_soak.py [--minutes 10] [--rate 100] [--every 30]
                                      [--log-bytes 4194304]
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
import psutil

import shmlab
import shmlab.multiprocessing as smp
from shmlab.manager import client as mc


def consumer(queue, done) -> None:
    smp.set_sharing_strategy("file_system")
    got = 0
    while True:
        t = queue.get()
        if t is None:
            break
        got += int(t.numpy()[0] >= 0)  # touch the memory: it must still be there
        del t
    done.put(got)


def log_bytes(folder: str) -> int:
    total = 0
    for name in ("events.jsonl", "events.jsonl.1"):
        try:
            total += os.path.getsize(os.path.join(folder, name))
        except FileNotFoundError:
            pass
    return total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--rate", type=float, default=100.0, help="tensors a second")
    ap.add_argument("--every", type=float, default=30.0, help="seconds between reports")
    ap.add_argument("--log-bytes", type=int, default=None,
                    help="the manager's log cap (default: the manager's own default)")
    args = ap.parse_args()
    if args.log_bytes:
        os.environ["SHMLAB_MANAGER_LOG_BYTES"] = str(args.log_bytes)
    smp.set_sharing_strategy("file_system")
    ctx = smp.get_context("fork")
    queue, done = ctx.Queue(maxsize=1000), ctx.Queue()
    client = mc.get_client()  # starts the manager before the fork: both use this one
    proc = ctx.Process(target=consumer, args=(queue, done), daemon=True)
    proc.start()
    manager = psutil.Process(client.status(max_names=0)["pid"])
    folder = os.path.dirname(client.handle.decode())
    print(f"manager pid {manager.pid}, log in {folder}; {args.rate:g} tensors/s for "
          f"{args.minutes:g} min", flush=True)
    print(f"{'t_s':>6} {'sent':>8} {'behind':>7} {'rss_MiB':>8} {'log_KiB':>8} {'names':>6}",
          flush=True)
    start = time.monotonic()
    end, next_report, sent, recent = start + 60 * args.minutes, start, 0, []
    try:
        while (now := time.monotonic()) < end:
            if now >= next_report:
                rss = manager.memory_info().rss / 2**20
                names = client.status(max_names=0)["count"]
                behind = int((now - start) * args.rate) - sent
                print(f"{now - start:6.0f} {sent:8d} {behind:7d} {rss:8.1f} "
                      f"{log_bytes(folder) / 1024:8.0f} {names:6d}", flush=True)
                next_report += args.every
            t = shmlab.from_numpy(np.full(256, sent, dtype=np.float32))
            t.share_memory_()
            queue.put(t)
            recent.append(t)
            if len(recent) > 50:  # keep the last 50 a moment, like a pipeline would
                recent.pop(0)
            sent += 1
            time.sleep(max(0.0, start + sent / args.rate - time.monotonic()))
    finally:
        queue.put(None)
        received = done.get(timeout=60)
        proc.join(30)
        recent.clear()
        rss = manager.memory_info().rss / 2**20
        print(f"done: sent {sent}, received {received}, manager RSS {rss:.1f} MiB, "
              f"log {log_bytes(folder) / 1024:.0f} KiB", flush=True)
        mc.reset()  # BYE: the manager reclaims what is left and exits after its grace


if __name__ == "__main__":
    main()
