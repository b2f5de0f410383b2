"""How much a live Dashboard (4 refreshes/s, in-process) slows the handoff benchmark.

Runs ``shmlab.bench.handoff`` (sizes up to ``--max-bytes``, default 4 MiB) in this process,
alternately without and with a ``shmlab.widgets.Dashboard`` refreshing from its daemon thread,
``--rounds`` times each (A B A B ..., so drift in machine load hits both alike). Prints the
median wall time of a whole benchmark run each way and their ratio; the target is <= 1.05.
Also the median per-round-trip ratio over all cases, which is less sensitive to load spikes.

    python benchmarks/dashboard_overhead.py [--rounds 5] [--hz 4] [--max-bytes 4194304]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from shmlab import bench
from shmlab.widgets import Dashboard

CASES = ("shmlab_shared_ms", "torch_shared_ms", "shmlab_fresh_ms", "torch_fresh_ms",
         "pickle_copy_ms")


def one_run(sizes, scale, hz):
    """(wall seconds, rows, refreshes done) of one handoff run, with a dashboard if hz."""
    dash = Dashboard(hz=hz, autostart=False) if hz else None
    ticks = 0
    if dash is not None:
        dash.start()
        time.sleep(0.5)  # the first refreshes (imports, caches) are not part of the steady cost
        ticks = len(dash.fd.history)
    start = time.perf_counter()
    try:
        rows = bench.handoff(sizes, scale)
    finally:
        wall = time.perf_counter() - start
        if dash is not None:
            ticks = len(dash.fd.history) - ticks
            dash.close()
    return wall, rows, ticks


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--hz", type=float, default=4.0)
    parser.add_argument("--max-bytes", type=int, default=4 << 20)
    parser.add_argument("--scale", type=float, default=1.0, help="bench repeat multiplier")
    args = parser.parse_args(argv)
    sizes = [s for s in bench.SIZES if s <= args.max_bytes]
    one_run(sizes[:1], 0.2, 0)  # warm-up: imports, first fork, first manager-free shares
    walls = {"without": [], "with": []}
    trips = {"without": [], "with": []}
    rates = []
    for i in range(args.rounds):
        for label, hz in (("without", 0), ("with", args.hz))[:: 1 if i % 2 == 0 else -1]:
            wall, rows, ticks = one_run(sizes, args.scale, hz)
            walls[label].append(wall)
            trips[label].append({(r["bytes"], c): r[c] for r in rows for c in CASES})
            if hz:
                rates.append(ticks / wall)
            print(f"round {i + 1} {label:>7} dashboard: {wall:7.3f} s", flush=True)
    med = {k: statistics.median(v) for k, v in walls.items()}
    keys = trips["without"][0].keys()
    per_case = [statistics.median(t[k] for t in trips["with"])
                / statistics.median(t[k] for t in trips["without"]) for k in keys]
    print(f"\nhandoff sizes: {', '.join(bench._label(s) for s in sizes)}; rounds: {args.rounds}")
    print(f"median wall time without dashboard: {med['without']:.3f} s")
    print(f"median wall time with dashboard:    {med['with']:.3f} s "
          f"({statistics.median(rates):.2f} refreshes/s achieved, asked {args.hz:g})")
    print(f"ratio with/without (wall):          {med['with'] / med['without']:.3f}")
    print(f"median per-round-trip ratio:        {statistics.median(per_case):.3f} "
          f"over {len(per_case)} size x case medians")
    return 0


if __name__ == "__main__":
    sys.exit(main())
