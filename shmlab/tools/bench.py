"""Benchmarks that compare shmlab with torch in one run: ``python -m shmlab bench handoff``.

The handoff benchmark times a round trip parent -> child -> parent through two Queues for
sizes from 1 KiB to 128 MiB: for shmlab and torch, under both sharing strategies, for a
tensor already in shared memory ("shared") and for a fresh private one ("fresh", whose first
pickling moves it into shared memory), and for a plain pickle copy of a numpy array. Every
case of a size takes turns with every other in one shuffled loop, so the shmlab/torch ratios
compare trips taken at the same moments. It prints p50 and p90 per case and the p50 ratio;
``--json`` prints the rows for machines, ``--markdown`` as a table, ``--plot FILE`` draws
them (bench_plot.py). docs/benchmarks.md shows a run.
"""

from __future__ import annotations

import argparse
import gc
import json
import multiprocessing
import os
import platform
import random
import statistics
import sys
import time

import numpy as np

from ..harness.libs import load

SIZES = [1 << 10, 1 << 14, 1 << 18, 1 << 20, 1 << 22, 1 << 24, 1 << 27]  # 1 KiB .. 128 MiB
LIBS = ("shmlab", "torch")
STRATEGIES = ("file_descriptor", "file_system")
KINDS = ("shared", "fresh")
SHORT = {"file_descriptor": "fd", "file_system": "fs"}


def _label(nbytes: int) -> str:
    return f"{nbytes >> 20} MiB" if nbytes >= 1 << 20 else f"{nbytes >> 10} KiB"


def _repeats(nbytes: int, scale: float) -> int:
    return max(5, int((31 if nbytes <= 1 << 20 else 15 if nbytes <= 1 << 24 else 9) * scale))


def _set_strategy(strategy: str) -> None:
    """Both libraries read the strategy when they pickle, in whichever process sends."""
    for lib in LIBS:
        load(lib)[1].set_sharing_strategy(strategy)


def echo_in_strategy(inq, outq) -> None:
    """The far end: send back what arrives, under the strategy it came with, until None."""
    current = None
    while True:
        message = inq.get()
        if message is None:
            return
        if message[0] != current:
            current = message[0]
            _set_strategy(current)
        outq.put(message)
        del message  # hold nothing between round trips


def _trip(message, inq, outq) -> float:
    """Seconds for one put(message) + get() of the echo."""
    start = time.perf_counter()
    inq.put(message)
    back = outq.get()
    elapsed = time.perf_counter() - start
    del back
    return elapsed


def _makers(data: np.ndarray) -> dict:
    """case -> (strategy, make the item to send). Shared tensors are shared once, here."""
    makers = {"pickle copy": ("file_descriptor", lambda: data.copy())}
    for strategy in STRATEGIES:
        _set_strategy(strategy)
        for lib in LIBS:
            tlib, _ = load(lib)
            shared = tlib.from_numpy(data.copy()).share_memory_()
            makers[f"{lib} {SHORT[strategy]} shared"] = (strategy, lambda s=shared: s)
            makers[f"{lib} {SHORT[strategy]} fresh"] = (
                strategy, lambda t=tlib: t.from_numpy(data.copy()))
    return makers


def _interleaved(makers: dict, inq, outq, repeats: int) -> dict[str, list[float]]:
    """Seconds per trip for every case, the cases taking turns in a shuffled order.

    Taking turns matters on a shared machine: load that comes and goes then hits every case
    alike, instead of whichever case happened to run during the busy minute.
    """
    times = {case: [] for case in makers}
    order = list(makers)
    rng = random.Random(0)
    for rep in range(repeats + 1):  # the first round warms caches and the resource sharers
        rng.shuffle(order)
        for case in order:
            strategy, make = makers[case]
            _set_strategy(strategy)
            item = make()
            gc.collect()  # the previous trip's garbage is not this one's cost
            elapsed = _trip((strategy, item), inq, outq)
            del item
            if rep:
                times[case].append(elapsed)
    return times


def _p(values: list[float], q: int) -> float:
    """The q-th percentile (50, 90) in ms, by the 'inclusive' method (defined for n >= 2)."""
    return 1e3 * statistics.quantiles(values, n=100, method="inclusive")[q - 1]


def handoff(sizes=SIZES, scale: float = 1.0) -> list[dict]:
    """Measure every case at every size; one row per size: {case: {"p50", "p90"}, ratios}."""
    import torch  # noqa: F401 - registers torch's reducers in this process

    ctx = multiprocessing.get_context("fork")  # cheap children; CPU-only, so fork is safe
    inq, outq = ctx.Queue(), ctx.Queue()
    child = ctx.Process(target=echo_in_strategy, args=(inq, outq), daemon=True)
    child.start()
    rows = []
    # gc.collect() before each trip keeps the last trip's garbage out of the next one, but
    # with torch imported a full collection walks about a million objects, a long pause a trip.
    # freeze() parks everything alive now where collections do not look, so each collect
    # walks only what the trips made.
    gc.freeze()
    try:
        for nbytes in sizes:
            data = np.random.default_rng(0).random(nbytes // 4, dtype=np.float32)
            makers = _makers(data)
            times = _interleaved(makers, inq, outq, _repeats(nbytes, scale))
            row = {"bytes": nbytes, "size": _label(nbytes), "trips": len(times["pickle copy"])}
            row.update({case: {"p50": _p(t, 50), "p90": _p(t, 90)} for case, t in times.items()})
            for strategy in STRATEGIES:
                for kind in KINDS:
                    s, t = (row[f"{lib} {SHORT[strategy]} {kind}"]["p50"] for lib in LIBS)
                    row[f"ratio {SHORT[strategy]} {kind}"] = s / t
            rows.append(row)
            del makers
    finally:
        gc.unfreeze()
        inq.put(None)
        child.join(30)
        if child.is_alive():
            child.kill()
    return rows


def machine() -> dict:
    """What a reader needs to weigh the numbers: cores, load, kernel, Python, torch."""
    import torch

    return {"cores": os.cpu_count(), "load": [round(x, 2) for x in os.getloadavg()],
            "kernel": platform.release(), "python": platform.python_version(),
            "torch": torch.__version__, "numpy": np.__version__}


def table(rows: list[dict], markdown: bool = False) -> str:
    """One table: per size, both strategies x (shared, fresh), then the pickle copy."""
    head = ["size", "case", "shmlab p50", "shmlab p90", "torch p50", "torch p90", "ratio p50"]
    lines = []
    for r in rows:
        for strategy in STRATEGIES:
            for kind in KINDS:
                key = f"{SHORT[strategy]} {kind}"
                s, t = r[f"shmlab {key}"], r[f"torch {key}"]
                lines.append([r["size"], f"{strategy} {kind}", s["p50"], s["p90"], t["p50"],
                              t["p90"], r[f"ratio {key}"]])
        p = r["pickle copy"]
        lines.append([r["size"], "pickle copy (numpy)", p["p50"], p["p90"], "", "", ""])
    cell = (lambda c: c if isinstance(c, str) else f"{c:.3f}")
    if markdown:
        out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        return "\n".join(out + ["| " + " | ".join(map(cell, ln)) + " |" for ln in lines])
    widths = [8, 26] + [11] * 5
    fmt = (lambda cells: "".join(f"{cell(c):>{w}}" if i > 1 else f"{cell(c):<{w}}"
                                 for i, (c, w) in enumerate(zip(cells, widths, strict=True))))
    return "\n".join([fmt(head)] + [fmt(ln) for ln in lines])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m shmlab bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("which", choices=["handoff"])
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    parser.add_argument("--markdown", action="store_true", help="print a Markdown table")
    parser.add_argument("--plot", metavar="FILE", help="also draw the p50s, log-log, to FILE")
    parser.add_argument("--max-bytes", type=int, default=SIZES[-1],
                        help="largest size to measure (default 128 MiB)")
    parser.add_argument("--scale", type=float, default=1.0, help="multiply the repeat counts")
    args = parser.parse_args(argv)
    before = machine()
    rows = handoff([s for s in SIZES if s <= args.max_bytes], args.scale)
    about = {**before, "load_after": machine()["load"]}
    if args.json:
        json.dump({"machine": about, "rows": rows}, sys.stdout, indent=1)
        print()
    else:
        print(f"round trip parent -> child -> parent through mp.Queue, ms; ratio = shmlab/torch"
              f" p50, one interleaved run. machine: {about}")
        print(table(rows, args.markdown))
    if args.plot:
        from .bench_plot import plot

        plot(rows, args.plot, about)
        print(f"plot written to {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
