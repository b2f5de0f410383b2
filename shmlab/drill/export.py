"""Take the bank elsewhere: a CSV file (any spreadsheet, Quizlet, ...) or an Anki deck (.apkg).

Both carry every card in both languages. The Anki deck has one note type, "shmlab drill", with a
field per text; the card's front shows the question in English and Chinese, the back adds the
answer, the common wrong answer and why it is wrong, and the notebook link. Model and deck ids
are fixed numbers and note GUIDs derive from card ids, so re-importing an updated deck updates the
notes instead of duplicating them.
"""

from __future__ import annotations

import csv
import html
import itertools
import json
import os
import sqlite3
import tempfile
import time
import zipfile

from . import bank

COLUMNS = ("id", "question", "level", "prompt_en", "prompt_zh", "answer_en", "answer_zh",
           "wrong_en", "wrong_zh", "why_wrong_en", "why_wrong_zh", "link")
MODEL_ID = 1_713_130_001  # fixed, chosen once: Anki matches note types and decks by id
DECK_ID = 1_713_130_002


def rows(cards):
    for c in cards:
        texts = {f"{f}_{lang}": getattr(c, f)[lang] for f in bank.TEXTS for lang in bank.LANGUAGES}
        yield {"id": c.id, "question": c.question, "level": c.level, "link": c.link, **texts}


def to_csv(cards, path) -> int:
    """Write one row per card (UTF-8 with a BOM, so spreadsheet programs read the Chinese)."""
    with open(path, "w", newline="", encoding="utf-8-sig") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        n = 0
        for row in rows(cards):
            writer.writerow(row)
            n += 1
    return n


FRONT = "{{prompt_en}}<br><span class=zh>{{prompt_zh}}</span>"
BACK = ("{{FrontSide}}<hr id=answer>{{answer_en}}<br><span class=zh>{{answer_zh}}</span>"
        "<p class=wrong>✗ {{wrong_en}} — {{why_wrong_en}}<br>"
        "<span class=zh>✗ {{wrong_zh}}——{{why_wrong_zh}}</span></p>"
        "<p class=link>{{link}}</p>")
CSS = ".card {font-family: sans-serif; font-size: 18px} .zh {color: #555} .wrong {color: #a33}"


def to_anki(cards, path) -> int:
    """Write an .apkg deck; needs genanki (a dependency of shmlab)."""
    import genanki

    fields = [name for name in COLUMNS]
    model = genanki.Model(MODEL_ID, "shmlab drill", fields=[{"name": n} for n in fields],
                          templates=[{"name": "Card", "qfmt": FRONT, "afmt": BACK}], css=CSS)
    deck = genanki.Deck(DECK_ID, "shmlab · torch.multiprocessing interview drill")
    n = 0
    for row in rows(cards):
        values = [html.escape(row[name]) for name in fields]
        deck.add_note(genanki.Note(model=model, fields=values, guid=genanki.guid_for(row["id"]),
                                   tags=[row["question"], row["level"]]))
        n += 1
    _write_package(genanki.Package(deck), path)
    return n


def _write_package(package, path) -> None:
    """genanki's Package.write_to_file(path), less its leak: it builds the collection in a
    tempfile.mkstemp() file it never removes (genanki 0.13.1), one per export left in TMPDIR.
    The same steps, in a directory of ours that goes when the deck is written."""
    with tempfile.TemporaryDirectory(prefix="shmlab-anki-") as tmp:
        db = os.path.join(tmp, "collection.anki2")
        conn = sqlite3.connect(db)
        try:
            now = time.time()
            package.write_to_db(conn.cursor(), now, itertools.count(int(now * 1000)))
            conn.commit()
        finally:
            conn.close()
        with zipfile.ZipFile(path, "w") as out:
            out.write(db, "collection.anki2")
            out.writestr("media", json.dumps({}))  # no media files
