"""The doctor's diagnosis: every check in order, the report (text and JSON), and the clean.

    checks.py  Finding; versions, start method, strategy, fd limit, /dev/shm
    leaks.py   leaked segments, orphaned managers, orphans' deleted fds

``python -m shmlab doctor`` (``shmlab.tools.doctor``) and the ``DoctorReport`` widget both
show what ``diagnose`` finds. Everything here reads, except ``clean``: it removes only the
segments a diagnosis marked ``cleanable``, after checking each again, and only when the user
asked for it (``--clean``, or the widget's "Remove them"); it never signals a process.

Mirrors: nothing (a tool); it reads the state torch/lib/libshm and shmlab leave behind.
"""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

from .. import introspect
from ..messages import tr
from .checks import SEVERITIES, Finding, machine
from .leaks import MIN_AGE_S, leaks

SCHEMA_PATH = Path(__file__).with_name("doctor.schema.json")
SCHEMA_VERSION = 1
_MARK = {"ok": "✅", "info": "ℹ️ ", "warn": "⚠️ ", "error": "❌"}


def diagnose(shm_dir: str = introspect.SHM_DIR, min_age_s: float = MIN_AGE_S) -> list[Finding]:
    """Every check, machine first, then leaks."""
    return [*machine(shm_dir), *leaks(shm_dir, min_age_s=min_age_s)]


def exit_status(findings: list[Finding]) -> int:
    return 1 if any(f.needs_action for f in findings) else 0


def report(findings: list[Finding], shm_dir: str = introspect.SHM_DIR,
           cleaned: dict | None = None) -> dict:
    """The JSON report (doctor.schema.json)."""
    counts = {s: sum(f.severity == s for f in findings) for s in SEVERITIES}
    return {"tool": "shmlab doctor", "schema_version": SCHEMA_VERSION, "time": time.time(),
            "shm_dir": shm_dir, "exit_status": exit_status(findings), "counts": counts,
            "findings": [{"check": f.check, "severity": f.severity, "message": f.message,
                          "fix": f.fix, "details": f.details} for f in findings],
            "cleaned": cleaned}


def render(findings: list[Finding]) -> str:
    """The text report: one line per finding, '<mark> <severity> <check>: <message> -> fix'."""
    lines = []
    for f in findings:
        fix = tr("  ->  fix: {fix}", fix=f.fix) if f.fix else ""
        lines.append(f"{_MARK[f.severity]} {f.severity:<5} {f.check}: {f.message}{fix}")
    todo = sum(f.needs_action for f in findings)
    lines.append(tr("{n} finding(s) need action.", n=todo) if todo
                 else tr("Nothing needs action."))
    return "\n".join(lines)


def cleanable(findings: list[Finding]) -> list[dict]:
    """The details of the segments --clean may remove."""
    return [f.details for f in findings if f.check == "segment" and f.details.get("cleanable")]


def _still_safe(item: dict) -> str | None:
    """Why ``item`` must not be removed now (None: safe). Checked just before the unlink."""
    try:
        st = os.lstat(item["path"])
    except FileNotFoundError:
        return "already gone"
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
        return "no longer a regular file of ours"
    table = introspect.process_table()
    if item["creator_pid"] is not None and introspect.alive_since(item["creator_pid"],
                                                                  st.st_ctime, table):
        return f"creator pid {item['creator_pid']} is alive"
    path = item["path"]
    users = introspect.mapped_by([path], table=table)[path] + introspect.held_by(
        [path], table=table)[path]
    return f"now used by pid(s) {sorted(set(users))}" if users else None


def clean(items: list[dict]) -> dict:
    """Remove each of ``items`` (cleanable() details) that is still safe to; signal nobody."""
    removed, skipped, freed = [], [], 0
    for item in items:
        why = _still_safe(item)
        if why is None:
            try:
                size = os.lstat(item["path"]).st_size
                os.unlink(item["path"])
            except OSError as exc:
                why = str(exc)
            else:
                removed.append(item["name"])
                freed += size
                continue
        skipped.append({"name": item["name"], "reason": why})
    return {"removed": removed, "skipped": skipped, "bytes_freed": freed}
