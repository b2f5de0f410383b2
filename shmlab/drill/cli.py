"""The terminal mode: `python -m shmlab drill` asks a few cards, you grade yourself.

Each card: the question is printed; type your answer (or just think it) and press Enter; the
answer, the common wrong answer and the notebook section that proves it are printed (with
SHMLAB_LANG=zh or --lang zh: in Chinese, and the section of the Chinese notebook); grade it
1 again, 2 hard, 3 good, 4 easy (or the word), q to stop. State is saved after every grade (see
shmlab.drill.state), so the next session picks up where this one stopped. Reads plain lines from
stdin, so it can be scripted: `printf '\\n3\\n' | python -m shmlab drill --cards 1`. The prompts
are in shmlab's language (``SHMLAB_LANG=zh``: Note [Which language a message is in]); ``--lang``
alone chooses the cards' text.
"""

from __future__ import annotations

import argparse
import sys

from ..messages import language, tr
from . import bank, export, notebooks, state
from .deck import Deck
from .schedule import GRADES

KEYS = {"1": "again", "2": "hard", "3": "good", "4": "easy", **{g: g for g in GRADES}}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m shmlab drill", description=__doc__.split("\n")[0])
    p.add_argument("--cards", type=int, default=5, help="cards this session (default 5)")
    p.add_argument("--lang", choices=("en", "zh", "both"), default=None,
                   help="default: zh where SHMLAB_LANG=zh (the Chinese edition), else both")
    p.add_argument("--question", action="append", choices=bank.QUESTIONS,
                   help="only cards of this handout question (repeatable)")
    p.add_argument("--seed", type=int, default=0, help="order of new cards (default 0)")
    p.add_argument("--export", nargs=2, metavar=("csv|anki", "FILE"),
                   help="write every card to FILE instead of drilling")
    p.add_argument("--progress", action="store_true", help="print progress per question, exit")
    return p


def show_progress(deck: Deck, out) -> None:
    for question, row in deck.progress().items():
        bar = "#" * row["known"] + "+" * (row["seen"] - row["known"])
        bar += "." * (row["total"] - row["seen"])
        print(f"{question:>6} {bar} " + tr("{known}/{total} known", known=row["known"],
                                             total=row["total"]), file=out)


def ask(card, lang: str, read, out) -> str | None:
    """One card; returns the grade, or None if the learner quits (q or end of input)."""
    print(f"\n[{card.question} · {card.level}] {card.text('prompt', lang)}", file=out)
    if read(tr("your answer (Enter to reveal)> ")) is None:
        return None
    print(f"\n{card.text('answer', lang)}", file=out)
    print(f"\n✗ {card.text('wrong', lang)}\n  → {card.text('why_wrong', lang)}", file=out)
    sep = "、" if language() == "zh" else ", "  # a Chinese list takes the enumeration comma
    cites = tr(" (claims {claims})", claims=sep.join(card.claims)) if card.claims else ""
    # from the repository's root, where this command runs: notebooks/zh/ in Chinese
    link = notebooks.href(card.link, lang, here=notebooks.NOTEBOOKS.parent)
    print("\n" + tr("see {link}{cites}", link=link, cites=cites), file=out)
    while True:
        line = read(tr("grade: 1 again, 2 hard, 3 good, 4 easy (q quits)> "))
        if line is None or line.strip().lower() in ("q", "quit"):
            return None
        if line.strip().lower() in KEYS:
            return KEYS[line.strip().lower()]
        print(tr("type 1, 2, 3 or 4"), file=out)


def drill(deck: Deck, lang: str, stdin, out) -> int:
    def read(prompt):
        print(prompt, end="", file=out, flush=True)
        line = stdin.readline()
        return None if line == "" else line

    while (card := deck.current()) is not None:
        grade = ask(card, lang, read, out)
        if grade is None:
            break
        deck.grade(grade)
    deck.save()
    print("\n" + tr("{n} card(s) graded; saved to {path}", n=deck.answered,
                    path=state.path()), file=out)
    show_progress(deck, out)
    return 0


def main(argv=None, stdin=None, out=None) -> int:
    args = parser().parse_args(argv)
    stdin, out = stdin or sys.stdin, out or sys.stdout
    if args.export:
        kind, path = args.export
        writers = {"csv": export.to_csv, "anki": export.to_anki}
        if kind not in writers:
            parser().error("--export takes csv or anki")
        n = writers[kind](bank.load(), path)
        print(tr("wrote {n} cards to {path}", n=n, path=path), file=out)
        return 0
    deck = Deck(seed=args.seed, questions=args.question, limit=args.cards)
    if args.progress:
        show_progress(deck, out)
        return 0
    try:
        lang = args.lang or ("zh" if language() == "zh" else "both")
    except ValueError as e:  # a bad SHMLAB_LANG
        parser().error(str(e))
    return drill(deck, lang, stdin, out)
