"""``python -m shmlab.facts render|merge|check``: the fact base's commands.

Mirrors: nothing in torch; the project's fact base.

    render [--check]        write docs/CLAIMS.md from claims.json (--check: only say if stale)
    merge [--replace] [FILE ...]   fold shmlab/facts/new/*.json (or FILEs) into claims.json
    check                   validate the registry; list claims nothing asserts, narrowed ones
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from shmlab.facts import coverage, registry
from shmlab.facts.assertions import all_assertions
from shmlab.facts.merge import merge_files
from shmlab.facts.registry import FactBaseError
from shmlab.facts.render import CLAIMS_MD, render_repo


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m shmlab facts",
                                description="The fact base: shmlab/facts/claims.json.")
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("render", help="write docs/CLAIMS.md from the registry")
    r.add_argument("--check", action="store_true", help="write nothing; exit 1 if it is stale")
    m = sub.add_parser("merge", help="fold shmlab/facts/new/*.json into claims.json")
    m.add_argument("files", nargs="*", type=Path, help="new-claims files (default: new/*.json)")
    m.add_argument("--replace", action="store_true",
                   help="let a new file's claim replace the registry's claim of the same id")
    sub.add_parser("check", help="validate; list unasserted and narrowed claims")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        if args.command == "merge":
            log = merge_files(args.files or None, replace=args.replace)
            print("\n".join(log) if log else "nothing new to merge")
            if log:
                print("now run: python -m shmlab.facts render")
            return 0
        if args.command == "render":
            text = render_repo()
            stale = not CLAIMS_MD.is_file() or CLAIMS_MD.read_text(encoding="utf-8") != text
            if args.check:
                print(f"{CLAIMS_MD.name} is {'stale' if stale else 'up to date'}")
                return int(stale)
            CLAIMS_MD.write_text(text, encoding="utf-8")
            print(f"wrote {CLAIMS_MD}")
            return 0
        claims = registry.load()
        assertions, problems = all_assertions()
        problems += [f"no assertion: {cid}" for cid in coverage.unasserted(claims, assertions)]
        problems += [f"unknown id: {x}" for x in coverage.unknown_ids(claims, assertions)]
        problems += [f"narrowed: {cid} lacks {', '.join(m)}"
                     for cid, m in coverage.narrowed(claims, assertions).items()]
        print("\n".join(problems) if problems else f"{len(claims)} claims, all asserted")
        return int(bool(problems))
    except FactBaseError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
