"""SIGKILL producer/consumer families at random points and count the shm files left behind.

Mirrors: nothing in torch; it checks what torch_shm_manager promises (and shmlab.manager with it).

    python -m shmlab.stress --trials 1000 [--seed 0] [--strategy file_system] [--lib shmlab]
                            [--parallel 4] [--json]

Each trial forks a *family*: a producer and a consumer, both obeying commands from this
driver over a Pipe (`member`), with a Queue between them for the tensors. The producer shares
a few tensors, the consumer receives them, and the driver SIGKILLs one or both at a point
picked at random (`KINDS`). Then it waits for the family to exit and watches /dev/shm: every
file the family made must be gone, and its manager with it, within the grace period (2 s)
plus scheduling slack. A file still there after `--deadline` seconds is a leak; a manager
still there then counts in `managers_left`, and in `managers_stuck` if it is still there 10 s
later (it is killed then). The exit status is 0 only with no leak, nothing stuck, good data.

Tests use `Family` directly to run the same scenarios step by step, beside torch.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import multiprocessing
import os
import random
import resource
import signal
import statistics
import subprocess
import sys
import time

import psutil

from . import workers

SHM_DIR = "/dev/shm"
PREFIX = {"shmlab": "shmlab", "torch": "torch"}
MANAGER_MARKERS = ("shmlab.manager", "torch_shm_manager")
KINDS = ("before_share", "after_share", "in_flight", "consumer_holds", "both", "anytime")
RECLAIM_LIMIT_S = 3.0  # the promise: grace (2 s) + 1 s, from the last exit to the last removal


# -- the family member: runs in a fork (or spawn) child -----------------------------------------
def _is_manager(proc: psutil.Process) -> bool:
    try:
        return any(m in " ".join(proc.cmdline()) for m in MANAGER_MARKERS)
    except psutil.Error:  # gone, or a zombie: not serving anybody
        return False


def child_managers(pid: int | None = None) -> list[int]:
    """Manager daemons that are children of `pid` (the process that started them)."""
    try:
        return [c.pid for c in psutil.Process(pid).children() if _is_manager(c)]
    except psutil.NoSuchProcess:
        return []


def _segment(t) -> tuple[str, str] | None:
    """(manager handle, bare name) of a file_system tensor, or None (file_descriptor).

    torch and shmlab answer the same call: asking a storage shared by name to share by name
    again only returns its handle (never call it under file_descriptor: it would move it).
    """
    mod = type(t).__module__.split(".")[0]
    if workers.load(mod)[1].get_sharing_strategy() != "file_system":
        return None
    handle, name, _ = t.untyped_storage()._share_filename_cpu_()
    return handle.decode(), name.decode().lstrip("/")


def _share(lib, data, held, n: int, size: int) -> dict:
    import numpy as np

    for _ in range(n):
        t = workers.new_tensor(lib, np.full(size, len(held) + 1, dtype=np.float32))
        held.append(t.share_memory_())
    return {"segments": [_segment(t) for t in held], "managers": child_managers()}


def _put(lib, data, held, flush: bool = True) -> dict:
    for t in held:
        data.put(t)
    if flush:  # only for a few messages: a full pipe (64 KiB) waits for the consumer
        data.close()
        data.join_thread()  # every message is in the pipe now: "in flight"
    return {}


def _get(lib, data, held, n: int, timeout: float) -> dict:
    for _ in range(n):
        held.append(data.get(timeout=timeout))
    return _read(lib, data, held)


def _read(lib, data, held) -> dict:
    return {"values": [float(t.numpy().reshape(-1)[0]) if t.numel() else None for t in held],
            "segments": [_segment(t) for t in held], "own_managers": child_managers()}


def _write(lib, data, held, value: float) -> dict:
    for t in held:
        t.numpy().reshape(-1)[0] = value
    return {}


def _release(lib, data, held) -> dict:
    held.clear()
    gc.collect()
    return {}


def _fork_share(lib, data, held) -> dict:
    """Fork a grandchild that shares one tensor and reports which manager it used."""
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the grandchild: no multiprocessing machinery, report and leave
        code = 1
        try:
            os.close(rfd)
            out = _share(lib, data, [], 1, 4)
            os.write(wfd, json.dumps(out).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(wfd)
    with os.fdopen(rfd, "rb") as r:
        raw = r.read()
    os.waitpid(pid, 0)
    return json.loads(raw)


def _fds(lib, data, held) -> dict:
    return {"fds": workers.fd_count(), "shm_fds": workers.shm_fd_count()}


def _limit_fds(lib, data, held, nofile: int) -> dict:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, hard))
    return _fds(lib, data, held)


def _reset_manager(lib, data, held) -> dict:
    """shmlab only: forget a dead manager, as its ManagerError says to."""
    from .manager import client as _manager_client

    _manager_client.reset()
    return {}


COMMANDS = {"share": _share, "put": _put, "get": _get, "read": _read, "write": _write,
            "release": _release, "fork_share": _fork_share, "fds": _fds,
            "limit_fds": _limit_fds, "reset_manager": _reset_manager}


def member(lib: str, strategy: str, data, conn) -> None:
    """A family member: run (command, args) from `conn`, answer each with a dict, until
    'exit' (or a SIGKILL). Errors are answered as {"error": [type, message]}."""
    _, mp = workers.load(lib)
    mp.set_sharing_strategy(strategy)
    held: list = []
    conn.send({"pid": os.getpid(), "managers": child_managers()})
    while True:
        try:
            cmd, args = conn.recv()
        except EOFError:  # the driver is gone
            return
        if cmd == "exit":
            _release(lib, data, held)
            conn.send({})
            return
        try:
            reply = COMMANDS[cmd](lib, data, held, *args)
        except Exception as exc:  # noqa: BLE001 - the driver decides what an error means
            reply = {"error": [type(exc).__name__, str(exc)]}
        conn.send(reply)


# -- the driver side ----------------------------------------------------------------------------
class Family:
    """A producer and a consumer of one library, started here, commanded over Pipes."""

    def __init__(self, lib: str, strategy: str, method: str = "fork",
                 consumer_method: str | None = None):
        self.lib, self.strategy, self.prefix = lib, strategy, PREFIX[lib]
        workers.load(lib)  # import before forking, so children start at once
        ctx = multiprocessing.get_context(method)
        cctx = multiprocessing.get_context(consumer_method or method)
        self.data = cctx.Queue()  # from the stricter context: usable by both kinds of child
        self.procs, self.conns, self.exited = {}, {}, {}
        self.managers: set[int] = set()
        for role, c in (("producer", ctx), ("consumer", cctx)):
            ours, theirs = c.Pipe()
            proc = c.Process(target=member, args=(lib, strategy, self.data, theirs),
                             name=f"{lib}-{role}", daemon=True)
            proc.start()
            theirs.close()
            self.procs[role], self.conns[role] = proc, ours
        self._pids: dict[str, int] = {}

    @property
    def pids(self) -> dict[str, int]:
        """Each member's pid, once it has said it is ready (waits for that)."""
        if not self._pids:
            self._pids = {role: self.reply(role, 90)["pid"] for role in self.procs}
        return self._pids

    # commands
    def send(self, role: str, cmd: str, *args) -> None:
        self.pids  # noqa: B018 - the ready message comes first
        self.conns[role].send((cmd, args))

    def reply(self, role: str, timeout: float = 30) -> dict:
        conn = self.conns[role]
        if not conn.poll(timeout):
            raise TimeoutError(f"{self.lib} {role} did not answer within {timeout} s")
        out = conn.recv()
        self.managers.update(out.get("managers") or ())
        return out

    def ask(self, role: str, cmd: str, *args, timeout: float = 30, check: bool = True) -> dict:
        """Run one command; a member's error is raised here unless `check` is False."""
        self.send(role, cmd, *args)
        out = self.reply(role, timeout)
        if check and "error" in out:
            raise RuntimeError(f"{self.lib} {role} failed at {cmd}{args}: {out['error']}")
        return out

    # ends of life
    def kill(self, *roles: str) -> None:
        self.pids  # noqa: B018 - "before share" still means after the member is ready
        for role in roles:
            os.kill(self.procs[role].pid, signal.SIGKILL)
        for role in roles:
            self._joined(role)

    def finish(self, *roles: str, timeout: float = 30) -> None:
        """Ask members to exit normally (they release what they hold first)."""
        for role in roles:
            try:
                self.ask(role, "exit", timeout=timeout)
            except (EOFError, OSError):  # it died on the way out (torch can abort there)
                pass
        for role in roles:
            self._joined(role, timeout)

    def _joined(self, role: str, timeout: float = 30) -> None:
        proc = self.procs[role]
        proc.join(timeout)
        if proc.exitcode is None:
            raise TimeoutError(f"{self.lib} {role} did not exit within {timeout} s")
        self.exited.setdefault(role, time.monotonic())

    @property
    def last_exit(self) -> float | None:
        """When the last member that has exited did (the family may live on: in_flight)."""
        return max(self.exited.values(), default=None)

    # what it left
    def files(self) -> list[str]:
        mine = tuple(f"{self.prefix}_{pid}_" for pid in self.pids.values())
        try:
            return sorted(n for n in os.listdir(SHM_DIR) if n.startswith(mine))
        except FileNotFoundError:
            return []

    def live_managers(self) -> list[int]:
        alive = []
        for pid in sorted(self.managers):
            try:
                if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                    alive.append(pid)
            except psutil.NoSuchProcess:
                pass
        return alive

    def close(self) -> None:
        """Kill whatever still runs (a failed test must not leave members behind)."""
        for role, proc in self.procs.items():
            if proc.exitcode is None:
                proc.kill()
                proc.join(10)
            self.conns[role].close()
        self.data.close()
        self.data.join_thread()


def wait_reclaimed(families: list[Family], deadline_s: float = 6.0, poll_s: float = 0.005
                   ) -> list[dict]:
    """Watch each exited family's files and managers until all are gone or `deadline_s`
    after its last exit. Per family: reclaim_s (last exit -> last file gone; None if it left
    no file), managers_s (-> last manager gone), files_left, managers_left."""
    out = [{"files_at_exit": f.files(), "managers_at_exit": f.live_managers(), "reclaim_s": None,
            "managers_s": None} for f in families]
    pending = set(range(len(families)))
    while pending:
        now = time.monotonic()
        for i in sorted(pending):
            fam, rec = families[i], out[i]
            files, mgrs = fam.files(), fam.live_managers()
            if not files and rec["reclaim_s"] is None and rec["files_at_exit"]:
                rec["reclaim_s"] = now - fam.last_exit
            if not mgrs and rec["managers_s"] is None and rec["managers_at_exit"]:
                rec["managers_s"] = now - fam.last_exit
            if (not files and not mgrs) or now - fam.last_exit > deadline_s:
                rec["files_left"], rec["managers_left"] = files, mgrs
                pending.discard(i)
        time.sleep(poll_s)
    return out


# -- one randomized trial -----------------------------------------------------------------------
def _become_subreaper() -> None:
    """Orphaned managers (their starter was SIGKILLed) become our children, so we can see
    and reap them instead of leaving zombies to an init that may never wait for them."""
    PR_SET_CHILD_SUBREAPER = 36
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def _reap_managers() -> list[int]:
    """Our live manager children (adopted orphans); zombies among them are reaped."""
    live = []
    for child in psutil.Process().children():
        try:
            if child.status() == psutil.STATUS_ZOMBIE:
                os.waitpid(child.pid, os.WNOHANG)
            elif _is_manager(child):
                live.append(child.pid)
        except (psutil.Error, ChildProcessError):
            pass
    return live


def run_trial(kind: str, rng: random.Random, lib: str = "shmlab",
              strategy: str = "file_system", n: int = 2, size: int = 1024,
              deadline_s: float = 6.0) -> dict:
    """One family, one kill pattern. Returns what it left and how long the reclaim took."""
    P, C = "producer", "consumer"
    want = [float(i + 1) for i in range(n)]
    rec = {"kind": kind, "outcome": "ok"}
    fam = Family(lib, strategy)
    try:
        if kind == "before_share":
            fam.kill(P)
            fam.finish(C)
        elif kind == "anytime":  # kills land anywhere: mid-share, mid-register, mid-get
            fam.send(P, "share", n, size)
            fam.send(P, "put")
            fam.send(C, "get", n, 5.0)
            start, kills = time.monotonic(), [(rng.uniform(0, 0.2), P), (rng.uniform(0, 0.2), C)]
            for at, role in sorted(kills):
                time.sleep(max(0.0, start + at - time.monotonic()))
                fam.kill(role)
        else:
            fam.ask(P, "share", n, size)
            fam.ask(P, "put")
            if kind == "in_flight":  # the consumer asks late: before or after the reclaim
                fam.kill(P)
                time.sleep(rng.uniform(0.0, 3.5))
                got = fam.ask(C, "get", n, 5.0, check=False)
                rec["outcome"] = "received" if "error" not in got else "error " + got["error"][0]
                if "error" not in got and got["values"] != want:
                    rec["outcome"] = f"bad data {got['values']}"
                fam.finish(C)
            else:
                got = fam.ask(C, "get", n, 10.0)
                if got.get("values") != want:
                    rec["outcome"] = f"bad data {got}"
                if kind == "after_share":  # the creator dies; its memory lives on
                    fam.kill(P)
                    if fam.ask(C, "read").get("values") != want:
                        rec["outcome"] = "unreadable after the producer died"
                    fam.finish(C)
                elif kind == "consumer_holds":
                    fam.kill(C)
                    fam.ask(P, "write", -1.0)
                    fam.finish(P)
                else:  # both, in a random order, a random moment apart
                    first, second = rng.sample([P, C], 2)
                    fam.kill(first)
                    time.sleep(rng.uniform(0.0, 0.05))
                    fam.kill(second)
        fam.managers.update(_reap_managers())
        rec.update(wait_reclaimed([fam], deadline_s)[0])
    except Exception as exc:  # noqa: BLE001 - a stuck trial is a finding, not a crash
        rec.update(outcome=f"stuck: {type(exc).__name__}: {exc}", files_left=fam.files(),
                   managers_left=fam.live_managers())
    finally:
        fam.close()
    for name in rec.get("files_left", ()):  # count it, then clean it, so trials stay apart
        try:
            os.unlink(os.path.join(SHM_DIR, name))
        except FileNotFoundError:
            pass
    if rec.get("managers_left"):  # late or stuck? give them 10 s more to go on their own
        rec["reported_managers"] = sorted(fam.managers - set(rec["managers_left"]))
        rec["manager_ages_s"] = [_age(pid) for pid in rec["managers_left"]]
        rec["left_on_their_own"] = _wait_gone(rec["managers_left"], 10.0)
    for pid in rec.get("managers_left", ()):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    rec["files_at_exit"] = len(rec.get("files_at_exit", ()))
    rec["managers_at_exit"] = len(rec.get("managers_at_exit", ()))
    _reap_managers()
    return rec


def _age(pid: int) -> float | None:
    try:
        return round(time.time() - psutil.Process(pid).create_time(), 2)
    except psutil.Error:
        return None


def _wait_gone(pids: list[int], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not [p for p in pids if p in _reap_managers()]:
            return True
        time.sleep(0.05)
    return False


def run_trials(trials: int, seed: int, lib: str, strategy: str, deadline_s: float) -> list:
    _become_subreaper()
    rng = random.Random(seed)
    return [run_trial(rng.choice(KINDS), rng, lib, strategy, deadline_s=deadline_s)
            for _ in range(trials)]


# -- the command --------------------------------------------------------------------------------
def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


def summarize(records: list[dict], args: argparse.Namespace, wall_s: float) -> dict:
    reclaim = [r["reclaim_s"] for r in records if r.get("reclaim_s") is not None]
    managers = [r["managers_s"] for r in records if r.get("managers_s") is not None]
    outcomes: dict[str, int] = {}
    for r in records:
        key = r["kind"] + ": " + r["outcome"]
        outcomes[key] = outcomes.get(key, 0) + 1
    return {
        "trials": len(records), "lib": args.lib, "strategy": args.strategy, "seed": args.seed,
        "grace_s": float(os.environ.get("SHMLAB_MANAGER_GRACE", 2.0)), "wall_s": round(wall_s, 1),
        "leaked_files": sum(len(r.get("files_left", ())) for r in records),
        "managers_left": sum(len(r.get("managers_left", ())) for r in records),
        "managers_stuck": sum(len(r["managers_left"]) for r in records
                              if r.get("managers_left") and not r.get("left_on_their_own")),
        "stuck": sum(r["outcome"].startswith("stuck") for r in records),
        "bad_data": sum(r["outcome"].startswith(("bad", "unreadable")) for r in records),
        "reclaimed_trials": len(reclaim),
        "reclaim_s": {"median": _r(statistics.median(reclaim)) if reclaim else None,
                      "p95": _r(_percentile(reclaim, 0.95)), "max": _r(max(reclaim, default=None))},
        "manager_exit_s": {"median": _r(statistics.median(managers)) if managers else None,
                           "p95": _r(_percentile(managers, 0.95))},
        "over_limit": sum(x > RECLAIM_LIMIT_S for x in reclaim),
        "outcomes": dict(sorted(outcomes.items())),
        "incidents": [r for r in records if r.get("files_left") or r.get("managers_left")
                      or r["outcome"].startswith(("stuck", "bad", "unreadable"))],
    }


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 3)


def _parts(args: argparse.Namespace) -> list[dict]:
    """Run the trials in `--parallel` driver processes (each one family at a time)."""
    if args.parallel <= 1:
        return run_trials(args.trials, args.seed, args.lib, args.strategy, args.deadline)
    shares = [args.trials // args.parallel + (i < args.trials % args.parallel)
              for i in range(args.parallel)]
    procs = [subprocess.Popen(
        [sys.executable, "-m", "shmlab.stress", "--trials", str(k), "--seed",
         str(args.seed * 1000 + i), "--lib", args.lib, "--strategy", args.strategy,
         "--deadline", str(args.deadline), "--parallel", "1", "--records"],
        stdout=subprocess.PIPE) for i, k in enumerate(shares) if k]
    records = []
    for proc in procs:
        out, _ = proc.communicate()
        try:
            records += json.loads(out)
        except ValueError:  # a driver crashed: that is a finding too
            records.append({"kind": "driver", "outcome": f"stuck: driver exit {proc.returncode}"})
    return records


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m shmlab.stress", description=__doc__.split(
        "\n")[0])
    parser.add_argument("--trials", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--strategy", choices=["file_system", "file_descriptor"],
                        default="file_system")
    parser.add_argument("--lib", choices=["shmlab", "torch"], default="shmlab")
    parser.add_argument("--parallel", type=int, default=1,
                        help="driver processes, each running one family at a time")
    parser.add_argument("--deadline", type=float, default=6.0,
                        help="seconds after the family's last exit before a file counts as leaked")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    parser.add_argument("--records", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    start = time.monotonic()
    records = _parts(args)
    if args.records:  # a part of a --parallel run: hand the raw records to the parent
        print(json.dumps(records))
        return 0
    summary = summarize(records, args, time.monotonic() - start)
    if args.json:
        print(json.dumps(summary))
    else:
        for key, value in summary.items():
            print(f"{key:>16}: {value}")
    ok = summary["leaked_files"] == summary["managers_stuck"] == summary["stuck"] == 0
    return 0 if ok and summary["bad_data"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
