"""The drill's question bank: its schema, its links, its Chinese, and its sync with the notebooks.

bank.json is validated against bank.schema.json; every card links to a heading that exists (as
the anchor JupyterLab gives it), in the English notebook and, computed from the same cell, in the
built Chinese one (notebooks/zh); every follow-up question of every notebook is a card, word for
word (the notebooks are the source of the follow-ups' English, shmlab.drill.sync copies changes);
the Chinese text uses full-width punctuation outside code.
"""

from __future__ import annotations

import collections
import html
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

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
    # italics between 汉字 are italics (Markdown's flanking rules): the id has no asterisks
    assert notebooks.anchor("第 2 步 · 证据：子进程训练的是*父进程的*参数") == \
        "第-2-步-·-证据：子进程训练的是父进程的参数"
    # a star in a code span stays; a star pair is italics even between digits; a lone one stays
    assert notebooks.anchor("4. Leaked `/dev/shm/torch_*` after `SIGKILL`") == \
        "4.-Leaked-/dev/shm/torch_*-after-SIGKILL"
    assert notebooks.anchor("Step 1 · 2*3*4 and a_b*c") == "Step-1-·-234-and-a_b*c"


# JupyterLab's own Markdown renderer (marked, in its static bundle), run in node: the heading's
# text as JupyterLab renders it, which createHeaderId turns into the id (spaces as dashes).
MARKED = r"""
globalThis.self = globalThis;
const chunks = [];
self.rspackChunk_jupyterlab_application_top = {push: (c) => chunks.push(c)};
self.webpackChunk_jupyterlab_application_top = self.rspackChunk_jupyterlab_application_top;
require(process.argv[1]);
const r = (id) => { throw new Error('needs module ' + id); };
r.r = () => {};
r.d = (t, defs) => { for (const k in defs) Object.defineProperty(t, k, {get: defs[k]}); };
const exp = {};
for (const id in chunks[0][1]) chunks[0][1][id]({}, exp, r);
const input = JSON.parse(require('fs').readFileSync(0, 'utf8'));
console.log(JSON.stringify(input.map(m => exp.marked.parse('## ' + m))));
"""


def _marked_chunk():
    static = Path(sys.prefix) / "share" / "jupyter" / "lab" / "static"
    for path in sorted(static.glob("*.js")):
        text = path.read_text(encoding="utf-8", errors="replace")
        if "emStrongLDelim" in text and "pedantic:!1" in text and len(text) < 200_000:
            return path
    return None


def test_every_heading_anchor_is_the_id_jupyterlab_renders():
    node, chunk = shutil.which("node"), _marked_chunk()
    if node is None or chunk is None:
        pytest.skip("needs node and JupyterLab's static bundle (marked) in this environment")
    found = [h for folder in (notebooks.NOTEBOOKS, notebooks.NOTEBOOKS / "zh")
             for p in sorted(folder.glob("*.ipynb")) for h in notebooks.headings(p)]
    found += ["Step 3 · `shm_open`, then **unlink** at once", "证据：子进程训练的是*父进程的*参数"]
    out = subprocess.run([node, "-e", MARKED, str(chunk)], input=json.dumps(found),
                         capture_output=True, text=True, timeout=60, check=True)
    rendered = [html.unescape(re.sub(r"<[^>]+>", "", h)).strip().replace(" ", "-")
                for h in json.loads(out.stdout)]
    assert len(rendered) == len(found) > 400
    wrong = [(h, r, notebooks.anchor(h)) for h, r in zip(found, rendered, strict=True)
             if r != notebooks.anchor(h)]
    assert not wrong, wrong


def broken_chinese_links(cards, folder=notebooks.NOTEBOOKS) -> list:
    """(card id, link, why) for each card whose Chinese link does not name a heading of the
    built Chinese notebook of the same name, as JupyterLab anchors it."""
    broken = []
    for c in cards:
        try:
            link = notebooks.zh_link(c.link, folder)
        except LookupError as e:
            broken.append((c.id, c.link, str(e)))
            continue
        name, _, fragment = link.partition("#")
        if name != c.link.partition("#")[0] or link not in notebooks.anchors(folder / "zh"):
            broken.append((c.id, link, "not a heading of the Chinese notebook"))
        elif not re.search(CJK, fragment):
            broken.append((c.id, link, "the Chinese heading is not in Chinese"))
    return broken


def test_every_card_links_the_same_heading_of_the_chinese_notebook():
    assert not broken_chinese_links(CARDS)


def _plant(tmp_path, card, edit_english=None, edit_chinese=None):
    """A notebooks folder with the card's English and Chinese notebook, one of them edited."""
    name = card.link.partition("#")[0]
    (tmp_path / "zh").mkdir(parents=True)
    for src, dst, edit in ((notebooks.NOTEBOOKS / name, tmp_path / name, edit_english),
                           (notebooks.NOTEBOOKS / "zh" / name, tmp_path / "zh" / name,
                            edit_chinese)):
        shutil.copy(src, dst)
        if edit:
            nb = json.loads(dst.read_text(encoding="utf-8"))
            edit(nb["cells"])
            dst.write_text(json.dumps(nb), encoding="utf-8")
    return tmp_path


def _cell_of(card, cells):
    """The cell holding the card's English heading (the same id in the Chinese notebook)."""
    target = card.link.partition("#")[2]
    english = json.loads((notebooks.NOTEBOOKS / card.link.partition("#")[0]).read_text())
    cell_id = next(c["id"] for c in english["cells"] if c["cell_type"] == "markdown" and any(
        notebooks.anchor(h) == target for _, h in notebooks.cell_headings("".join(c["source"]))))
    return next(c for c in cells if c["id"] == cell_id)


def test_a_planted_broken_chinese_link_fails(tmp_path):
    card = next(c for c in CARDS if c.link.startswith("04_"))
    assert not broken_chinese_links([card], _plant(tmp_path / "ok", card))
    # a typo in the card's English anchor
    typo = bank.Card(**{**card.__dict__, "link": card.link + "-typo"})
    assert broken_chinese_links([typo], _plant(tmp_path / "typo", card))

    def drop_heading(cells):  # the Chinese cell lost its heading (a stale or broken build)
        cell = _cell_of(card, cells)
        cell["source"] = [line.lstrip("#") for line in "".join(cell["source"]).splitlines(True)]

    assert broken_chinese_links([card], _plant(tmp_path / "dropped", card,
                                               edit_chinese=drop_heading))

    def new_ids(cells):  # the Chinese notebook's cells renumbered: no cell to follow
        for i, cell in enumerate(cells):
            cell["id"] = f"renumbered-{i}"

    assert broken_chinese_links([card], _plant(tmp_path / "ids", card, edit_chinese=new_ids))


def test_a_retranslated_heading_moves_the_chinese_link_with_it(tmp_path):
    card = next(c for c in CARDS if c.link.startswith("04_"))

    def retitle(cells):
        cell = _cell_of(card, cells)
        lines = "".join(cell["source"]).splitlines(True)
        i = next(i for i, line in enumerate(lines) if line.startswith("#"))
        lines[i] = lines[i].split(" ", 1)[0] + " 新的*标题* 写法\n"
        cell["source"] = lines

    folder = _plant(tmp_path, card, edit_chinese=retitle)
    assert notebooks.zh_link(card.link, folder) == card.link.partition("#")[0] + "#新的标题-写法"
    assert not broken_chinese_links([card], folder)


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
