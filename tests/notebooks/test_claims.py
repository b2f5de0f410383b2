"""Every claim of the handout and of issue 12 is proven by a hidden test cell; owners exist.

The claims, their ids and their owner notebooks are in the registry, shmlab/facts/claims.json
(docs/CLAIMS.md is rendered from it; its handout part is a verbatim copy of the project's
seed/CLAIMS.md). A hidden test cell is a code cell tagged ``hidden-test``, with
``metadata.jupyter.source_hidden: true`` and ``# claim <id>[, <id>...]`` as its first line (and,
when it runs its experiment under several start methods itself, ``# under: fork, spawn`` as its
second); it asserts the claim, so the notebook run fails if the claim stops being true. A claim
may be proven in any notebook; a claim's owner notebook must exist, and a missing one is a
failure, never a skip (a renamed or deleted notebook must not silently drop its claims). Only the
comparison with the seed copy in ../shared skips where ../shared is absent. Claims the later
issues add may be asserted by a marked test instead (tests/meta/test_facts.py checks those).

Also here: notebooks 01 and 02 run headless with the ``spawn`` start method too (they read
SHMLAB_START_METHOD in their first code cell; the kernel inherits this process's environment).
SPAWN_NOTEBOOKS lives in shmlab.facts.assertions: the coverage of a hidden cell is the start
methods its notebook runs under here.
"""

from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path

import pytest
from support import nbutil

from shmlab.facts import assertions as fa
from shmlab.facts import registry
from shmlab.facts.render import FACT_BASE_HEADING

CLAIMS_MD = nbutil.REPO / "docs" / "CLAIMS.md"
SEED_CLAIMS_MD = nbutil.REPO.parent / "shared" / "seed" / "CLAIMS.md"  # CI: ../shared, read-only
NOTEBOOKS_DIR = nbutil.REPO / "notebooks"
TAG = fa.TAG
SPAWN_NOTEBOOKS = list(fa.SPAWN_NOTEBOOKS)
# Claims these origins bring must each be proven by a hidden test cell (later ones: any assertion).
CELL_PROVEN = ("handout", "issue12")

CLAIMS = registry.load()
BY_ID = {c.id: c for c in CLAIMS}
OWNERS = sorted({c.owner for c in CLAIMS if c.owner})


def owner_notebook(name: str) -> Path:
    """notebooks/<name>; an AssertionError (a failure, not a skip) if it is missing."""
    path = NOTEBOOKS_DIR / name
    assert path.is_file(), (
        f"notebook {name} is missing from {nbutil.rel(NOTEBOOKS_DIR)}/: it owns claims or a "
        f"spawn run in {Path(__file__).name}; restore it or change the claims' owner in "
        f"shmlab/facts/claims.json (or SPAWN_NOTEBOOKS)"
    )
    return path


def coverage() -> dict[str, list[str]]:
    """claim id -> ['notebook:cell id', ...] of the well-formed hidden test cells naming it."""
    found = defaultdict(list)
    for a in fa.notebook_assertions(NOTEBOOKS_DIR)[0]:
        for cid in a.claims:
            found[cid].append(a.where)
    return found


def test_claims_table_is_readable():
    ids = [c.id for c in CLAIMS]
    assert len(ids) == len(set(ids)) >= 20, ids
    assert {"C1.1", "C1.5", "C2.3", "C4.0", "C4.2.6", "C5.2"} <= set(ids)


def test_every_claim_the_handout_or_issue_12_brought_has_an_owner_notebook():
    orphans = [c.id for c in CLAIMS if c.origin in CELL_PROVEN and not c.owner]
    assert not orphans, f"give these claims an owner notebook in claims.json: {orphans}"


@pytest.mark.skipif(not SEED_CLAIMS_MD.is_file(), reason="../shared/seed/CLAIMS.md not present")
def test_claims_copy_matches_the_seed():
    handout = CLAIMS_MD.read_text(encoding="utf-8").split(FACT_BASE_HEADING)[0]
    assert handout == SEED_CLAIMS_MD.read_text(encoding="utf-8"), (
        f"docs/CLAIMS.md (before {FACT_BASE_HEADING.strip()!r}) differs from {SEED_CLAIMS_MD}: "
        "the handout claims' 'en' in shmlab/facts/claims.json must stay the seed's text, "
        "verbatim; then run python -m shmlab.facts render"
    )


def test_the_additions_go_beyond_the_handout():
    text = CLAIMS_MD.read_text(encoding="utf-8")
    assert FACT_BASE_HEADING in text, f"docs/CLAIMS.md has no {FACT_BASE_HEADING.strip()!r}"
    ours = [c.id for c in CLAIMS if c.origin != "handout"]
    assert ours and all(f"| {cid} |" in text.split(FACT_BASE_HEADING, 1)[1] for cid in ours), ours


@pytest.mark.parametrize("owner", OWNERS, ids=lambda name: name[:2])
def test_claims_are_covered_by_hidden_test_cells(owner):
    owner_notebook(owner)
    found = coverage()
    claims = [c.id for c in CLAIMS if c.owner == owner and c.origin in CELL_PROVEN]
    missing = [c for c in claims if not found.get(c)]
    assert not missing, (
        f"no hidden test cell proves {missing}: add a code cell tagged {TAG!r}, with "
        f"metadata.jupyter.source_hidden = true, whose first line is '# claim <id>'"
    )


def test_a_missing_owner_notebook_fails_instead_of_skipping(tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "NOTEBOOKS_DIR", tmp_path)  # an empty notebooks/
    with pytest.raises(AssertionError, match="01_what_is_torch_multiprocessing.ipynb is missing"):
        test_claims_are_covered_by_hidden_test_cells("01_what_is_torch_multiprocessing.ipynb")


def test_hidden_test_cells_are_well_formed_and_name_real_claims():
    found, problems = fa.notebook_assertions(NOTEBOOKS_DIR)
    problems += [f"{a.where}: {cid!r} is not a claim id of shmlab/facts/claims.json"
                 for a in found for cid in a.claims if cid not in BY_ID]
    assert not problems, "\n".join(problems)


def test_a_malformed_hidden_cell_is_reported():
    cell = {"cell_type": "code", "metadata": {"tags": [TAG]}, "source": "# claims C1.1\nx = 1"}
    assertion, problems = fa.cell_assertion(cell, "01_x.ipynb", "01:c")
    assert assertion is None and len(problems) == 2, problems  # the first line; not hidden
    cell = {"cell_type": "code", "metadata": {"tags": [TAG], "jupyter": {"source_hidden": True}},
            "source": "# claim C1.1, C12.3\n# under: spawn, vfork\n"}
    assertion, problems = fa.cell_assertion(cell, "01_x.ipynb", "01:c")
    assert assertion is None and "vfork" in problems[0], problems


def test_claim_cells_are_tagged():
    """A code cell that starts with '# claim <id>' but lacks the tag would not be counted."""
    untagged = []
    for path in nbutil.find_notebooks((NOTEBOOKS_DIR,)):
        for cell in nbutil.read_notebook(path).cells:
            if (cell.cell_type == "code" and fa.CLAIM_LINE.fullmatch(fa.cell_lines(cell)[0])
                    and not fa.is_hidden_test(cell)):
                untagged.append(f"{path.name}:{cell.get('id')}")
    assert not untagged, f"tag these cells {TAG!r}: {untagged}"


@pytest.mark.notebook
@pytest.mark.timeout(nbutil.NOTEBOOK_TIMEOUT)
@pytest.mark.parametrize("name", SPAWN_NOTEBOOKS, ids=lambda n: n[:2] + "-spawn")
def test_notebook_runs_with_spawn(name, monkeypatch):
    path = owner_notebook(name)
    # nbclient starts the kernel with this process's environment (jupyter_client copies
    # os.environ when no env is given), so this reaches the notebook's first code cell.
    monkeypatch.setenv("SHMLAB_START_METHOD", "spawn")
    nb = nbutil.execute_notebook(path, save_failed_to=nbutil.ARTIFACTS / "spawn")
    assert "start method: spawn" in nbutil.outputs_text(nb), "the kernel did not see the env var"
