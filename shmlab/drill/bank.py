"""The question bank: load bank.json into Card objects.

One card is one interview question with its answer in English and Chinese, the wrong answer
candidates most often give (and why it is wrong), the handout question it belongs to (Q1-Q5 or
"beyond") and a link to the notebook section that demonstrates the answer. The file's shape is
pinned by bank.schema.json (a test validates it with jsonschema); :func:`load` checks only what
the drill needs, so the package does not depend on jsonschema at run time.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources

QUESTIONS = ("Q1", "Q2", "Q3", "Q4", "Q5", "beyond")
LEVELS = ("junior", "senior")
LANGUAGES = ("en", "zh")
TEXTS = ("prompt", "answer", "wrong", "why_wrong")  # each is {"en": ..., "zh": ...}


@dataclass(frozen=True)
class Card:
    id: str
    question: str          # "Q1".."Q5" or "beyond"
    level: str             # "junior" or "senior"
    prompt: dict           # {"en": ..., "zh": ...}
    answer: dict
    wrong: dict            # a common wrong answer ...
    why_wrong: dict        # ... and why it is wrong
    link: str              # "04_file_descriptor_strategy.ipynb#Step-3-·-..."
    follow_up: str | None = None  # the notebook whose follow-up section this card copies
    claims: tuple = ()    # the fact-base claim ids its answer and why_wrong rest on

    def text(self, field: str, lang: str) -> str:
        """One text in one language ("en", "zh"), or both, English first ("both")."""
        value = getattr(self, field)
        if lang == "both":
            return f"{value['en']}\n{value['zh']}"
        return value[lang]


def raw(path=None) -> dict:
    """The bank file as parsed JSON (the packaged bank.json unless `path` is given)."""
    if path is None:
        text = resources.files(__package__).joinpath("bank.json").read_text(encoding="utf-8")
    else:
        text = open(path, encoding="utf-8").read()
    return json.loads(text)


def schema() -> dict:
    text = resources.files(__package__).joinpath("bank.schema.json").read_text(encoding="utf-8")
    return json.loads(text)


def load(path=None) -> list[Card]:
    """Every card of the bank, in file order; ValueError names the first card that is broken."""
    cards, seen = [], set()
    for entry in raw(path)["cards"]:
        card = Card(**{**entry, "claims": tuple(entry.get("claims", ()))})
        if card.id in seen or card.question not in QUESTIONS or card.level not in LEVELS:
            raise ValueError(f"card {card.id!r}: duplicate id, or bad question/level")
        if any(set(getattr(card, f)) != set(LANGUAGES) for f in TEXTS):
            raise ValueError(f"card {card.id!r}: every text needs exactly 'en' and 'zh'")
        seen.add(card.id)
        cards.append(card)
    return cards
