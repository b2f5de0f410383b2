"""How much a live Dashboard (4 refreshes/s) slows the handoff benchmark running beside it.

Runs ``shmlab.tools.bench.handoff`` (sizes up to ``--max-bytes``, default 1 MiB) in this process,
``--rounds`` times in each of three modes, taking turns (the order rotates every round, so
drift in machine load hits every mode alike):

  without     no dashboard;
  helper      a Dashboard whose refresh thread asks the probe helper process (the default,
              widgets/_helper.py, Note [Probing off the timed path]);
  in-process  a Dashboard probing on its own refresh thread, in this process (as before).

Prints, per mode, the median wall time of a whole run and the per-trip p50 overhead: for
every size x case, the p50 of its round trips in that mode over the p50 without, then the
median of those ratios. The target is a per-trip p50 ratio <= 1.05 for ``helper``.

    python benchmarks/dashboard_overhead.py [--rounds 3] [--hz 4] [--max-bytes 1048576]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

from shmlab.tools import bench
from shmlab.widgets import Dashboard

MODES = {"without": None, "helper": True, "in-process": False}


def one_run(sizes, scale, hz, helper):
    """(wall seconds, rows, refreshes/s) of one handoff run; a dashboard unless helper is None."""
    dash = None
    if helper is not None:
        dash = Dashboard(hz=hz, autostart=False)
        dash.poller.helper = helper
        dash.start()
        time.sleep(1.5)  # the helper's start and the first refreshes are not the steady cost
    ticks = len(dash.fd.history) if dash else 0
    start = time.perf_counter()
    try:
        rows = bench.handoff(sizes, scale)
    finally:
        wall = time.perf_counter() - start
        if dash is not None:
            ticks = len(dash.fd.history) - ticks
            errors = list(dash.fd.errors)
            dash.close()
            if errors:
                print("  dashboard errors:", errors[-3:])
    return wall, rows, ticks / wall


def _p50s(rows) -> dict:
    """(size, case) -> p50 ms of that run."""
    return {(r["bytes"], case): v["p50"] for r in rows for case, v in r.items()
            if isinstance(v, dict)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--hz", type=float, default=4.0)
    parser.add_argument("--max-bytes", type=int, default=1 << 20)
    parser.add_argument("--scale", type=float, default=1.0, help="bench repeat multiplier")
    args = parser.parse_args(argv)
    sizes = [s for s in bench.SIZES if s <= args.max_bytes]
    print(f"load before: {os.getloadavg()}", flush=True)
    one_run(sizes[:1], 0.2, args.hz, None)  # warm-up: imports, first fork, first managers
    walls = {m: [] for m in MODES}
    p50s = {m: [] for m in MODES}
    rates = {m: [] for m in MODES}
    names = list(MODES)
    for i in range(args.rounds):
        for mode in names[i % 3:] + names[:i % 3]:
            wall, rows, rate = one_run(sizes, args.scale, args.hz, MODES[mode])
            walls[mode].append(wall)
            p50s[mode].append(_p50s(rows))
            rates[mode].append(rate)
            print(f"round {i + 1} {mode:>10}: {wall:7.3f} s, {rate:.2f} refreshes/s", flush=True)
    keys = p50s["without"][0].keys()
    base = {k: statistics.median(run[k] for run in p50s["without"]) for k in keys}
    print(f"\nhandoff sizes: {', '.join(bench._label(s) for s in sizes)}; rounds: {args.rounds};"
          f" dashboard at {args.hz:g} Hz; load after: {os.getloadavg()}")
    print(f"{'mode':>10} {'wall s':>8} {'wall ratio':>10} {'per-trip p50 ratio':>19} "
          f"{'refreshes/s':>12}")
    for mode in MODES:
        ratios = [statistics.median(run[k] for run in p50s[mode]) / base[k] for k in keys]
        print(f"{mode:>10} {statistics.median(walls[mode]):8.3f} "
              f"{statistics.median(walls[mode]) / statistics.median(walls['without']):10.3f} "
              f"{statistics.median(ratios):19.3f} {statistics.median(rates[mode]):12.2f}")
    print(f"(per-trip p50 ratio: median over {len(keys)} size x case p50s, each the median of "
          "the rounds' p50s in that mode over the same without)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
