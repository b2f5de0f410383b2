"""The drill's question bank: its schema, its links, its Chinese, and its sync with the notebooks.

bank.json is validated against bank.schema.json; every card links to a heading that exists (as
the anchor JupyterLab gives it); every follow-up question of every notebook is a card, word for
word (the notebooks are the source of the follow-ups' English, shmlab.drill.sync copies changes);
the Chinese text uses full-width punctuation outside code.
"""

from __future__ import annotations

import collections
import re

import jsonschema
import pytest

from shmlab.drill import bank, notebooks, sync

CARDS = bank.load()
CJK = r"[\u4e00-\u9fff]"
# half-width , ; ? ! anywhere outside code, and : ( ) right next to a Chinese character
HALF_WIDTH = re.compile(rf"[,;?!]|(?<={CJK})[:()]|[:()](?={CJK})")


def test_the_bank_matches_its_schema():
    jsonschema.validate(bank.raw(), bank.schema())


def test_the_schema_rejects_a_card_without_chinese():
    broken = bank.raw()
    del broken["cards"][0]["answer"]["zh"]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, bank.schema())


def test_at_least_80_cards_cover_every_question_at_both_levels():
    counts = collections.Counter((c.question, c.level) for c in CARDS)
    assert len(CARDS) >= 80
    for question in ("Q1", "Q2", "Q3", "Q4", "Q5"):
        for level in bank.LEVELS:
            assert counts[question, level] >= 3, (question, level, counts)


def test_card_ids_are_unique_and_name_their_question():
    ids = [c.id for c in CARDS]
    assert len(ids) == len(set(ids))
    assert all(c.id.startswith(c.question.lower() + "-") for c in CARDS)


def test_every_link_points_at_a_heading_that_exists():
    anchors = notebooks.anchors()
    broken = [(c.id, c.link) for c in CARDS if c.link not in anchors]
    assert not broken, broken


def test_anchor_is_what_jupyterlab_renders():
    assert notebooks.anchor("Step 3 · `shm_open`, then **unlink** at once") == \
        "Step-3-·-shm_open,-then-unlink-at-once"


def test_every_notebook_follow_up_is_in_the_bank_word_for_word():
    found = notebooks.all_follow_ups()
    assert len(found) >= 50
    assert {f.notebook[:2] for f in found} >= {f"0{i}" for i in range(1, 10)}
    changed, missing, orphaned = sync.differences(bank.raw(), found)
    assert not missing, "write a card for: " + "; ".join(f.question for f in missing)
    assert not orphaned, [c["id"] for c in orphaned]
    assert not changed, ("run `python -m shmlab.drill.sync --write`, then review the Chinese: "
                         + ", ".join(c["id"] for c, _ in changed))


def test_sync_notices_a_changed_missing_and_removed_follow_up():
    found = notebooks.all_follow_ups()
    raw = bank.raw()
    first = next(c for c in raw["cards"] if c.get("follow_up"))
    first["answer"]["en"] += " (edited)"
    fake = notebooks.FollowUp("99_x.ipynb", "A new question?", "An answer.")
    changed, missing, orphaned = sync.differences(raw, [*found, fake])
    assert [c["id"] for c, _ in changed] == [first["id"]] and missing == [fake] and not orphaned
    raw["cards"][0]["prompt"]["en"] = "Reworded?"
    raw["cards"][0]["follow_up"] = raw["cards"][0].get("follow_up") or "01_x.ipynb"
    assert sync.differences(raw, found)[2]


def _outside_code(text: str) -> str:
    return re.sub(r"`[^`]*`", "", text)


@pytest.mark.parametrize("field", bank.TEXTS)
def test_chinese_uses_full_width_punctuation(field):
    bad = []
    for c in CARDS:
        zh = _outside_code(c.text(field, "zh"))
        if not re.search(CJK, zh):
            bad.append((c.id, "no Chinese"))
        for m in HALF_WIDTH.finditer(zh):
            bad.append((c.id, zh[max(0, m.start() - 8):m.end() + 8]))
    assert not bad, bad
