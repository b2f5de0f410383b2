"""``python -m shmlab doctor``: read this machine's shared-memory health, say what to fix.

    python -m shmlab doctor [--json] [--clean [--yes]] [--shm-dir DIR] [--min-age S]

One line per finding, with its severity (ok, info, warn, error) and the fix; the exit status
is 1 when something needs action (a warn or an error), else 0; 2 for bad usage. ``--json``
prints the same report for machines (its schema: shmlab/introspect/doctor.schema.json).

The doctor changes nothing unless told. ``--clean`` removes only segments that no live
process maps or holds, whose creator is gone, that are older than --min-age and owned by the
current user; it shows the list first and asks (``--yes`` skips the question), checks each
file again just before removing it, reports the bytes freed, and never signals a process.

The diagnosis, the report and the clean are ``shmlab.introspect.doctor``'s (the
``DoctorReport`` widget shows the same); this module is the command line around them.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from .. import introspect
from ..introspect.checks import mib
from ..introspect.doctor import clean, cleanable, diagnose, exit_status, render, report
from ..introspect.leaks import MIN_AGE_S
from ..messages import tr


def show_list(items: list[dict], out) -> None:
    """What --clean is about to remove: always shown, with or without --yes."""
    print(tr("--clean: {n} leaked segment(s) of yours, {size}, no process maps or holds them "
             "and their creators are gone:", n=len(items),
             size=mib(sum(i["size"] for i in items))), file=out)
    for i in items:
        print(f"  {i['path']}  " + tr("{size:,} bytes, creator pid {pid}, {age:.0f} s old",
                                      size=i["size"], pid=i["creator_pid"], age=i["age_s"]),
              file=out)


def _confirm(out) -> bool:
    """Ask on ``out`` (stderr with --json, so stdout stays pure JSON); no terminal: no."""
    if not sys.stdin.isatty():
        print(tr("stdin is not a terminal: nothing removed (add --yes to remove them)"),
              file=out)
        return False
    print(tr("Remove them? [y/N] "), end="", file=out, flush=True)
    return sys.stdin.readline().strip().lower() in ("y", "yes")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m shmlab doctor", description=__doc__.split(
        "\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--clean", action="store_true",
                        help="remove leaked segments of yours that nobody uses (asks first)")
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
            print(tr("removed {n} segment(s), freed {freed:,} bytes; skipped {skipped}",
                     n=len(cleaned["removed"]), freed=cleaned["bytes_freed"],
                     skipped=len(cleaned["skipped"])), file=talk)
            findings = diagnose(args.shm_dir, args.min_age)  # report what is left
        elif not items:
            print(tr("--clean: no leaked segment of yours is safe to remove"), file=talk)
    if args.json:
        print(json.dumps(report(findings, args.shm_dir, cleaned), indent=2))
    else:
        print(render(findings))
    return exit_status(findings)


if __name__ == "__main__":
    sys.exit(main())
