"""One stress trial with a fault: a live family allocates, sends and checks data while its
manager is stalled, flooded or cut off; the one rule checked is that no live segment goes.

Mirrors: nothing in torch; it checks the manager's promise (see Note [A dropped connection
is not a dead process] in shmlab/manager/liveness.py) with the faults of
``shmlab.testing.faults`` and two of the family's own.

    run_fault_trial(kind, rng) -> record      one trial; ``python -m shmlab stress --faults``
    FAULT_KINDS                               faults.KINDS + "drop" + "member_stall"
    summarize_faults(records) -> {kind: {..}} the per-kind table of the stress report

A trial: a producer shares two tensors (which starts its manager), the consumer receives
them; a watcher connects as an observer; the fault starts; rounds of "share one more, put it,
the consumer gets it" run while the fault lasts and until the grace period after it is over
(that is when a manager that lost count would unlink); then one round must fully work, every
segment either member holds must still be in /dev/shm with the values it was made with, and
the family ends (exits, or is killed) and must leave nothing. Allocations that time out
during a stall are counted (``alloc_errors``), not failed: torch raises the same 1 s error.
"""

from __future__ import annotations

import contextlib
import json
import random
import threading
import time

from ..manager.client import peek_status
from . import faults
from .family import Family, wait_reclaimed

P, C = "producer", "consumer"
FAULT_KINDS = (*faults.KINDS, "drop", "member_stall")
SIZE = 256  # float32 elements per tensor: small, the point is the bookkeeping


class Watcher:
    """An observer of one manager, in a thread: the names it reclaimed (and when), and the
    reason of its "exiting" event (a repr of the exception when it crashed)."""

    def __init__(self, handle: str):
        self.reclaimed: dict[str, float] = {}
        self.exiting: dict | None = None
        self.ended = False  # end of file: the manager exited (or dropped us)
        self._stop = False
        self.sock = faults.connect(handle, timeout=0.5)
        self.sock.sendall(b"WATCH\n")
        self.thread = threading.Thread(target=self._run, daemon=True, name="watcher")
        self.thread.start()

    def _run(self) -> None:
        buf = bytearray()
        while not self._stop:
            try:
                line = faults.readline(self.sock, buf)
            except TimeoutError:
                continue
            except OSError:
                line = b""
            if not line:
                self.ended = True
                return
            if not line.startswith(b"{"):  # "ERR too many observers": we came too late
                continue
            event = json.loads(line)
            if event.get("event") == "reclaimed":
                self.reclaimed[event["name"]] = time.monotonic()
            elif event.get("event") == "exiting":
                self.exiting = event

    def close(self, timeout: float = 2.0) -> None:
        self.thread.join(timeout)  # take the last events first, if they are coming
        self._stop = True
        self.thread.join(1.0)
        self.sock.close()


class MemberFault:
    """The family's own faults: a member's manager connections cut without BYE ("drop"), or
    a member SIGSTOPped 0.5-3 s ("member_stall"). Neither is a dead process."""

    def __init__(self, kind: str, fam: Family, rng: random.Random, grace_s: float = 2.0):
        self.kind, self.fam, self.rng, self.record = kind, fam, rng, {"fault": kind}
        self.thread: threading.Thread | None = None
        self.quiet_until = 0.0
        if kind == "drop":  # usually both (then no client connection is left), then quiet
            self.record["drops"] = []  # for 1.2-2.5 grace periods: past the grace, always
            for role in rng.choice(((P, C), (C, P), (P,), (C,), (P, C), (C, P))):
                self.drop(role)
            self.record["quiet_s"] = round(rng.uniform(1.2, 2.5) * max(grace_s, 0.5), 3)
            self.quiet_until = time.monotonic() + self.record["quiet_s"]
        else:
            role = rng.choice((P, C))
            self.thread = faults.stall_later(fam.pids[role], rng, 0.5, 3.0, within=0.5)
            self.record.update(role=role, at_s=round(self.thread.at_s, 3),
                               stall_s=round(self.thread.stall_s, 3))

    def drop(self, role: str) -> None:
        self.record["drops"].append([role, self.fam.ask(role, "drop_manager")["dropped"]])

    def between_rounds(self) -> None:
        if self.kind == "drop" and self.rng.random() < 0.25:  # and now and then, once more
            self.drop(self.rng.choice((P, C)))

    def quiet(self) -> bool:
        """No round now: the members hold their tensors and say nothing (after a drop)."""
        return time.monotonic() < self.quiet_until

    def active(self) -> bool:
        return self.quiet() or self.thread is not None and self.thread.is_alive()

    def stop(self, timeout: float = 10.0) -> dict:
        if self.thread is not None:
            self.thread.join(timeout)
        return self.record


def _round(fam: Family, rec: dict) -> None:
    """Share one more tensor, put it, the consumer takes it; errors counted, not raised."""
    got = fam.ask(P, "share", 1, SIZE, check=False)
    if "error" in got:
        rec["alloc_errors"] += 1
        rec["last_error"] = got["error"]
        return
    fam.ask(P, "put", False, 1)
    got = fam.ask(C, "get", 1, 10.0, check=False)
    if "error" in got:  # attaching asks the manager too: it can time out the same way
        rec["get_errors"] += 1
        rec["last_error"] = got["error"]
    rec["rounds"] += 1


def _check_held(fam: Family, rec: dict) -> set[str]:
    """Every segment either member holds is in /dev/shm with its value; returns the names."""
    mine, theirs = fam.ask(P, "read"), fam.ask(C, "read")
    value = {seg[1]: v for seg, v in zip(mine["segments"], mine["values"], strict=True)}
    if mine["values"] != [float(i + 1) for i in range(len(mine["values"]))]:
        rec["outcome"] = f"bad data: producer reads {mine['values']}"
    for seg, v in zip(theirs["segments"], theirs["values"], strict=True):
        if value.get(seg[1], v) != v:
            rec["outcome"] = f"bad data: consumer reads {v} in {seg[1]}, made {value[seg[1]]}"
    names = set(value) | {seg[1] for seg in theirs["segments"]}
    rec["live_unlinked"] = sorted(n for n in names if not faults.alive([n]))
    return names


def _start_fault(kind: str, fam: Family, handle: str, pid: int, rng: random.Random,
                 grace_s: float):
    if kind in faults.KINDS:
        return faults.start(kind, handle, pid, rng)
    return MemberFault(kind, fam, rng, grace_s)


def run_fault_trial(kind: str, rng: random.Random, grace_s: float = 2.0,
                    deadline_s: float = 6.0, exit_codes: dict | None = None,
                    reap=lambda: ()) -> dict:
    """One family, one fault of FAULT_KINDS. ``exit_codes``: pid -> exit code of the
    managers the caller (a subreaper) has reaped; ``reap()`` reaps and returns live ones."""
    rec = {"kind": kind, "outcome": "ok", "alloc_errors": 0, "get_errors": 0, "rounds": 0,
           "live_unlinked": [], "crash": None}
    fam, watcher, fault, mpid = Family("shmlab", "file_system"), None, None, None
    exit_codes = {} if exit_codes is None else exit_codes
    try:
        first = fam.ask(P, "share", 2, SIZE)
        handle = first["segments"][0][0]
        mpid = peek_status(handle.encode())["pid"]
        fam.managers.add(mpid)
        watcher = Watcher(handle)
        fam.ask(P, "put", False)
        if fam.ask(C, "get", 2, 10.0)["values"] != [1.0, 2.0]:
            rec["outcome"] = "bad data before the fault"
        fault = _start_fault(kind, fam, handle, mpid, rng, grace_s)
        quiet_at = time.monotonic() + rng.uniform(0.2, 1.0)
        while fault.active() or time.monotonic() < quiet_at:
            if isinstance(fault, MemberFault) and fault.quiet():
                time.sleep(0.02)
                continue
            _round(fam, rec)
            if isinstance(fault, MemberFault):
                fault.between_rounds()
        rec["fault"] = fault.stop()
        fault = None
        over = time.monotonic() + grace_s + 0.5  # a manager that lost count unlinks by now
        while time.monotonic() < over:
            _round(fam, rec)
            time.sleep(0.05)
        errors = rec["alloc_errors"] + rec["get_errors"]
        _round(fam, rec)  # after the fault: this one must work from end to end
        if rec["alloc_errors"] + rec["get_errors"] > errors:
            kind_, message = rec["last_error"]
            rec["outcome"] = f"stuck: after the fault a round failed: {kind_}: {message[:80]}"
        names = _check_held(fam, rec)
        ending = rng.choice(("exit", "exit", "kill producer", "kill both"))
        rec["ending"] = ending
        unlinked_live = {n for n, t in watcher.reclaimed.items() if n in names}
        if ending == "exit":
            fam.finish(C, P)
        elif ending == "kill producer":
            fam.kill(P)
            fam.finish(C)
        else:
            fam.kill(P, C)
        first_exit = min(fam.exited.values())
        unlinked_live |= {n for n, t in watcher.reclaimed.items() if n in names
                          and t < first_exit}
        rec["live_unlinked"] = sorted(set(rec["live_unlinked"]) | unlinked_live)
        fam.managers.update(reap())
        rec.update(wait_reclaimed([fam], deadline_s)[0])
    except Exception as exc:  # noqa: BLE001 - a stuck trial is a finding, not a crash
        rec.update(outcome=f"stuck: {type(exc).__name__}: {exc}", files_left=fam.files(),
                   managers_left=fam.live_managers())
    finally:
        if fault is not None:
            with contextlib.suppress(Exception):
                rec["fault"] = fault.stop()
        fam.close()
    reap()
    if watcher is not None:
        watcher.close(timeout=0.0 if rec.get("managers_left") else 2.0)
        exiting = watcher.exiting
        if exiting and exiting.get("reason"):  # shutdown(crash=...) says what it caught
            rec["crash"] = f"exiting: {exiting['reason']}"
    code = exit_codes.get(mpid)
    rec["manager_exit"] = code
    if code not in (None, 0) and not rec.get("managers_left"):
        rec["crash"] = rec["crash"] or f"exit status {code}"
    return rec


def summarize_faults(records: list[dict]) -> dict[str, dict]:
    """Per fault kind: trials, live segments unlinked, leaked files, crashes, stuck trials,
    bad data, managers still there after 10 s more, and the transient errors seen."""
    table: dict[str, dict] = {}
    for r in records:
        row = table.setdefault(r["kind"], dict.fromkeys(
            ("trials", "live_unlinked", "leaked", "crashes", "stuck", "bad_data",
             "managers_stuck", "exits_seen", "alloc_errors", "get_errors", "rounds"), 0))
        row["trials"] += 1
        row["live_unlinked"] += len(r.get("live_unlinked", ()))
        row["leaked"] += len(r.get("files_left", ()))
        row["crashes"] += bool(r.get("crash"))
        row["stuck"] += r["outcome"].startswith("stuck")
        row["bad_data"] += r["outcome"].startswith("bad")
        row["managers_stuck"] += (len(r.get("managers_left", ()))
                                  if not r.get("left_on_their_own") else 0)
        row["exits_seen"] += r.get("manager_exit") is not None  # reaped: status known
        for key in ("alloc_errors", "get_errors", "rounds"):
            row[key] += r.get(key, 0)
    return dict(sorted(table.items()))


def failures(row: dict) -> int:
    """What makes the exit status nonzero (transient errors during a fault do not)."""
    return sum(row[k] for k in ("live_unlinked", "leaked", "crashes", "stuck", "bad_data",
                                "managers_stuck"))

