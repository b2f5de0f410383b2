"""``python -m shmlab labs release [--student DIR] | grade NOTEBOOK... | hash DIR |
nbgrader-course DIR``."""

from __future__ import annotations

import argparse
import json
import os
import sys

from . import export, integrity
from . import grade as grading
from . import release as releasing


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m shmlab labs")
    sub = parser.add_subparsers(dest="command", required=True)
    rel = sub.add_parser("release", help="write the learner copies (into labs/) from the "
                                          "instructor copies in shmlab/labs/source/")
    rel.add_argument("--out", default=str(releasing.LEARNER_DIR), metavar="DIR",
                     help="where the learner copies go (default: labs/ of this directory)")
    rel.add_argument("--check", action="store_true",
                     help="write nothing; exit 1 if a learner copy is out of date")
    rel.add_argument("--student", metavar="DIR",
                     help="write a student bundle into DIR: the learner copies and a README, "
                          "no instructor copy, hash list or solution")
    nbg = sub.add_parser("nbgrader-course", help="lay out DIR/source/<lab>/<lab>.ipynb and "
                                                 "nbgrader_config.py for nbgrader")
    nbg.add_argument("dir")
    gr = sub.add_parser("grade", help="grade learner notebooks against the instructor copies "
                                      "(each exercise in a fresh process; see grade.py's Note)")
    gr.add_argument("notebooks", nargs="+")
    gr.add_argument("--json", action="store_true", help="print the scores as JSON")
    gr.add_argument("--timeout", type=float, default=120, help="seconds per cell (default 120)")
    gr.add_argument("--notebook-timeout", type=float, default=900,
                    help="seconds per notebook, all its exercises together (default 900)")
    gr.add_argument("--source", default=str(releasing.SOURCE), metavar="DIR",
                    help="the instructor copies to grade against, with their SHA256SUMS "
                         "(default: the ones shipped in the package)")
    hs = sub.add_parser("hash", help="record the hashes of the instructor copies in DIR "
                                     "(after editing them on purpose)")
    hs.add_argument("dir")
    args = parser.parse_args(argv)

    if args.command == "hash":
        print(f"wrote {integrity.write_sums(args.dir)}")
        return 0

    if args.command == "nbgrader-course":
        for path in export.nbgrader_course(args.dir):
            print(f"wrote {path}")
        return 0
    if args.command == "release" and args.student:
        for path in export.student_bundle(args.student):
            print(f"wrote {path}")
        return 0
    if args.command == "release":
        if args.check:
            stale = releasing.out_of_date(out_dir=args.out)
            for name in stale:
                print(f"out of date: {os.path.join(args.out, name)} "
                      f"(run: python -m shmlab labs release)")
            return 1 if stale else 0
        for path in releasing.release(out_dir=args.out):
            print(f"wrote {path}")
        return 0

    try:
        results = grading.grade_batch(args.notebooks, args.source, args.timeout,
                                      args.notebook_timeout)
    except integrity.IntegrityError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.json:
        json.dump([r.as_dict() for r in results], sys.stdout, indent=1)
        print()
    else:
        for r in results:
            grading.print_table(r)
    # Full marks only: a notebook that could not be graded (misnamed, unreadable) scores 0/0.
    return 0 if all(not r.problem and r.score == r.max_score for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
