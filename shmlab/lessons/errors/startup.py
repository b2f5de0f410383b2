"""Start-up errors, reproduced: spawn without a ``__main__`` guard, a ``__main__`` function
under spawn, a rank SIGKILLed under torch.multiprocessing.spawn, and CUDA in a forked child.
"""

from __future__ import annotations

import os
import signal

import torch
import torch.multiprocessing as torch_mp

from .run import Outcome, in_child, run_python

# A script as people first write it: module-level code starts the process.
UNGUARDED = """\
import multiprocessing as mp

def work():
    print("worker ran")

ctx = mp.get_context("spawn")
p = ctx.Process(target=work)
p.start()
p.join()
print("exit code", p.exitcode)
"""

# The fix: only the real __main__ starts processes; spawn's re-import (as __mp_main__) skips it.
GUARDED = UNGUARDED.split("ctx =")[0] + 'if __name__ == "__main__":\n' + "".join(
    "    " + line + "\n" for line in ("ctx =" + UNGUARDED.split("ctx =")[1]).splitlines())


def no_main_guard(guard: bool) -> Outcome:
    """Run the spawn script above as ``python main.py``, with or without the guard."""
    return run_python(GUARDED if guard else UNGUARDED)


# An interactive __main__ (stdin, like a notebook kernel's) defines f; spawn must import f by
# name in a fresh interpreter whose __main__ has no f.
MAIN_FUNCTION = """\
import multiprocessing as mp
{define}
if __name__ == "__main__":
    p = mp.get_context("spawn").Process(target=f, args=(21,))
    p.start()
    p.join()
    print("exit code", p.exitcode)
"""
WORK_MODULE = "def f(x):\n    print('f says', 2 * x)\n"


def main_function_under_spawn(in_module: bool) -> Outcome:
    """f defined in ``__main__`` (the error), or imported from a module file (the fix)."""
    define = "from work import f" if in_module else WORK_MODULE
    return run_python(MAIN_FUNCTION.format(define=define), name="-c",
                      files={"work.py": WORK_MODULE})


# --- torch.multiprocessing.spawn: a rank that dies ----------------------------------------------
def rank_main(rank: int, batch: int, budget: int) -> None:
    """A rank that needs ``batch`` units of memory; past ``budget`` it is SIGKILLed, as the
    kernel's OOM killer does (no Python exception, no traceback: the process just ends)."""
    if batch > budget:
        os.kill(os.getpid(), signal.SIGKILL)
    if batch < 0:
        raise ValueError(f"rank {rank}: batch must be >= 0, not {batch}")


def start_ranks(batch: int, budget: int = 64, nprocs: int = 2) -> str:
    """torch.multiprocessing.start_processes(rank_main, ...): what mp.spawn calls, with fork
    here so each rank starts in milliseconds (mp.spawn passes start_method='spawn')."""
    torch_mp.start_processes(rank_main, args=(batch, budget), nprocs=nprocs,
                             start_method="fork")
    return f"{nprocs} ranks finished with batch {batch}"


# --- CUDA in a forked child ---------------------------------------------------------------------
def _cuda_in_fork_child(conn) -> None:
    try:
        torch.zeros(1, device="cuda")
        conn.send(("", "CUDA works in this child"))
    except BaseException as exc:  # noqa: BLE001 - sent back to the parent
        conn.send((type(exc).__name__, str(exc)))


def cuda_in_child(method: str) -> str:
    """With a GPU: initialise CUDA here, then use it in a ``method`` child (fork fails)."""
    torch.zeros(1, device="cuda")  # the parent has a CUDA context now
    ctx = torch_mp.get_context(method)
    recv, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_cuda_in_fork_child, args=(send,))
    proc.start()
    error, text = recv.recv()
    proc.join()
    if error:
        raise RuntimeError(text)
    return f"{text} ({method})"


def bad_fork_check(forked_after_cuda: bool) -> str:
    """Without a GPU: run torch's own check, torch.cuda._lazy_init(), in this (forked) child
    with its "CUDA was initialised before the fork" flag as a real fork after CUDA sets it."""
    if forked_after_cuda:  # what torch's fork handler records in a child of a CUDA parent
        torch.cuda._is_in_bad_fork = lambda: True
    flag = torch.cuda._is_in_bad_fork()
    try:
        torch.cuda.init()
    except AssertionError as exc:  # a CPU build stops at the next check: no CUDA compiled in
        return f"_is_in_bad_fork() = {flag}; the fork check passed ({exc})"
    return f"_is_in_bad_fork() = {flag}; CUDA initialised"


def cuda_fork(fixed: bool) -> tuple[Outcome, str | None]:
    """The CUDA-after-fork error (real with a GPU; torch's own check otherwise), and the skip
    reason when there is no GPU."""
    if torch.cuda.is_available():
        return in_child(cuda_in_child, "spawn" if fixed else "fork", timeout=120), None
    reason = ("no CUDA device here: torch's own check (torch.cuda._lazy_init) runs with the "
              "bad-fork flag a fork after CUDA initialisation sets")
    return in_child(bad_fork_check, not fixed), reason
