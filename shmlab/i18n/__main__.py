"""``python -m shmlab.i18n extract|build|check``: the Chinese edition's catalog commands.

    extract   update i18n/zh_CN/{notebooks,labs}/<stem>.po from the English notebooks
    build     write notebooks/zh/ and labs/zh/ from the catalogs
    check     missing or stale translations, punctuation, terms, code; built files in step
"""

from __future__ import annotations

import argparse
import sys

from . import build as building
from . import catalog, checks


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m shmlab.i18n")
    parser.add_argument("--root", default=".", help="the repository's root (default: .)")
    parser.add_argument("--locale", default=catalog.LOCALE)
    sub = parser.add_subparsers(dest="command", required=True)
    ex = sub.add_parser("extract", help="add new cells to the catalogs, mark changed ones "
                                        "fuzzy (the old English kept as #| msgid)")
    ex.add_argument("stems", nargs="*", help="only these notebooks/labs (default: all)")
    sub.add_parser("build", help="write the translated notebooks and labs")
    ck = sub.add_parser("check", help="report what is missing, stale or against the rules; "
                                      "exit 1 if anything is")
    ck.add_argument("--all", action="store_true",
                    help="also list the missing cells of catalogs that translate nothing yet")
    args = parser.parse_args(argv)

    if args.command == "extract":
        for path, counts in catalog.extract(args.root, args.locale, set(args.stems)):
            print(f"{path}: {counts['added']} new, {counts['fuzzy']} fuzzy, "
                  f"{counts['obsolete']} obsolete")
        if not args.stems:
            path, counts = catalog.extract_messages(args.root, args.locale)
            print(f"{path}: {counts['added']} new, {counts['obsolete']} obsolete")
        return 0
    if args.command == "build":
        for path in building.build(args.root, args.locale):
            print(f"wrote {path}")
        return 0
    return _check(args)


def _check(args) -> int:
    terms = checks.load_terms(checks.terms_path(args.root, args.locale))
    built = building.built_stems(args.root, args.locale)
    problems = []
    for src in catalog.sources(args.root):
        started = src.stem in built
        if not started and not args.all:
            continue
        problems += checks.check_catalog(src, terms, args.locale, require_complete=True)
    for path in building.out_of_date(args.root, args.locale):
        problems.append(f"{path}: not in step with the catalog (run "
                        f"`python -m shmlab.i18n build`)")
    for p in problems:
        print(p)
    untranslated = sorted(s.rel for s in catalog.sources(args.root) if s.stem not in built)
    print(f"{len(built)} translated, {len(untranslated)} not started: "
          f"{', '.join(untranslated) or '-'}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
