"""Benchmarks that compare shmlab with torch in one run: ``python -m shmlab.bench handoff``.

The handoff benchmark times a round trip parent -> child -> parent through two Queues for
sizes from 1 KiB to 128 MiB, for shmlab and torch under file_descriptor, both for a tensor
that is already in shared memory and for a fresh private tensor (whose first pickling moves
it into shared memory), and for a plain pickle copy of a numpy array. It prints medians and
the shmlab/torch ratio per size; ``--json`` prints the same table for machines.
"""

from __future__ import annotations

import argparse
import gc
import json
import multiprocessing
import random
import statistics
import sys
import time

import numpy as np

from ..demo.channels import echo
from ..demo.libs import load

SIZES = [1 << 10, 1 << 13, 1 << 16, 1 << 19, 1 << 22, 1 << 25, 1 << 27]  # 1 KiB .. 128 MiB


def _label(nbytes: int) -> str:
    return f"{nbytes >> 20} MiB" if nbytes >= 1 << 20 else f"{nbytes >> 10} KiB"


def _repeats(nbytes: int, scale: float) -> int:
    return max(5, int((31 if nbytes <= 1 << 19 else 11 if nbytes <= 1 << 25 else 7) * scale))


def _trip(item, inq, outq) -> float:
    """Seconds for one put(item) + get() of the echo."""
    start = time.perf_counter()
    inq.put(item)
    back = outq.get()
    elapsed = time.perf_counter() - start
    del back
    return elapsed


def _interleaved(makers: dict, inq, outq, repeats: int) -> dict[str, float]:
    """Median seconds per case, the cases taking turns in a shuffled order every repeat.

    Taking turns matters on a shared machine: load that comes and goes then hits every case
    alike, instead of whichever case happened to run during the busy minute.
    """
    times = {case: [] for case in makers}
    order = list(makers)
    rng = random.Random(0)
    for rep in range(repeats + 1):  # the first round warms caches and the resource sharers
        rng.shuffle(order)
        for case in order:
            item = makers[case]()
            gc.collect()
            elapsed = _trip(item, inq, outq)
            del item
            if rep:
                times[case].append(elapsed)
    return {case: statistics.median(t) for case, t in times.items()}


def handoff(sizes=SIZES, scale: float = 1.0) -> list[dict]:
    """Measure every case at every size; one row per size."""
    import torch  # noqa: F401 - registers torch's reducers in this process

    ctx = multiprocessing.get_context("fork")  # cheap children; CPU-only, so fork is safe
    inq, outq = ctx.Queue(), ctx.Queue()
    child = ctx.Process(target=echo, args=(inq, outq), daemon=True)
    child.start()
    rows = []
    try:
        for nbytes in sizes:
            data = np.random.default_rng(0).random(nbytes // 4, dtype=np.float32)
            makers = {"pickle_copy": lambda d=data: d.copy()}
            for lib in ("shmlab", "torch"):
                tlib, _ = load(lib)
                shared = tlib.from_numpy(data.copy()).share_memory_()
                makers[f"{lib}_shared"] = lambda s=shared: s
                makers[f"{lib}_fresh"] = lambda t=tlib, d=data: t.from_numpy(d.copy())
            medians = _interleaved(makers, inq, outq, _repeats(nbytes, scale))
            row = {"bytes": nbytes, "size": _label(nbytes)}
            row.update({f"{case}_ms": 1e3 * m for case, m in medians.items()})
            row["shared_ratio"] = row["shmlab_shared_ms"] / row["torch_shared_ms"]
            row["fresh_ratio"] = row["shmlab_fresh_ms"] / row["torch_fresh_ms"]
            rows.append(row)
            del makers, shared
    finally:
        inq.put(None)
        child.join(30)
        if child.is_alive():
            child.kill()
    return rows


def print_table(rows: list[dict]) -> None:
    head = ("size", "shmlab shared", "torch shared", "ratio", "shmlab fresh", "torch fresh",
            "ratio", "pickle copy")
    print("median round trip, ms (parent -> child -> parent, file_descriptor)")
    print("".join(f"{h:>14}" for h in head))
    for r in rows:
        cells = (r["size"], r["shmlab_shared_ms"], r["torch_shared_ms"], r["shared_ratio"],
                 r["shmlab_fresh_ms"], r["torch_fresh_ms"], r["fresh_ratio"],
                 r["pickle_copy_ms"])
        print("".join(f"{c:>14}" if isinstance(c, str) else f"{c:>14.3f}" for c in cells))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m shmlab.bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("which", choices=["handoff"])
    parser.add_argument("--json", action="store_true", help="print the table as JSON")
    parser.add_argument("--max-bytes", type=int, default=SIZES[-1],
                        help="largest size to measure (default 128 MiB)")
    parser.add_argument("--scale", type=float, default=1.0, help="multiply the repeat counts")
    args = parser.parse_args(argv)
    rows = handoff([s for s in SIZES if s <= args.max_bytes], args.scale)
    if args.json:
        json.dump(rows, sys.stdout, indent=1)
        print()
    else:
        print_table(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
