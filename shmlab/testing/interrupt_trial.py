"""Ctrl-C at random points of share, attach and put: is the client still in step, is anything lost?

Mirrors: nothing in torch; it checks that a KeyboardInterrupt cannot split a request to the
shm manager (client.py, Note [A request Ctrl-C cannot split]), torch side by side.

    run_interrupt_trials(lib, trials, seed) -> {"trials", "out_of_step", "lost", "leaked", ...}
    python -m shmlab stress interrupt --trials 500 [--lib shmlab|torch|both] [--seed 0]

One *worker* process (spawned) shares, attaches and puts file_system tensors in a loop, as
fast as it can; every share of a fresh tensor is a REGISTER exchange with the manager, every
attach a register too (shmlab: one REGISTER posted per fresh connection, no reply awaited;
torch: a full exchange on every attach), every put a share in the Queue's feeder thread.
The driver sends it SIGINT after a random delay. The KeyboardInterrupt lands wherever
the main thread is; the worker catches it, then checks itself:
  * in step: two shares of fresh tensors, each within the manager's reply timeout
    (a client out of step times out, or raises);
  * nothing lost: it puts a tensor filled with a new id; a *receiver* process takes every
    message and reports each id as it arrives; the driver waits for that one (10 s).
Then it tells the driver, which waits a random delay and interrupts it again: one worker
serves every trial, unless it is stuck (no answer, or a message that never comes): then it
is counted, its threads' stacks say where it hung (`stuck_in`), and a fresh worker goes on
with the trials left. At the end the worker lets go of everything; files of its own still in
/dev/shm then are `stray` (a count the interrupt left behind: the manager reclaims them when
the family exits), and files still there after the family and its manager are gone are
`leaked`. `swallowed` counts interrupts raised inside a finalizer (a storage collected in the
loop): Python prints those as "Exception ignored" and goes on, so that Ctrl-C did nothing.
"""

from __future__ import annotations

import contextlib
import faulthandler
import gc
import glob
import os
import random
import signal
import tempfile
import time
from multiprocessing.connection import wait

from ..introspect import SHM_DIR

REPLY_TIMEOUT_S = 1.0  # the manager's reply timeout, shmlab's and torch's
OPS = ("share", "attach", "put")


def _lib(lib: str):
    if lib == "torch":
        import torch
        import torch.multiprocessing as tmp

        return tmp, (lambda v: torch.full((256,), float(v))), torch.UntypedStorage
    import shmlab
    import shmlab.multiprocessing as smp

    return smp, (lambda v: shmlab.zeros(256).fill_(float(v))), shmlab.UntypedStorage


def _value(t) -> float:
    return float(t[0].item()) if hasattr(t[0], "item") else float(t.numpy()[0])


def _receiver(lib: str, q, out) -> None:
    mp, _, _ = _lib(lib)
    mp.set_sharing_strategy("file_system")
    while True:
        item = q.get()
        if item is None:
            break
        ident, t = item
        out.send((ident, _value(t) == ident))  # as it arrives: the driver waits for it
        del t, item
    out.send("done")


class _Armed:
    """SIGINT raises KeyboardInterrupt only while armed, and disarms: one per trial.

    A KeyboardInterrupt raised inside a finalizer (a storage collected mid-loop) is printed
    as "Exception ignored" and swallowed, by torch's storages and ours alike; the loop then
    sees the handler disarmed and ends the trial by itself. And the check after a trial can
    never be interrupted by a late second signal."""

    def __init__(self):
        self.on = False
        signal.signal(signal.SIGINT, self)

    def __call__(self, signum, frame):
        if self.on:
            self.on = False
            raise KeyboardInterrupt


def _worker(lib: str, q, ctl, seed: int, ops: tuple[str, ...], stacks: str) -> None:
    # A stuck worker shows where: its threads' stacks, into a file the driver reads.
    faulthandler.register(signal.SIGUSR1, file=open(stacks, "w"), all_threads=True)  # noqa: SIM115
    mp, make, storage_cls = _lib(lib)
    armed = _Armed()
    mp.set_sharing_strategy("file_system")
    rng = random.Random(seed)
    held: list = []  # a few shared tensors stay alive, so attaches and frees have targets
    next_id = 0
    make(0).share_memory_()  # the manager is started before the first trial
    ctl.send("ready")
    while True:
        where = "?"
        try:
            armed.on = True
            ctl.send("go")  # the driver interrupts us from now on
            while armed.on:
                where = rng.choice(ops)
                if where == "share":
                    t = make(1).share_memory_()
                    held.append(t)
                elif where == "attach" and held:
                    manager, name, size = held[-1].untyped_storage()._share_filename_cpu_()
                    other = storage_cls._new_shared_filename_cpu(manager, name, size)
                    del other  # its own mapping: +1, then -1 when collected
                elif where == "put":
                    next_id += 1
                    q.put((-next_id, make(-next_id)))  # interrupted puts: ids < 0, not checked
                if len(held) > 4:
                    del held[0]
            where = f"{where} (swallowed)"  # raised in a finalizer: see _Armed
        except KeyboardInterrupt:
            armed.on = False
        cmd = ctl.recv()  # "check" (or "stop")
        if cmd == "stop":
            break
        rec = {"where": where, "in_step": True, "error": None}
        try:
            for _ in range(2):
                start = time.monotonic()
                held.append(make(1).share_memory_())
                if time.monotonic() - start > REPLY_TIMEOUT_S:
                    rec["in_step"], rec["error"] = False, "share took longer than the timeout"
            next_id += 1
            q.put((next_id, make(next_id)))  # must arrive
            rec["put"] = next_id
        except Exception as exc:  # noqa: BLE001 - the finding itself
            rec["in_step"], rec["error"] = False, f"{type(exc).__name__}: {exc}"
        ctl.send(rec)
    held.clear()
    q.put(None)
    q.close()
    q.join_thread()
    ctl.send("done")
    ctl.recv()  # the receiver has let go of everything too: count what is left
    gc.collect()
    ctl.send(len(glob.glob(f"{SHM_DIR}{lib}_{os.getpid()}_*")))


def run_interrupt_trials(lib: str, trials: int, seed: int = 0, max_delay_s: float = 0.01,
                         deadline_s: float = 8.0, ops: tuple[str, ...] = OPS) -> dict:
    """`trials` interrupts; returns the counts (see the module docstring).

    A worker that stops answering (stuck: its main thread or its feeder thread hangs) is
    counted, killed and replaced by a fresh one, which goes on with the trials left;
    `stuck_in` says where its stacks were (see STUCK_IN). `ops`: what the loop does."""
    rec = {"lib": lib, "trials": 0, "out_of_step": 0, "lost": 0, "bad_data": 0, "stray": 0,
           "leaked": 0, "stuck": 0, "swallowed": 0, "workers": 0, "errors": [], "where": {},
           "stuck_in": {}}
    start = time.monotonic()
    while rec["trials"] < trials and rec["workers"] < 1 + trials // 50:
        rec["workers"] += 1
        _session(lib, trials - rec["trials"], seed + rec["workers"], max_delay_s, deadline_s,
                 ops, rec)
    rec["wall_s"] = round(time.monotonic() - start, 2)
    return rec


def _session(lib: str, trials: int, seed: int, max_delay_s: float, deadline_s: float,
             ops: tuple[str, ...], rec: dict) -> None:
    """One worker and one receiver, interrupted up to `trials` times; adds to `rec`."""
    mp, _, _ = _lib(lib)
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    ctl, ctl_child = ctx.Pipe()
    out, out_child = ctx.Pipe()
    stacks = tempfile.NamedTemporaryFile(prefix="shmlab-interrupt-", suffix=".txt")  # noqa: SIM115
    worker = ctx.Process(target=_worker, args=(lib, q, ctl_child, seed, ops, stacks.name),
                         daemon=True)
    receiver = ctx.Process(target=_receiver, args=(lib, q, out_child), daemon=True)
    rng = random.Random(seed)
    receiver.start()
    worker.start()
    try:
        _expect(ctl, "ready", 120)  # a cold start of torch on a busy machine
        for _ in range(trials):
            _expect(ctl, "go", 10)
            time.sleep(rng.uniform(0.0005, max_delay_s))
            os.kill(worker.pid, signal.SIGINT)
            ctl.send("check")
            res = _recv(ctl, 10)  # two shares and a put: ~1 ms, ~2 s if out of step
            rec["trials"] += 1
            rec["where"][res["where"]] = rec["where"].get(res["where"], 0) + 1
            rec["swallowed"] += res["where"].endswith("(swallowed)")
            if not res["in_step"]:
                rec["out_of_step"] += 1
                _note(rec, res["error"])
            if "put" in res and not _arrives(out, res["put"], REPLY_TIMEOUT_S * 10, rec):
                rec["lost"] += 1  # dropped, or its feeder thread hangs: replace the worker
                raise TimeoutError(f"message {res['put']} (put after a {res['where']} "
                                   "interrupt) never arrived")
        _expect(ctl, "go", 30)
        os.kill(worker.pid, signal.SIGINT)
        ctl.send("stop")
        _expect(ctl, "done", 60)
        while _recv(out, 60) != "done":
            pass  # the receiver took the last message and let go of everything
        ctl.send("counted")
        rec["stray"] += _recv(ctl, 30)
    except (TimeoutError, EOFError, OSError) as exc:
        rec["stuck"] += 1
        _note(rec, f"driver: {type(exc).__name__}: {exc}")
        where = "dead"
        if worker.is_alive():
            os.kill(worker.pid, signal.SIGUSR1)
            time.sleep(0.5)
            where = _stuck_in(open(stacks.name).read())  # noqa: SIM115
        rec["stuck_in"][where] = rec["stuck_in"].get(where, 0) + 1
    finally:
        for proc in (worker, receiver):
            proc.join(10)
            if proc.is_alive():
                proc.kill()
                proc.join(5)
        q.close()
        q.cancel_join_thread()
        stacks.close()
    rec["leaked"] += _left_after(f"{SHM_DIR}{lib}_{worker.pid}_*", deadline_s)


# Where stuck workers were found, by a line of their stacks (faulthandler's format).
STUCK_IN = {
    # CPython: a KeyboardInterrupt just after Condition.__enter__ took its lock and before
    # the `with` block began leaves the lock held; the Queue's next put waits for ever.
    # (faulthandler names the line: 92 is `with self._notempty:` in CPython 3.11.7's queues.py;
    # on another Python this case counts as "other")
    "Queue.put: its lock left held (CPython's with-statement gap)": "queues.py\", line 92 in put",
    # torch/storage.py, _share_memory_lock_protected: an interrupt between taking a
    # storage's RLock and the try/finally that releases it; the next share of a storage at
    # that address (the feeder thread's) waits for ever.
    "torch's share lock left held (torch/storage.py)": "torch/storage.py",
}


def _stuck_in(stacks: str) -> str:
    return next((what for what, line in STUCK_IN.items() if line in stacks), "other")


def _arrives(out, ident: int, timeout: float, rec: dict) -> bool:
    """Wait for the receiver to report message `ident` (earlier ones pass by)."""
    end = time.monotonic() + timeout
    while wait([out], max(0.0, end - time.monotonic())):
        got, good = out.recv()
        rec["bad_data"] += not good
        if got == ident:
            return True
    return False


def _note(rec: dict, error: str) -> None:
    if len(rec["errors"]) < 5:
        rec["errors"].append(error)


def _left_after(pattern: str, deadline_s: float) -> int:
    """Files matching `pattern` once the manager had `deadline_s` to reclaim; removes them."""
    end = time.monotonic() + deadline_s
    while glob.glob(pattern) and time.monotonic() < end:
        time.sleep(0.05)
    left = glob.glob(pattern)
    for path in left:
        with contextlib.suppress(OSError):
            os.unlink(path)
    return len(left)


def _recv(conn, timeout: float):
    if not wait([conn], timeout):
        raise TimeoutError(f"no answer from the worker within {timeout} s")
    return conn.recv()


def _expect(conn, what: str, timeout: float) -> None:
    got = _recv(conn, timeout)
    if got != what:
        raise OSError(f"the worker said {got!r}, not {what!r}")
