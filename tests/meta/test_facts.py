"""The fact base (issue 25): one registry, every claim asserted as widely as it is stated, cited.

* The registry, shmlab/facts/claims.json, is valid, and docs/CLAIMS.md is rendered from it.
* Every claim is asserted by a hidden test cell (``# claim <id>``) or a test marked
  ``@pytest.mark.claim("<id>", ...)``: an id nothing asserts fails.
* The union of a claim's assertions' conditions holds the conditions its text states (start
  methods: a cell's notebook runs plus its ``# under:`` line, a marker's start_methods; "all"
  Pythons: a marker with pythons="all" in tests/pythons). A narrowed assertion fails: narrow the
  claim's conditions and text, or widen the assertion. KNOWN_NARROWED lists the claims whose
  text is still to be narrowed, each with its reason.
* Teaching material cites the claims it rests on (the cards' and the cheat sheets' tests marked
  xfail until their citing is done; the mock interview's and the glossary's pass, with the
  pending lists below that the integrator empties after the merge):
  - every card of shmlab/drill/bank.json has a non-empty ``claims`` list of known ids;
  - docs/cheatsheet.md, docs/cheatsheet.zh.md and docs/mock_interview.md: every fact-bearing
    block ends with ``{C1.3, C12.12}``. A block is a table body row, a list item (with its
    indented continuation lines) or a paragraph; every block is fact-bearing except one that
    contains ``<!-- no-claim -->``, the block right after a standalone ``<!-- no-claim -->`` line,
    and every block of a section whose heading that line stands right before (instructions,
    scoring rules, links). Headings, fenced code, comments and table header rows are no blocks.
    (The full rule: shmlab.facts.citations.)
  - notebooks/glossary.md: every table's last column is "Claims", one or more known ids a row.
Each checker is a plain function of text or data; the tests at the end plant a violation of
each and see it reported.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
from support.nbutil import REPO

from shmlab.facts import assertions as fa
from shmlab.facts import citations, coverage, merge, registry
from shmlab.facts.registry import FactBaseError
from shmlab.facts.render import CLAIMS_MD, FACT_BASE_HEADING, render, render_repo

CLAIMS = registry.load()
KNOWN = {c.id for c in CLAIMS}
ASSERTIONS, SCAN_PROBLEMS = fa.all_assertions(REPO)
# claim id -> why its assertions check less than its text states (the text is to be narrowed,
# or the assertion widened, by whoever owns it). Empty: every claim is covered as stated.
KNOWN_NARROWED: dict[str, str] = {}
MARKDOWN = ("docs/cheatsheet.md", "docs/cheatsheet.zh.md")


# --- the registry and docs/CLAIMS.md --------------------------------------------------------------
def test_the_registry_is_valid_and_holds_the_handout_and_issue_12():
    assert len(CLAIMS) >= 61
    assert {c.origin for c in CLAIMS} >= {"handout", "issue12"}
    assert all(c.checked == "source" for c in CLAIMS if c.device == "cuda"), (
        "a CUDA claim is checked 'source' while no GPU runs the suite")


def test_claims_md_is_rendered_from_the_registry():
    assert CLAIMS_MD.read_text(encoding="utf-8") == render_repo(), (
        "docs/CLAIMS.md is stale: run python -m shmlab.facts render")


def test_assertions_are_well_formed():
    problems = SCAN_PROBLEMS + coverage.unknown_ids(CLAIMS, ASSERTIONS)
    assert not problems, "\n".join(problems)


def test_every_claim_is_asserted():
    missing = coverage.unasserted(CLAIMS, ASSERTIONS)
    assert not missing, (
        f"an id nothing asserts: {missing}; add a hidden test cell '# claim <id>' or a test "
        "marked @pytest.mark.claim('<id>', ...)")


def test_assertions_cover_what_each_claim_states():
    found = coverage.narrowed(CLAIMS, ASSERTIONS)
    new = {cid: m for cid, m in found.items() if cid not in KNOWN_NARROWED}
    fixed = sorted(set(KNOWN_NARROWED) - set(found))
    assert not new, "narrowed assertion: " + "; ".join(
        f"{cid} is not asserted under {', '.join(m)}" for cid, m in new.items()) + (
        ". Narrow the claim's conditions and text to what is asserted, or widen the assertion "
        "(a '# under:' line on a cell that runs them, a marker's start_methods/pythons)")
    assert not fixed, f"remove {fixed} from KNOWN_NARROWED: they are covered now"


# --- the material cites the claims --------------------------------------------------------------
def test_every_card_cites_known_claims():
    bank = json.loads((REPO / "shmlab" / "drill" / "bank.json").read_text(encoding="utf-8"))
    problems = citations.uncited_cards(bank, KNOWN)
    assert not problems, "\n".join(problems)


def test_every_fact_of_the_cheat_sheets_cites_known_claims():
    problems = [p for name in MARKDOWN
                for p in citations.uncited_blocks((REPO / name).read_text(encoding="utf-8"),
                                                  KNOWN, name)]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("name", ["docs/mock_interview.md", "docs/mock_interview.zh.md"])
def test_every_fact_of_the_mock_interview_cites_known_claims(name):
    problems = citations.uncited_blocks((REPO / name).read_text(encoding="utf-8"), KNOWN, name)
    assert not problems, "\n".join(problems)


def test_every_glossary_row_cites_known_claims():
    name = "notebooks/glossary.md"
    problems = citations.uncited_glossary_rows((REPO / name).read_text(encoding="utf-8"),
                                               KNOWN, name)
    assert not problems, "\n".join(problems)


# --- each checker, shown failing on a planted violation -----------------------------------------
def claim(cid="C99.1", methods=(), pythons="suite", **changes) -> dict:
    record = {"id": cid, "origin": "project", "question": "extra",
              "owner": "01_what_is_torch_multiprocessing.ipynb", "en": "A fact.",
              "zh": "一个事实。", "conditions": {"start_methods": list(methods),
                                            "pythons": pythons, "device": "cpu"},
              "checked": "run"}
    record.update(changes)
    return record


def doc(*records) -> str:
    return json.dumps({"version": 1, "claims": list(records)}, ensure_ascii=False)


@pytest.mark.parametrize("records, message", [
    ((claim(), claim()), "duplicate id C99.1"),
    ((claim(source="nb"),), r"unknown field\(s\) \['source'\]"),
    ((claim(zh=""),), "missing 'zh'"),
    ((claim(zh="A fact."),), "no Chinese"),
    ((claim(methods=("fork", "vfork")),), "start_methods .* must be a list drawn from"),
    ((claim(pythons="3.12"),), "pythons '3.12' is not one of"),
    ((claim(conditions={"start_methods": [], "pythons": "suite"}),), r"missing \['device'\]"),
    ((claim(checked="read"),), "checked 'read'"),
    ((claim(cid="4.1"),), "bad id '4.1'"),
])
def test_the_loader_names_what_is_wrong(records, message):
    with pytest.raises(FactBaseError, match=message):
        registry.load_text(doc(*records))


def test_a_registry_round_trips_through_its_own_text():
    assert registry.load_text(registry.dumps(CLAIMS)) == CLAIMS
    assert (REPO / "shmlab" / "facts" / "claims.json").read_text(encoding="utf-8") == \
        registry.dumps(CLAIMS), "claims.json is not in canonical form: load and dumps it"


def cell(source: str) -> dict:
    return {"cell_type": "code", "id": "c", "source": source,
            "metadata": {"tags": [fa.TAG], "jupyter": {"source_hidden": True}}}


def test_an_id_nothing_asserts_is_reported():
    claims = registry.load_text(doc(claim("C99.1"), claim("C99.2")))
    a, _ = fa.cell_assertion(cell("# claim C99.1\nassert True"), "03_x.ipynb", "03:c")
    assert coverage.unasserted(claims, [a]) == ["C99.2"]


def test_a_narrowed_assertion_is_reported():
    """A claim stated for fork and spawn whose only cell runs in a fork-only notebook."""
    claims = registry.load_text(doc(claim("C99.1", methods=("fork", "spawn"))))
    only_fork, _ = fa.cell_assertion(cell("# claim C99.1\n"), "03_x.ipynb", "03:c")
    assert only_fork.start_methods == {"fork"}
    assert coverage.narrowed(claims, [only_fork]) == {"C99.1": ["start method spawn"]}
    in_spawn_notebook, _ = fa.cell_assertion(cell("# claim C99.1\n"), fa.SPAWN_NOTEBOOKS[0], "01")
    under, _ = fa.cell_assertion(cell("# claim C99.1\n# under: spawn\n"), "03_x.ipynb", "03:d")
    assert coverage.narrowed(claims, [in_spawn_notebook]) == {}
    assert coverage.narrowed(claims, [only_fork, under]) == {}
    every_python = registry.load_text(doc(claim("C99.1", pythons="all")))
    assert coverage.narrowed(every_python, [only_fork]) == {
        "C99.1": ["every installed Python (pythons='all', a test in tests/pythons)"]}


MARKED = '''
import pytest
from pytest import mark

@pytest.mark.claim("C99.1", "C99.2", start_methods=("fork", "spawn"))
def test_a():
    pass

class TestB:
    @mark.claim("C99.3", pythons="all")
    def test_b(self):
        pass

@pytest.mark.parametrize("x", [pytest.param(1, marks=pytest.mark.claim("C99.4"))])
def test_c(x):
    pass

@pytest.mark.claim(NAME)
def test_d():
    pass
'''


def test_claim_markers_are_read_without_importing_the_tests():
    found, problems = fa.marker_assertions_in(MARKED, "tests/core/test_x.py")
    assert [(a.claims, a.where, sorted(a.start_methods), a.pythons) for a in found] == [
        (("C99.1", "C99.2"), "tests/core/test_x.py::test_a", ["fork", "spawn"], "suite"),
        (("C99.3",), "tests/core/test_x.py::test_b", [], "suite"),  # "all" outside tests/pythons
        (("C99.4",), "tests/core/test_x.py::test_c", [], "suite"),
    ]
    assert len(problems) == 2, problems
    assert 'pythons="all" only in tests/pythons' in problems[0]
    assert "must be literals" in problems[1]
    found, problems = fa.marker_assertions_in(MARKED, "tests/pythons/test_x.py")
    assert found[1].pythons == "all" and len(problems) == 1


def test_an_uncited_card_is_reported():
    bank = {"cards": [{"id": "q1-a", "claims": ["C1.1"]}, {"id": "q1-b"},
                      {"id": "q1-c", "claims": []}, {"id": "q1-d", "claims": ["C99.9"]}]}
    problems = citations.uncited_cards(bank, KNOWN)
    assert [p.split(":")[0] for p in problems] == ["q1-b", "q1-c", "q1-d"], problems
    assert "unknown id(s) ['C99.9']" in problems[2]


SHEET = """# Title

Intro paragraph, a fact {C1.1}

- an item stating a fact,
  continued on a second line {C1.2, C12.12}
- an uncited item
1. a numbered item {C99.9}

| fact | where |
|---|---|
| a row | 01 {C1.3} |
| an uncited row | 02 |

<!-- no-claim -->
Read this page the night before.

A paragraph with no citation.

```python
x = 1  # code is no block
```

<!-- no-claim -->
## How to score

Scoring rules, with no fact in them.

- nor here

## Back to facts

Still a fact, and uncited. <!-- no-claim -->

And this one, uncited.
"""


def test_an_uncited_fact_bearing_block_is_reported():
    problems = citations.uncited_blocks(SHEET, KNOWN, "sheet.md")
    lines = [int(p.split(":")[1]) for p in problems]
    assert lines == [7, 8, 13, 18, 35], problems
    assert "unknown id(s) ['C99.9']" in problems[1]


def test_a_glossary_without_claims_is_reported():
    good = "| English | Claims |\n|---|---|\n| shm | C1.2, C1.3 |\n| fd | {C4.1.2} |\n"
    assert citations.uncited_glossary_rows(good, KNOWN) == []
    bad = "| English | Claims |\n|---|---|\n| shm |  |\n| fd | C99.1 |\n"
    assert len(citations.uncited_glossary_rows(bad, KNOWN)) == 2
    no_column = "| English | 中文 |\n|---|---|\n| shm | 共享内存 |\n"
    assert "not 'Claims'" in citations.uncited_glossary_rows(no_column, KNOWN)[0]


# --- merge, render and the command line ---------------------------------------------------------
def test_merge_adds_skips_the_same_and_refuses_a_conflict(tmp_path):
    base = registry.load_text(doc(claim("C99.1")))
    new = tmp_path / "helper.json"
    new.write_text(json.dumps({"claims": [claim("C99.2"), claim("C99.1")]}), encoding="utf-8")
    merged, log = merge.merge(base, [new])
    assert [c.id for c in merged] == ["C99.1", "C99.2"] and log == ["added C99.2 from helper.json"]
    assert merge.merge(merged, [new])[1] == []  # merging twice changes nothing
    new.write_text(json.dumps({"claims": [claim("C99.1", en="Other.")]}), encoding="utf-8")
    with pytest.raises(FactBaseError, match="C99.1 is already in the registry"):
        merge.merge(base, [new])
    merged, log = merge.merge(base, [new], replace=True)
    assert merged[0].en == "Other." and log == ["replaced C99.1 from helper.json"]
    new.write_text(json.dumps({"claims": [claim("C99.3", zh="")]}), encoding="utf-8")
    with pytest.raises(FactBaseError, match="helper.json #0: claim C99.3: missing 'zh'"):
        merge.merge(base, [new])


def test_merge_files_writes_the_registry_in_order(tmp_path):
    target = tmp_path / "claims.json"
    target.write_text(doc(claim("C99.2")), encoding="utf-8")
    new = tmp_path / "a.json"
    new.write_text(json.dumps({"claims": [claim("C99.1", origin="issue25")]}), encoding="utf-8")
    assert merge.merge_files([new], target=target) == ["added C99.1 from a.json"]
    assert [c.id for c in registry.load(target)] == ["C99.1", "C99.2"]  # issue25 before project


def test_render_lists_each_claim_with_its_conditions_and_proof():
    claims = registry.load_text(doc(claim("C99.1", methods=("spawn", "fork"), en="a | b")))
    a, _ = fa.cell_assertion(cell("# claim C99.1\n# under: spawn\n"), "03_x.ipynb",
                             "notebooks/03_x.ipynb:c")
    text = render(claims, [a])
    ours = text.split(FACT_BASE_HEADING)[1]
    assert ("| C99.1 | 01 | a \\| b | 一个事实。 | fork, spawn · suite Python · CPU · run "
            "| 03:c |") in ours


def test_the_command_line_has_help_and_checks_that_claims_md_is_current():
    for argv in (["-m", "shmlab", "facts", "--help"], ["-m", "shmlab.facts", "render", "--help"]):
        out = subprocess.run([sys.executable, *argv], capture_output=True, text=True, cwd=REPO,
                             timeout=60)
        assert out.returncode == 0 and "usage:" in out.stdout, out
    from shmlab.facts.__main__ import main
    assert main(["render", "--check"]) == 0


def test_every_gpu_claim_checked_against_the_source_is_marked_so_in_its_notebook():
    """Until a GPU machine proves them, CUDA claims say so where they are taught (issue 25)."""
    import nbformat

    problems = []
    for c in CLAIMS:
        if c.device != "cuda" or c.checked != "source":
            continue
        nb = nbformat.read(REPO / "notebooks" / c.owner, 4)
        marked = [cell for cell in nb.cells if cell.cell_type == "markdown"
                  and "checked against the source only" in cell.source
                  and "只对照源码核对" in cell.source]
        if not any(re.search(rf"(?<![\w.]){re.escape(c.id)}(?![\w.])", cell.source)
                   for cell in marked):
            problems.append(f"{c.owner}: {c.id} is missing from its notebook's 'checked against "
                            "the source only' list")
    assert not problems, "\n".join(problems)
