"""Reproduce a fork while a Queue's feeder thread makes the first file_system share.

    python tests/core/fork_race.py --lib shmlab --runs 20 [--switch 1e-5] [--cold] [--wait 5]

Each run is a fresh interpreter (a *trial*) that does what upstream's ``test_fs_sharing`` /
``test_fill`` does: warm the file_descriptor path (pickle and unpickle one tensor; skipped
with --cold), ``set_sharing_strategy("file_system")``, ``q.put([x, x[:, 1]])`` and at once
start a fork child that does ``q.get()[0][:] = 4`` and sets an event. ``put`` returns before
pickling (the feeder thread pickles), so the fork overlaps the process's first file_system
share. A trial *hangs* when the event is not set within --wait seconds; it then prints what
the two processes were doing (Python stacks via faulthandler, the pipes the child inherited
that the parent still has open) and kills the child. The summary counts hangs per cause.

Used by tests/core/test_fork_race.py (the regression test) and runnable by hand for torch side by
side (``--lib torch``).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

HANG_RC = 3


def fill(q, e):
    data = q.get()
    data[0][:] = 4
    e.set()


def _pipes(pid: int) -> dict[str, list[int]]:
    """pipe:[inode] -> the fds of `pid` that hold it."""
    found: dict[str, list[int]] = {}
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("pipe:"):
            found.setdefault(target, []).append(int(fd))
    return found


def _diagnose(child_pid: int) -> None:
    import faulthandler
    import signal

    mine, theirs = _pipes(os.getpid()), _pipes(child_pid)
    shared = sorted(set(mine) & set(theirs))
    print(f"HANG child {child_pid}; pipes the child shares with the parent: "
          + ", ".join(f"{p} parent fds {mine[p]} child fds {theirs[p]}" for p in shared),
          file=sys.stderr, flush=True)
    print("--- child stack", file=sys.stderr, flush=True)
    os.kill(child_pid, signal.SIGUSR1)  # faulthandler, registered before the fork
    time.sleep(0.5)
    print("--- parent stacks", file=sys.stderr, flush=True)
    faulthandler.dump_traceback(all_threads=True)
    print("--- end", file=sys.stderr, flush=True)


def trial(lib: str, warm: bool, wait_s: float, strategy: str = "file_system") -> int:
    """One attempt in this (fresh) interpreter: 0 = the child filled the tensor, 3 = hang."""
    import faulthandler
    import signal

    faulthandler.register(signal.SIGUSR1, all_threads=True)
    if lib == "torch":
        import torch
        import torch.multiprocessing as mp

        zeros = torch.zeros
    else:
        import shmlab
        import shmlab.multiprocessing as mp

        zeros = shmlab.zeros
    from multiprocessing.reduction import ForkingPickler

    ctx = mp.get_context("fork")
    if warm:  # the file_descriptor path: resource_sharer, DupFd, the reducers' first use
        import pickle

        pickle.loads(ForkingPickler.dumps(zeros(3)))
    mp.set_sharing_strategy(strategy)
    q, e = ctx.Queue(), ctx.Event()
    x = zeros(5, 5)
    data = [x, x[:, 1]]
    q.put(data)  # the feeder thread pickles: the first file_system share starts now
    p = ctx.Process(target=fill, args=(q, e), daemon=True)
    p.start()  # ... and the main thread forks meanwhile
    if e.wait(wait_s):
        p.join(30)
        good = bool((data[0].numpy() == 4).all() and (data[1].numpy() == 4).all())
        return 0 if good and p.exitcode == 0 else 1
    _diagnose(p.pid)
    p.kill()
    p.join()
    time.sleep(0.5)  # let the feeder finish (or fail) now that the child is gone: its error shows
    q.cancel_join_thread()
    return HANG_RC


def classify(stderr: str) -> str:
    """Name the cause of a hang from a trial's diagnostics."""
    child = stderr.partition("--- child stack")[2].partition("--- parent stacks")[0]
    parent = stderr.partition("--- parent stacks")[2]
    if "_execute_child" in parent:
        return "feeder blocked in Popen (child holds its pipe)"
    if "_read_handshake" in parent:
        return "feeder blocked reading the handshake"
    if "importlib._bootstrap" in child:
        return "child blocked on an import lock"
    return "other"


def run_trials(lib: str, runs: int, switch: float | None, warm: bool, wait_s: float,
               verbose: bool = False, strategy: str = "file_system") -> dict:
    """Run `runs` fresh-interpreter trials; return {"runs", "hangs", "causes", "errors", ...}."""
    causes: dict[str, int] = {}
    hangs = errors = 0
    samples = []
    here = os.path.dirname(os.path.abspath(__file__))
    code = (f"import sys; sys.path.insert(0, {here!r}); "
            + (f"sys.setswitchinterval({switch!r}); " if switch else "")
            + f"import fork_race; sys.exit(fork_race.trial({lib!r}, {warm!r}, {wait_s!r}, "
            f"{strategy!r}))")
    for _ in range(runs):
        try:
            proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                  timeout=wait_s + 60)
            rc, err = proc.returncode, proc.stderr
        except subprocess.TimeoutExpired as exc:  # even the diagnosis hung
            rc, err = HANG_RC, (exc.stderr or b"").decode(errors="replace") + "\n(trial timeout)"
        if rc == HANG_RC:
            hangs += 1
            cause = classify(err)
            causes[cause] = causes.get(cause, 0) + 1
            if len(samples) < 2:
                samples.append(err)
        elif rc != 0:
            errors += 1
            samples.append(err)
        if verbose:
            print(".H"[rc == HANG_RC] if rc in (0, HANG_RC) else "E", end="", flush=True)
    if verbose:
        print()
    return {"lib": lib, "runs": runs, "hangs": hangs, "errors": errors, "causes": causes,
            "samples": samples}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lib", choices=["shmlab", "torch"], default="shmlab")
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--switch", type=float, default=None, help="sys.setswitchinterval")
    ap.add_argument("--cold", action="store_true", help="skip the file_descriptor warm-up")
    ap.add_argument("--wait", type=float, default=5.0, help="seconds before a trial is a hang")
    ap.add_argument("--strategy", default="file_system", help="the sharing strategy to race")
    ap.add_argument("--show", action="store_true", help="print the first hangs' diagnostics")
    args = ap.parse_args(argv)
    result = run_trials(args.lib, args.runs, args.switch, not args.cold, args.wait, True,
                        args.strategy)
    print(f"{args.lib}: {result['hangs']}/{result['runs']} hung, {result['errors']} errors "
          f"({args.strategy}, switchinterval={args.switch}, {'cold' if args.cold else 'warm'}); "
          f"causes: {result['causes']}")
    if args.show:
        for sample in result["samples"]:
            print(sample)
    return 0


if __name__ == "__main__":
    sys.exit(main())
