"""A drill session: the bank, a scheduler and the saved state, wired together.

The terminal mode and the Quiz widget both drive a Deck: `current()` is the card to ask,
`grade(g)` records the answer, saves the state and moves on. `clock` is a function returning
seconds (time.time by default; tests pass a fake one).
"""

from __future__ import annotations

import time

from . import bank, state
from .schedule import Scheduler


class Deck:
    def __init__(self, cards=None, seed=0, questions=None, clock=time.time, limit=None):
        self.all_cards = cards if cards is not None else bank.load()
        self.cards = {c.id: c for c in self.all_cards
                      if not questions or c.question in questions}
        saved = state.load()
        self.sessions = saved["sessions"] + 1
        self.scheduler = Scheduler(self.cards, saved["cards"], seed=seed, kinds={
            c.id: (c.question, c.level) for c in self.cards.values()})
        self.clock = clock
        self.limit = limit          # at most this many answers this session (None: no limit)
        self.answered = 0
        self._current = self._pick()

    def _pick(self):
        if self.limit is not None and self.answered >= self.limit:
            return None
        card_id = self.scheduler.next_card(self.clock())
        return self.cards[card_id] if card_id else None

    def current(self):
        """The card to ask now, or None when the session is over."""
        return self._current

    def grade(self, grade: str):
        """Grade the current card, save, and return the next one (or None)."""
        card = self._current
        if card is None:
            raise RuntimeError("the session is over: no card to grade")
        self.scheduler.grade(card.id, grade, self.clock())
        self.answered += 1
        self.save()
        self._current = self._pick()
        return self._current

    def save(self):
        return state.save(self.scheduler.state, self.sessions)

    def progress(self) -> dict:
        """{question: {"total", "seen", "known"}} over the whole bank, in Q1..beyond order."""
        everything = Scheduler([c.id for c in self.all_cards], self.scheduler.state)
        rows = everything.progress({c.id: c.question for c in self.all_cards})
        return {q: rows[q] for q in bank.QUESTIONS if q in rows}
