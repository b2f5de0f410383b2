"""``python -m shmlab trace``: trace a command's tensor handoffs, print the table and diagram.

    python -m shmlab trace [--json FILE] [--mermaid FILE] [--no-syscalls] -- python my_script.py
    python -m shmlab trace --bench [--runs N] [--lib torch|shmlab] [--method fork|spawn]

The command runs under ``strace -f`` (unless ``--no-syscalls``, or strace is missing: then
the limits say so) with the trace directory first on ``PYTHONPATH``, so its interpreter and
every Python child record their hops (Note [Recording in a new interpreter] in
``shmlab.trace.session``). ``--bench`` measures what tracing one 1 MiB handoff costs: the
median of N runs of a new child (started by ``--method``) receiving one tensor, traced and not.

Mirrors: nothing in torch.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

from ..messages import tr as tr_  # `tr` names the Trace, as in session.py
from . import strace as _strace
from .model import StraceUnavailable, Trace
from .render import summary, table
from .session import ALWAYS, Collector, child_environ, fill, trace, write_sitecustomize


def run_command(argv: list[str], syscalls: bool = True) -> tuple[Trace, int]:
    """Run ``argv`` traced; (the trace, the command's exit status)."""
    tr = Trace(limits=[tr_(line) for line in ALWAYS])
    directory = tempfile.mkdtemp(prefix="shmlab-trace-")
    try:
        write_sitecustomize(directory)
        env = child_environ(directory, os.environ)
        log = os.path.join(directory, "strace.log")
        proc = None
        if syscalls:
            try:
                proc = _strace.run(argv, log, env)
            except StraceUnavailable as exc:
                tr.limits.insert(0, tr_("strace not attached: {reason}", reason=exc))
        if proc is None:
            log = None
            import subprocess
            proc = subprocess.Popen(argv, env=env)
        rc = proc.wait()
        main = _first_pid(log) if log else proc.pid
        fill(tr, Collector(directory, main, log), log is not None)
        return tr, rc
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def _first_pid(log: str) -> int | None:
    try:
        with open(log) as f:
            return int(f.readline().split(" ", 1)[0])
    except (OSError, ValueError):
        return None


def _receive(q, done):
    t = q.get()
    del t
    done.put(1)


def bench(runs: int, lib: str, method: str = "fork") -> dict:
    """Median seconds of one 1 MiB handoff to a new child (its start included), without
    tracing, with the Python-level recorder alone, and with strace too."""
    import multiprocessing
    if lib == "torch":
        import torch
        make = lambda: torch.ones(256 * 1024)  # noqa: E731
        import torch.multiprocessing  # noqa: F401  (registers torch's reducers)
    else:
        import numpy as np

        import shmlab
        import shmlab.multiprocessing  # noqa: F401  (registers shmlab's reducers)
        make = lambda: shmlab.from_numpy(np.ones(256 * 1024, dtype=np.float32))  # noqa: E731
    ctx = multiprocessing.get_context(method)

    def once(traced: str | None) -> float:
        t = make()
        start = time.perf_counter()
        if traced is None:
            _handoff(ctx, t)
        else:
            with trace(syscalls=traced == "strace"):
                _handoff(ctx, t)
        return time.perf_counter() - start

    out = {}
    for mode in (None, "python", "strace"):
        times = [once(mode) for _ in range(runs)]
        out[mode or "untraced"] = statistics.median(times)
    return out


def _handoff(ctx, t) -> None:
    q, done = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=_receive, args=(q, done))
    p.start()
    q.put(t)
    done.get()
    p.join()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    command = []
    if "--" in argv:
        at = argv.index("--")
        argv, command = argv[:at], argv[at + 1:]
    parser = argparse.ArgumentParser(prog="python -m shmlab trace", description=__doc__.split(
        "\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", metavar="FILE", help="write the trace as JSON")
    parser.add_argument("--mermaid", metavar="FILE", help="write the sequence diagram")
    parser.add_argument("--no-syscalls", action="store_true", help="Python-level hops only")
    parser.add_argument("--bench", action="store_true",
                        help="measure the tracer's cost on one 1 MiB handoff")
    parser.add_argument("--runs", type=int, default=5, help="runs per mode for --bench")
    parser.add_argument("--lib", choices=("torch", "shmlab"), default="torch")
    parser.add_argument("--method", choices=("fork", "spawn", "forkserver"), default="fork")
    args = parser.parse_args(argv)
    if args.bench:
        result = bench(args.runs, args.lib, args.method)
        for mode, seconds in result.items():
            print(f"{args.lib} 1 MiB handoff ({args.method} child), {mode:9}: median "
                  f"{seconds:.3f} s of {args.runs}")
        return 0
    if not command:
        parser.error("give the command to trace after --, e.g. -- python my_script.py")
    if shutil.which(command[0]) is None and not os.path.exists(command[0]):
        parser.error(f"no such command: {command[0]}")
    tr, rc = run_command(command, syscalls=not args.no_syscalls)
    print(table(tr))
    print()
    print(tr.to_mermaid())
    print(summary(tr))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            f.write(tr.to_json())
    if args.mermaid:
        with open(args.mermaid, "w", encoding="utf-8") as f:
            f.write(tr.to_mermaid())
    return rc
