"""SIGKILL producer/consumer families at random points and count the shm files left behind.

Mirrors: nothing in torch; it checks what torch_shm_manager promises (and shmlab.manager with it).

    python -m shmlab stress --trials 1000 [--seed 0] [--strategy file_system] [--lib shmlab]
                            [--parallel 4] [--json] [--faults KIND[,KIND...]|all]
    python -m shmlab stress interrupt [--trials 500] [--lib shmlab|torch|both]

Each trial starts a *family* (``shmlab.testing.family``): a producer and a consumer, both
holder children obeying this driver through ``Actor``, with a Queue between them for the
tensors. The producer shares a few tensors, the consumer receives them, and the driver
SIGKILLs one or both at a point picked at random (`KINDS`). Then it waits for the family to
exit and watches /dev/shm: every file the family made must be gone, and its manager with it,
within the grace period (2 s) plus scheduling slack. A file still there after `--deadline`
seconds is a leak; a manager still there then counts in `managers_left`, and in
`managers_stuck` if it is still there 10 s later (it is killed then). The exit status is 0
only with no leak, nothing stuck, good data.

``interrupt`` is a scenario of its own (``interrupt_main``, ``shmlab.testing.interrupt_trial``):
SIGINT at random points of a worker's file_system shares, attaches and puts, shmlab and torch
side by side: clients left out of step, messages lost, segments leaked.

With ``--faults`` each trial instead injects one fault, picked at random from those named
(``all``: every one of ``fault_trial.FAULT_KINDS``: the manager SIGSTOPped 0.5-3 s, 100-400
silent observers, an oversized STATUS, floods of bad lines, a STATUS storm, a member's
connections dropped without BYE, a member SIGSTOPped), into a live shmlab family that keeps
allocating, sending and checking data (``shmlab.testing.fault_trial``). The report adds a table
per fault kind: live segments unlinked, leaked files, manager crashes (exit status not 0, or
an exception in its "exiting" event), stuck trials, bad data; any of them makes the exit
status 1. The seed is printed first (on stderr): the same seed replays the same faults.

With ``--clients N[,N...]`` it runs the clients scenario instead (``shmlab.testing.clients``):
for each N, one manager and N concurrent member processes, each registering a real file,
then a third saying BYE, a third exiting, a third SIGKILLed; shmlab's manager and torch's
torch_shm_manager side by side, interleaved, ``--rounds`` times each. The table gives served,
refused, reclaimed, leaked and crashed (over all rounds), and medians of the time every child
took to get its answer and of the time from the last exit to the last file unlinked. The exit
status is 1 if shmlab's manager refused, leaked or crashed in any round.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import time

import psutil

from ..introspect import SHM_DIR
from . import clients
from .family import FAMILY, RECLAIM_LIMIT_S, Family, child_managers, wait_reclaimed
from .fault_trial import FAULT_KINDS, failures, run_fault_trial, summarize_faults

KINDS = ("before_share", "after_share", "in_flight", "consumer_holds", "both", "anytime")


# -- one randomized trial -----------------------------------------------------------------------
def _become_subreaper() -> None:
    """Orphaned managers (their starter was SIGKILLed) become our children, so we can see
    and reap them instead of leaving zombies to an init that may never wait for them."""
    PR_SET_CHILD_SUBREAPER = 36
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


_exit_codes: dict[int, int] = {}  # pid -> exit code of the zombie children we reaped


def _reap_managers() -> list[int]:
    """Our live manager children (adopted orphans); zombie children are reaped first."""
    for child in psutil.Process().children():
        try:
            if child.status() == psutil.STATUS_ZOMBIE:
                pid, status = os.waitpid(child.pid, os.WNOHANG)
                if pid:
                    _exit_codes[pid] = os.waitstatus_to_exitcode(status)
        except (psutil.Error, ChildProcessError):
            pass
    return child_managers()


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
                    fam.ask(P, "write", FAMILY, -1.0)
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
    return _settle(rec, fam.managers)


def _settle(rec: dict, managers: set[int]) -> dict:
    """Unlink what the trial leaked (counted already), give late managers 10 s, kill stuck ones."""
    for name in rec.get("files_left", ()):  # count it, then clean it, so trials stay apart
        try:
            os.unlink(os.path.join(SHM_DIR, name))
        except FileNotFoundError:
            pass
    if rec.get("managers_left"):  # late or stuck? give them 10 s more to go on their own
        rec["reported_managers"] = sorted(managers - set(rec["managers_left"]))
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


def run_trials(trials: int, seed: int, lib: str, strategy: str, deadline_s: float,
               fault_kinds: tuple[str, ...] = ()) -> list:
    _become_subreaper()
    rng = random.Random(seed)
    if not fault_kinds:
        return [run_trial(rng.choice(KINDS), rng, lib, strategy, deadline_s=deadline_s)
                for _ in range(trials)]
    grace_s = float(os.environ.get("SHMLAB_MANAGER_GRACE", 2.0))
    # Each trial draws from a generator of its own, seeded from this one: how many random
    # numbers a trial uses depends on timing (rounds), the kinds and seeds drawn here do not.
    picks = [(rng.choice(fault_kinds), rng.getrandbits(64)) for _ in range(trials)]
    return [_settle(run_fault_trial(kind, random.Random(seed), grace_s, deadline_s,
                                    _exit_codes, _reap_managers), set())
            for kind, seed in picks]


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
        **({"faults": summarize_faults(records)} if args.faults else {}),
        "outcomes": dict(sorted(outcomes.items())),
        "incidents": [r for r in records if r.get("files_left") or r.get("managers_left")
                      or r["outcome"].startswith(("stuck", "bad", "unreadable"))
                      or r.get("live_unlinked") or r.get("crash")],
    }


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 3)


def _parts(args: argparse.Namespace) -> list[dict]:
    """Run the trials in `--parallel` driver processes (each one family at a time)."""
    if args.parallel <= 1:
        return run_trials(args.trials, args.seed, args.lib, args.strategy, args.deadline,
                          args.faults)
    shares = [args.trials // args.parallel + (i < args.trials % args.parallel)
              for i in range(args.parallel)]
    procs = [subprocess.Popen(
        [sys.executable, "-m", "shmlab.testing.stress", "--trials", str(k), "--seed",
         str(args.seed * 1000 + i), "--lib", args.lib, "--strategy", args.strategy,
         "--deadline", str(args.deadline), "--parallel", "1", "--records",
         *(["--faults", ",".join(args.faults)] if args.faults else [])],
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
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["interrupt"]:
        return interrupt_main(argv[1:])
    parser = argparse.ArgumentParser(prog="python -m shmlab stress", description=__doc__.split(
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
    parser.add_argument("--faults", type=_fault_kinds, default=(),
                        metavar="KIND[,KIND...]|all",
                        help="inject one fault per trial into a live shmlab family, one of: "
                             + ", ".join(FAULT_KINDS))
    parser.add_argument("--clients", type=_counts, default=(), metavar="N[,N...]",
                        help="the clients scenario: N concurrent member processes on one "
                             "manager, shmlab's and torch's side by side")
    parser.add_argument("--rounds", type=int, default=1,
                        help="rounds of each N and manager in the clients scenario")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    parser.add_argument("--records", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.faults and (args.lib, args.strategy) != ("shmlab", "file_system"):
        parser.error("--faults attacks shmlab's manager: use --lib shmlab --strategy file_system")
    if not args.records:
        print(f"seed {args.seed}", file=sys.stderr, flush=True)
    if args.clients:
        return run_clients(args)
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
            if key != "faults":
                print(f"{key:>16}: {value}")
        print(_table(summary.get("faults", {})))
    ok = summary["leaked_files"] == summary["managers_stuck"] == summary["stuck"] == 0
    ok = ok and not any(failures(row) for row in summary.get("faults", {}).values())
    return 0 if ok and summary["bad_data"] == 0 else 1


# -- the clients scenario -----------------------------------------------------------------------
CLIENT_LIBS = ("shmlab", "torch")


def run_clients(args: argparse.Namespace) -> int:
    """--clients: every N, every round, shmlab then torch; one row per (N, manager)."""
    records = []
    for n in args.clients:
        for r in range(args.rounds):
            for lib in CLIENT_LIBS:
                rec = clients.drive(lib, n, seed=args.seed + r, deadline=args.deadline + 60)
                print(json.dumps(rec), file=sys.stderr, flush=True)
                records.append(rec)
    rows = summarize_clients(records)
    if args.json:
        print(json.dumps(rows))
    else:
        print(clients_table(rows))
    bad = [row for row in rows if row["lib"] == "shmlab" and (
        row["refused"] or row["leaked"] or row["crashed"] or row["reclaimed"] < row["served"])]
    return 1 if bad else 0


def summarize_clients(records: list[dict]) -> list[dict]:
    rows = []
    for n in dict.fromkeys(r["clients"] for r in records):
        torch_reclaim = None
        for lib in CLIENT_LIBS:
            mine = [r for r in records if r["clients"] == n and r["lib"] == lib]
            reclaim = [r["last_exit_to_reclaim_s"] for r in mine
                       if r["last_exit_to_reclaim_s"] is not None]
            row = {"clients": n, "lib": lib, "rounds": len(mine),
                   "served": sum(r["served"] for r in mine),
                   "refused": sum(r["refused"] for r in mine),
                   "reclaimed": sum(r["reclaimed"] for r in mine),
                   "leaked": sum(r["leaked"] for r in mine),
                   "crashed": sum(r["manager_exit"] != 0 for r in mine),
                   "register_s": _r(statistics.median(r["register_s"] for r in mine)),
                   "reclaim_s": _r(statistics.median(reclaim)) if reclaim else None}
            if lib == "torch":
                torch_reclaim = row["reclaim_s"]
            rows.append(row)
        for row in rows[-len(CLIENT_LIBS):]:
            row["reclaim_vs_torch"] = (_r(row["reclaim_s"] / torch_reclaim)
                                       if row["reclaim_s"] and torch_reclaim else None)
    return rows


def clients_table(rows: list[dict]) -> str:
    cols = ["clients", "lib", "rounds", "served", "refused", "reclaimed", "leaked", "crashed",
            "register_s", "reclaim_s", "reclaim_vs_torch"]
    lines = ["| " + " | ".join(cols) + " |", "|---" * len(cols) + "|"]
    for row in rows:
        lines.append("| " + " | ".join(str(row[c]) for c in cols) + " |")
    return "\n".join(lines)


def _counts(text: str) -> tuple[int, ...]:
    try:
        counts = tuple(int(x) for x in text.split(",") if x)
    except ValueError:
        counts = ()
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError(f"--clients wants numbers >= 1, comma-separated, "
                                         f"e.g. 1100,2000 (got {text!r})")
    return counts


def _fault_kinds(text: str) -> tuple[str, ...]:
    kinds = FAULT_KINDS if text == "all" else tuple(k for k in text.split(",") if k)
    unknown = [k for k in kinds if k not in FAULT_KINDS]
    if unknown or not kinds:
        raise argparse.ArgumentTypeError(
            f"unknown fault {unknown[0] if unknown else text!r}: name some of "
            f"{', '.join(FAULT_KINDS)} (comma-separated), or all")
    return kinds


def _table(faults: dict[str, dict]) -> str:
    """The per-fault-kind counts as a Markdown table ('' without --faults)."""
    if not faults:
        return ""
    cols = list(next(iter(faults.values())))
    total = {c: sum(row[c] for row in faults.values()) for c in cols}
    lines = ["| fault | " + " | ".join(cols) + " |", "|---" * (len(cols) + 1) + "|"]
    for kind, row in [*faults.items(), ("all", total)]:
        lines.append(f"| {kind} | " + " | ".join(str(row[c]) for c in cols) + " |")
    return "\n".join(lines)


# -- the interrupt scenario: SIGINT at random points of share, attach and put --------------------
INTERRUPT_COLUMNS = ("trials", "out_of_step", "lost", "bad_data", "stray", "leaked", "stuck",
                     "swallowed", "wall_s")


def interrupt_main(argv: list[str]) -> int:
    """`python -m shmlab stress interrupt`: shmlab and torch side by side (interrupt_trial.py)."""
    parser = argparse.ArgumentParser(
        prog="python -m shmlab stress interrupt",
        description="SIGINT a worker at random points of file_system share/attach/put; count "
                    "clients out of step, messages lost and segments leaked "
                    "(shmlab.testing.interrupt_trial)")
    parser.add_argument("--trials", type=int, default=500, help="interrupts per library")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lib", choices=["shmlab", "torch", "both"], default="both")
    parser.add_argument("--max-delay", type=float, default=0.01,
                        help="seconds; each interrupt comes 0.5 ms to this long after the last")
    parser.add_argument("--json", action="store_true", help="print the records as JSON")
    args = parser.parse_args(argv)  # exit status 1: a client out of step, a message lost or
    # bad, a leak; stuck workers (CPython's and torch's own lock gaps) are reported only
    if args.trials < 1:
        parser.error("--trials must be at least 1")
    from .interrupt_trial import run_interrupt_trials

    print(f"seed {args.seed}", file=sys.stderr, flush=True)
    libs = ["shmlab", "torch"] if args.lib == "both" else [args.lib]
    records = [run_interrupt_trials(lib, args.trials, args.seed, args.max_delay) for lib in libs]
    if args.json:
        print(json.dumps(records))
    else:
        print("| lib | " + " | ".join(INTERRUPT_COLUMNS) + " |")
        print("|---" * (len(INTERRUPT_COLUMNS) + 1) + "|")
        for rec in records:
            print(f"| {rec['lib']} | " + " | ".join(str(rec[c]) for c in INTERRUPT_COLUMNS)
                  + " |")
        for rec in records:
            print(f"{rec['lib']}: where the interrupts landed {rec['where']}")
            if rec["stuck_in"]:
                print(f"{rec['lib']}: stuck workers (replaced) {rec['stuck_in']}")
            for error in rec["errors"]:
                print(f"{rec['lib']}: {error}")
    bad = ("out_of_step", "lost", "bad_data", "leaked")
    return 0 if all(rec[c] == 0 for rec in records for c in bad) else 1


if __name__ == "__main__":
    sys.exit(main())
