"""Keep the bank's follow-up cards in step with the notebooks' follow-up sections.

The notebooks are the source of the follow-ups' English text; the bank adds the Chinese, the
wrong answers and the links. `python -m shmlab.drill.sync` compares the two and, with --write,
copies changed English text into bank.json (a reworded question too, when a notebook has as many
new questions as cards whose question is gone: they are paired in order). It never touches a
notebook, and it never invents a card: a follow-up with no card yet, or a card whose follow-up is
gone, is reported for a person to write or remove (the Chinese must be written by hand anyway).
Exit status 1 while anything differs, so it doubles as a check.
"""

from __future__ import annotations

import argparse
import json
import sys
from importlib import resources

from . import bank, notebooks


def differences(raw: dict, follow_ups) -> tuple[list, list, list]:
    """(changed, missing, orphaned): cards whose English differs from their follow-up (with the
    follow-up), follow-ups with no card, and follow-up cards whose question is gone."""
    by_text = {(f.notebook, f.question): f for f in follow_ups}
    cards = [c for c in raw["cards"] if c.get("follow_up")]
    covered, changed, orphaned = set(), [], []
    for card in cards:
        key = (card["follow_up"], card["prompt"]["en"])
        if key in by_text:
            covered.add(key)
            if by_text[key].answer != card["answer"]["en"]:
                changed.append((card, by_text[key]))
        else:
            orphaned.append(card)
    missing = [f for key, f in by_text.items() if key not in covered]
    return changed, missing, orphaned


def pair_reworded(missing, orphaned) -> list:
    """(card, follow-up) pairs for questions reworded in place: where a notebook has as many
    new questions as cards whose question is gone, they are paired in order."""
    pairs = []
    for name in sorted({f.notebook for f in missing}):
        new = [f for f in missing if f.notebook == name]
        old = [c for c in orphaned if c["follow_up"] == name]
        if len(new) == len(old):
            pairs += list(zip(old, new, strict=True))
    return pairs


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m shmlab.drill.sync", description=__doc__)
    p.add_argument("--write", action="store_true", help="copy changed English text")
    args = p.parse_args(argv)
    raw = bank.raw()
    changed, missing, orphaned = differences(raw, notebooks.all_follow_ups())
    for card, f in changed:
        print(f"changed: {card['id']} ({f.notebook}): review its Chinese too")
        if args.write:
            card["answer"]["en"] = f.answer
    reworded = pair_reworded(missing, orphaned)
    for card, f in reworded:
        print(f"reworded: {card['id']} ({f.notebook}): {f.question!r}; review its Chinese too")
        if args.write:
            card["prompt"]["en"], card["answer"]["en"] = f.question, f.answer
    if args.write:
        missing = [f for f in missing if all(f is not g for _, g in reworded)]
        orphaned = [c for c in orphaned if all(c is not d for d, _ in reworded)]
    for f in missing:
        print(f"no card: {f.notebook}: {f.question}")
    for card in orphaned:
        print(f"gone from {card['follow_up']}: {card['id']}: {card['prompt']['en']}")
    if args.write and (changed or reworded):
        target = resources.files(__package__).joinpath("bank.json")
        with open(target, "w", encoding="utf-8") as f:
            f.write(json.dumps(raw, ensure_ascii=False, indent=1) + "\n")
    return 1 if (changed and not args.write) or missing or orphaned else 0


if __name__ == "__main__":
    sys.exit(main())
