"""``python -m shmlab doctor``: read this machine's shared-memory health, say what to fix.

    python -m shmlab doctor [--json] [--clean [--yes]] [--shm-dir DIR] [--min-age S]

One line per finding, with its severity (ok, info, warn, error) and the fix; the exit status
is 1 when something needs action (a warn or an error), else 0; 2 for bad usage. ``--json``
prints the same report for machines (its schema: doctor.schema.json, next to this file).

The doctor changes nothing unless told. ``--clean`` removes only segments that no live
process maps or holds, whose creator is gone, that are older than --min-age and owned by the
current user; it shows the list first and asks (``--yes`` skips the question), checks each
file again just before removing it, reports the bytes freed, and never signals a process.

    doctor_checks.py  Finding; versions, start method, strategy, fd limit, /dev/shm
    doctor_leaks.py   leaked segments, orphaned managers, orphans' deleted fds
"""

from __future__ import annotations

import argparse
import json
import os
import stat
import sys
import time
from pathlib import Path

from .. import introspect
from .doctor_checks import SEVERITIES, Finding, machine, mib
from .doctor_leaks import MIN_AGE_S, leaks

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
        fix = f"  ->  fix: {f.fix}" if f.fix else ""
        lines.append(f"{_MARK[f.severity]} {f.severity:<5} {f.check}: {f.message}{fix}")
    todo = sum(f.needs_action for f in findings)
    lines.append(f"{todo} finding(s) need action." if todo else "Nothing needs action.")
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


def show_list(items: list[dict], out) -> None:
    """What --clean is about to remove: always shown, with or without --yes."""
    print(f"--clean: {len(items)} leaked segment(s) of yours, {mib(sum(i['size'] for i in items))}"
          ", no process maps or holds them and their creators are gone:", file=out)
    for i in items:
        print(f"  {i['path']}  {i['size']:,} bytes, creator pid {i['creator_pid']}, "
              f"{i['age_s']:.0f} s old", file=out)


def _confirm(out) -> bool:
    """Ask on ``out`` (stderr with --json, so stdout stays pure JSON); no terminal: no."""
    if not sys.stdin.isatty():
        print("stdin is not a terminal: nothing removed (add --yes to remove them)", file=out)
        return False
    print("Remove them? [y/N] ", end="", file=out, flush=True)
    return sys.stdin.readline().strip().lower() in ("y", "yes")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m shmlab doctor", description=__doc__.split(
        "\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--clean", action="store_true",
                        help="remove leaked segments of ours that nobody uses (asks first)")
    parser.add_argument("--yes", action="store_true", help="with --clean: do not ask")
    parser.add_argument("--shm-dir", default=introspect.SHM_DIR,
                        help=f"the folder to look for segments in (default {introspect.SHM_DIR})")
    parser.add_argument("--min-age", type=float, default=MIN_AGE_S, metavar="S",
                        help=f"leave segments younger than S seconds alone (default {MIN_AGE_S})")
    args = parser.parse_args(argv)
    if args.yes and not args.clean:
        parser.error("--yes only makes sense with --clean")
    if not os.path.isdir(args.shm_dir):
        parser.error(f"--shm-dir {args.shm_dir!r} is not a folder")
    if not args.min_age >= 0:
        parser.error("--min-age must be a number of seconds >= 0")
    return args


def main(argv: list[str] | None = None) -> int:
    """Run the doctor; returns the exit status."""
    args = parse_args(argv)
    findings = diagnose(args.shm_dir, args.min_age)
    cleaned = None
    if args.clean:
        items = cleanable(findings)
        talk = sys.stderr if args.json else sys.stdout  # keep stdout pure JSON
        if items:
            show_list(items, talk)
        if items and (args.yes or _confirm(talk)):
            cleaned = clean(items)
            print(f"removed {len(cleaned['removed'])} segment(s), freed "
                  f"{cleaned['bytes_freed']:,} bytes; skipped {len(cleaned['skipped'])}",
                  file=talk)
            findings = diagnose(args.shm_dir, args.min_age)  # report what is left
        elif not items:
            print("--clean: no leaked segment of ours is safe to remove", file=talk)
    if args.json:
        print(json.dumps(report(findings, args.shm_dir, cleaned), indent=2))
    else:
        print(render(findings))
    return exit_status(findings)


if __name__ == "__main__":
    sys.exit(main())
