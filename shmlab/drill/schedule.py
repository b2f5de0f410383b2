"""Leitner-box scheduling: which card comes next, and when a graded card comes back.

Every card sits in a box, 1 to 5; a card never seen is in no box yet. Grading moves it:

    again -> box 1, due again in AGAIN_DELAY seconds (later in this same session)
    hard  -> stays in its box, due after half the box's interval
    good  -> one box up,  due after that box's interval
    easy  -> two boxes up, due after that box's interval

so a card graded "again" always comes back before one graded "easy". The intervals double-ish
from 1 day (box 1 after a first "good") to 3 weeks (box 5). Time is a number of seconds passed
in by the caller (`now`), never read here, so tests run the calendar forward by hand.

Which card next: the most overdue due card; if none is due, a new card, in an order shuffled
once by `seed` (so two schedulers with the same seed and the same grades ask the same cards in
the same order). Given each card's question and level (`kinds`), a fresh deck asks the
foundation (junior) cards first, taking the questions in turn (Q3, Q1, Q5, Q2, ...), so the first
few cards are neither all about one question nor the hard ones; then the senior cards the same
way. If there is no new card either, the card due soonest within LOOK_AHEAD seconds
(an "again" card of this session). Otherwise the session is done for today.
"""

from __future__ import annotations

import random

GRADES = ("again", "hard", "good", "easy")
DAY = 86400.0
INTERVALS = {1: 1 * DAY, 2: 3 * DAY, 3: 7 * DAY, 4: 14 * DAY, 5: 21 * DAY}
AGAIN_DELAY = 60.0
LOOK_AHEAD = 20 * 60.0
KNOWN_BOX = 3  # a card in box 3 or higher counts as known in the progress chart


class Scheduler:
    """The review state of a deck. `state` maps card id -> {"box", "due", "reviews", "last"}
    and is plain JSON, so it is what shmlab.drill.state saves."""

    def __init__(self, card_ids, state=None, seed=0, kinds=None):
        self.ids = list(card_ids)
        self.state = {k: dict(v) for k, v in (state or {}).items()}
        self.new_order = sorted(self.ids)
        random.Random(seed).shuffle(self.new_order)
        if kinds:  # {card id: (question, level)}: foundations first, questions in turn
            self.new_order = interleave(self.new_order, kinds)

    def grade(self, card_id: str, grade: str, now: float) -> dict:
        """Record one answer; returns the card's new state."""
        if grade not in GRADES:
            raise ValueError(f"grade must be one of {GRADES}, not {grade!r}")
        old = self.state.get(card_id, {"box": 1, "reviews": 0})
        box = old["box"]
        if grade == "again":
            box, delay = 1, AGAIN_DELAY
        elif grade == "hard":
            delay = INTERVALS[box] / 2
        else:
            box = min(5, box + (1 if grade == "good" else 2))
            delay = INTERVALS[box]
        new = {"box": box, "due": now + delay, "reviews": old["reviews"] + 1, "last": grade}
        self.state[card_id] = new
        return new

    def next_card(self, now: float, allow_new: bool = True) -> str | None:
        """The id of the card to ask now, or None when nothing is due (see the module doc)."""
        seen = [k for k in self.ids if k in self.state]
        due = sorted((self.state[k]["due"], k) for k in seen if self.state[k]["due"] <= now)
        if due:
            return due[0][1]
        if allow_new:
            for k in self.new_order:
                if k not in self.state:
                    return k
        soon = sorted((self.state[k]["due"], k) for k in seen
                      if self.state[k]["due"] <= now + LOOK_AHEAD)
        return soon[0][1] if soon else None

    def progress(self, question_of: dict) -> dict:
        """Per handout question: {"total", "seen", "known"} (known = box >= KNOWN_BOX)."""
        out = {}
        for card_id, question in question_of.items():
            row = out.setdefault(question, {"total": 0, "seen": 0, "known": 0})
            row["total"] += 1
            if card_id in self.state:
                row["seen"] += 1
                row["known"] += self.state[card_id]["box"] >= KNOWN_BOX
        return out


FOUNDATION = "junior"  # the level asked first in a fresh deck


def interleave(order: list, kinds: dict) -> list:
    """``order`` (already shuffled) regrouped: every foundation card before any other, and
    within each level one card per question in turn, the questions in order of first
    appearance (so the shuffle still decides which question comes first)."""
    out = []
    for foundation in (True, False):
        queues: dict = {}
        for k in order:
            question, level = kinds.get(k, ("", ""))
            if (level == FOUNDATION) == foundation:
                queues.setdefault(question, []).append(k)
        while any(queues.values()):
            for q in list(queues):
                if queues[q]:
                    out.append(queues[q].pop(0))
    return out
