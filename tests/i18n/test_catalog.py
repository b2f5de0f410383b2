"""The Chinese edition's catalogs: complete and current where started, by the house rules,
and the built notebooks in step with them (i18n/README.md)."""

from __future__ import annotations

import re

import nbformat
import pytest
from support.nbutil import REPO

from shmlab.i18n import build, catalog, cells, checks

# The notebooks and labs whose catalog translates nothing yet: each is allowed to miss every
# translation, and nothing else is. A test fails when one of them gets a translation (take it
# off the list) or when a notebook not on it misses one.
UNTRANSLATED: set[str] = set()
SOURCES = catalog.sources(REPO)
TRANSLATED = [s for s in SOURCES if s.rel not in UNTRANSLATED]
TERMS = checks.load_terms(checks.terms_path(REPO))


def test_every_notebook_and_lab_has_a_catalog():
    missing = [s.rel for s in SOURCES if not s.catalog().exists()]
    assert not missing, f"no catalog for {missing}: run `python -m shmlab.i18n extract`"


def test_the_untranslated_list_is_exact():
    started = build.built_stems(REPO)
    listed_but_started = sorted(s.rel for s in SOURCES if s.rel in UNTRANSLATED
                                and s.stem in started)
    assert not listed_but_started, f"these have translations now: take them off UNTRANSLATED " \
                                   f"(and finish them): {listed_but_started}"
    unknown = UNTRANSLATED - {s.rel for s in SOURCES}
    assert not unknown, f"UNTRANSLATED names what does not exist: {sorted(unknown)}"


@pytest.mark.parametrize("src", TRANSLATED, ids=lambda s: s.rel)
def test_catalog_is_complete_current_and_by_the_rules(src):
    """Missing or stale entries, half-width punctuation, terms two ways, changed code."""
    problems = checks.check_catalog(src, TERMS)
    assert not problems, "\n".join(map(str, problems))


@pytest.mark.parametrize("src", TRANSLATED, ids=lambda s: s.rel)
def test_code_cells_keep_their_code(src):
    """The token-stream rule, said on its own: only comments and strings differ."""
    nb = build.build_notebook(src)
    english = catalog.read_notebook(src.english)
    for en, zh in zip(english.cells, nb.cells, strict=True):
        assert en.id == zh.id and en.metadata == zh.metadata and en.cell_type == zh.cell_type
        if en.cell_type == "code":
            assert cells.code_stream(en.source) == cells.code_stream(zh.source), en.id
            if cells.is_hidden_test(en):
                assert zh.source.splitlines()[0] == en.source.splitlines()[0], en.id


def test_built_notebooks_are_in_step_with_the_catalogs():
    stale = build.out_of_date(REPO)
    assert not stale, "run `python -m shmlab.i18n build` and commit:\n" + "\n".join(stale)


@pytest.mark.parametrize("src", TRANSLATED, ids=lambda s: s.rel)
def test_built_notebook_says_its_language_and_links_resolve(src):
    out = build.out_path(src)
    nb = nbformat.read(str(out), as_version=4)
    assert nb.metadata["language"] == "zh"
    for cell in nb.cells:
        if cell.cell_type != "markdown":
            continue
        # Code spans and blocks hold no links (`RECEIVER[lib]("fds")`), as in the build.
        prose = re.sub(r"```.*?```|`[^`\n]*`", " ", cell.source, flags=re.S)
        for m in build._LINK.finditer(prose):
            target = (m.group(2) or m.group(5)).split("#")[0]
            if build._ABSOLUTE.match(target) or not target:
                continue
            assert (out.parent / target).exists(), f"{out.name} [{cell.id}]: {target} is missing"


def test_the_package_messages_are_all_translated():
    po = catalog.load(catalog.messages_catalog(REPO))
    live = {e.msgid: e for e in po if not e.obsolete}
    used = catalog.package_messages(REPO)
    missing = sorted(set(used) - set(live))
    assert not missing, f"run `python -m shmlab.i18n extract`: new messages {missing}"
    untranslated = sorted(m for m in used if not catalog.translation(live[m]))
    assert not untranslated, f"shmlab/messages/zh_CN.po misses {untranslated}"
    for msgid in used:
        zh = live[msgid].msgstr
        assert checks.half_width(zh) == [], (msgid, checks.half_width(zh))
        fields = sorted(set(__import__("re").findall(r"\{(\w*)\}", msgid)))
        assert sorted(set(__import__("re").findall(r"\{(\w*)\}", zh))) == fields, msgid


# --- the rules themselves, on known text ---------------------------------------------------

@pytest.mark.parametrize("text, bad", [
    ("共享内存,然后映射", True),
    ("它返回 fd(文件描述符)", True),
    ("这是一个句子.", True),
    ("真的吗?", True),
    ("它返回 fd（文件描述符）。", False),
    ("运行 `ulimit -n 4096, 然后`。", False),           # inside a code span
    ("见 [速查表](../docs/cheatsheet.zh.md)。", False),  # a link target
    ("调用 report() 之后，再看 `x`。", False),            # a call
    ("| What is it? | 它是什么？ |", False),            # an English table cell
    ("Python 3.10 到 3.13。", False),
])
def test_half_width_punctuation_in_chinese_prose_is_found(text, bad):
    assert bool(checks.half_width(text)) == bad, checks.half_width(text)


def test_a_term_rendered_another_way_is_found():
    terms = [checks.Term("storage", "存储", ("储存",)), checks.Term("rendezvous", "=", ("汇合",))]
    assert checks.term_problems("the storage", "这个储存", terms)
    assert not checks.term_problems("the storage", "这个存储", terms)
    assert checks.term_problems("a rendezvous", "先汇合", terms)
    assert not checks.term_problems("a storagebox", "储存", terms)  # whole words only


def test_the_token_rule_allows_comments_and_strings_only():
    en = 'x = f(1)  # one\nprint("hello world")\n'
    assert cells.code_problems(en, 'x = f(1)  # 一\nprint("你好，世界")\n') == []
    assert cells.code_problems(en, 'x = f(2)  # 一\nprint("你好")\n')
    hidden = "# claim C4.1.3\nassert x, 'it failed'\n"
    assert cells.code_problems(hidden, "# 断言 C4.1.3\nassert x, '失败了'\n")


def test_extract_marks_a_changed_cell_fuzzy_and_keeps_the_old_translation():
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("Old text.")])
    nb.cells[0].id = "c1"
    po = catalog.load("/nonexistent.po")
    catalog.merge(po, nb)
    po[0].msgstr = "旧的文字。"
    nb.cells[0].source = "New text."
    counts = catalog.merge(po, nb)
    (entry,) = catalog.by_id(po).values()
    assert counts["fuzzy"] == 1 and "fuzzy" in entry.flags
    assert entry.previous_msgid == "Old text." and entry.msgstr == "旧的文字。"
    assert catalog.translation(entry) is None  # a stale entry builds as English
    nb.cells = []
    assert catalog.merge(po, nb)["obsolete"] == 1
    assert catalog.merge(po, nb)["obsolete"] == 0 and len(po) == 1  # kept once, not again


ZH_DOCS = ["README.zh.md", "docs/cheatsheet.zh.md", "docs/mock_interview.zh.md",
           "docs/study_plan.zh.md"]


@pytest.mark.parametrize("name", ZH_DOCS)
def test_the_chinese_pages_use_full_width_punctuation_and_link_what_exists(name):
    text = (REPO / name).read_text(encoding="utf-8")
    assert checks.half_width(text) == [], checks.half_width(text)
    for m in build._LINK.finditer(text):
        target = (m.group(2) or m.group(5)).split("#")[0]
        if target and not build._ABSOLUTE.match(target):
            assert ((REPO / name).parent / target).exists(), f"{name}: {target} is missing"


def test_a_link_whose_text_is_a_code_span_is_retargeted_and_code_is_left_alone(tmp_path):
    english, out = tmp_path / "notebooks", tmp_path / "notebooks" / "zh"
    out.mkdir(parents=True)
    md = ("See [`docs/CLAIMS.md`](../docs/CLAIMS.md) and [notebook 05](05_x.ipynb#step-2); "
          "`[not a link](../docs/CLAIMS.md)` stays.\n```\n[nor this](../docs/x.md)\n```\n")
    got = build.retarget_links(md, english, out, tmp_path, {"05_x"}, "zh")
    assert got == ("See [`docs/CLAIMS.md`](../../docs/CLAIMS.md) and "
                   "[notebook 05](05_x.ipynb#step-2); `[not a link](../docs/CLAIMS.md)` "
                   "stays.\n```\n[nor this](../docs/x.md)\n```\n")
