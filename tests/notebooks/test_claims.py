"""Every claim of the handout is proven by a hidden test cell in its notebook.

The claims and their ids are in docs/CLAIMS.md (a verbatim copy of the project's
seed/CLAIMS.md). A hidden test cell is a code cell tagged ``hidden-test``, with
``metadata.jupyter.source_hidden: true`` and ``# claim <id>`` as its first line; it asserts
the claim, so the notebook run fails if the claim stops being true. A claim may be proven in
any notebook; every claim group has an owner notebook, and a missing owner notebook is a
failure, never a skip (a renamed or deleted notebook must not silently drop its claims). Only
the comparison with the seed copy in ../shared skips where ../shared is absent.

Also here: notebooks 01 and 02 run headless with the ``spawn`` start method too (they read
SHMLAB_START_METHOD in their first code cell; the kernel inherits this process's environment).
"""

from __future__ import annotations

import json
import re
import sys
from collections import defaultdict
from pathlib import Path

import pytest
from support import nbutil

CLAIMS_MD = nbutil.REPO / "docs" / "CLAIMS.md"
SEED_CLAIMS_MD = nbutil.REPO.parent / "shared" / "seed" / "CLAIMS.md"  # CI: ../shared, read-only
NOTEBOOKS_DIR = nbutil.REPO / "notebooks"
TAG = "hidden-test"
_CLAIM_LINE = re.compile(r"#\s*claim\s+(\S+)\s*$")

# Claim group (an id, or an id prefix followed by ".") -> the notebook that must prove it.
OWNER = {
    "C1": "01_what_is_torch_multiprocessing.ipynb",
    "C2": "02_sharing_strategy_api.ipynb",
    "C3": "03_sharing_cuda_tensors.ipynb",
    "C4.0": "04_file_descriptor_strategy.ipynb",
    "C4.1": "04_file_descriptor_strategy.ipynb",
    "C4.2": "05_file_system_strategy_and_shm_manager.ipynb",
    "C5": "06_hogwild_training.ipynb",
    # docs/CLAIMS.md, "Corrections and additions (issue 12)": one owner per corrected statement.
    "C12.1": "04_file_descriptor_strategy.ipynb",
    "C12.2": "02_sharing_strategy_api.ipynb",
    "C12.3": "02_sharing_strategy_api.ipynb",
    "C12.4": "07_beyond_one_machine.ipynb",
    "C12.5": "07_beyond_one_machine.ipynb",
    "C12.6": "08_when_the_parent_dies.ipynb",
    "C12.7": "04_file_descriptor_strategy.ipynb",
    "C12.8": "03_sharing_cuda_tensors.ipynb",
    "C12.9": "03_sharing_cuda_tensors.ipynb",
    "C12.10": "08_when_the_parent_dies.ipynb",
    "C12.11": "03_sharing_cuda_tensors.ipynb",
    "C12.12": "04_file_descriptor_strategy.ipynb",
    "C12.13": "04_file_descriptor_strategy.ipynb",
    "C12.20": "12_crashes_trackers_and_fds.ipynb",
    "C12.21": "12_crashes_trackers_and_fds.ipynb",
    "C12.22": "12_crashes_trackers_and_fds.ipynb",
    "C12.23": "12_crashes_trackers_and_fds.ipynb",
    "C12.24": "12_crashes_trackers_and_fds.ipynb",
    "C12.25": "12_crashes_trackers_and_fds.ipynb",
    "C12.26": "12_crashes_trackers_and_fds.ipynb",
    "C12.27": "12_crashes_trackers_and_fds.ipynb",
    "C12.28": "12_crashes_trackers_and_fds.ipynb",
    "C12.29": "12_crashes_trackers_and_fds.ipynb",
    "C12.30": "13_inside_share_memory.ipynb",
    "C12.31": "13_inside_share_memory.ipynb",
    "C12.32": "13_inside_share_memory.ipynb",
    "C12.33": "13_inside_share_memory.ipynb",
    "C12.34": "13_inside_share_memory.ipynb",
    "C12.35": "13_inside_share_memory.ipynb",
    "C12.40": "11_famous_errors.ipynb",
    "C12.41": "11_famous_errors.ipynb",
    "C12.42": "11_famous_errors.ipynb",
    "C12.43": "11_famous_errors.ipynb",
    "C12.44": "11_famous_errors.ipynb",
    "C12.50": "05_file_system_strategy_and_shm_manager.ipynb",
}
# The handout's part of docs/CLAIMS.md ends where this heading starts; the rest is ours.
ADDITIONS_HEADING = "\n## Corrections and additions (issue 12)\n"
# Notebooks that must also pass with SHMLAB_START_METHOD=spawn.
SPAWN_NOTEBOOKS = ["01_what_is_torch_multiprocessing.ipynb", "02_sharing_strategy_api.ipynb"]


def claim_ids(path: Path = CLAIMS_MD) -> list[str]:
    """The ids in the first column of the claims tables, in order."""
    return claim_ids_in(path.read_text(encoding="utf-8"))


def claim_ids_in(text: str) -> list[str]:
    ids = []
    for line in text.splitlines():
        m = re.match(r"\|\s*(C[0-9][0-9.]*)\s*\|", line)
        if m:
            ids.append(m.group(1))
    return ids


def owner_notebook(name: str) -> Path:
    """notebooks/<name>; an AssertionError (a failure, not a skip) if it is missing."""
    path = NOTEBOOKS_DIR / name
    assert path.is_file(), (
        f"notebook {name} is missing from {nbutil.rel(NOTEBOOKS_DIR)}/: it owns claims or a "
        f"spawn run in {Path(__file__).name}; restore it or update OWNER / SPAWN_NOTEBOOKS"
    )
    return path


def group_of(claim: str) -> str | None:
    """The OWNER key a claim id belongs to (the longest matching one), or None."""
    keys = [k for k in OWNER if claim == k or claim.startswith(k + ".")]
    return max(keys, key=len) if keys else None


def is_hidden_test(cell) -> bool:
    return cell.get("cell_type") == "code" and TAG in cell.get("metadata", {}).get("tags", [])


def first_line(cell) -> str:
    return cell.get("source", "").lstrip("\n").split("\n", 1)[0].strip()


def hidden_test_cells(notebooks_dir: Path = NOTEBOOKS_DIR):
    """(notebook path, cell) for every hidden-test-tagged code cell in notebooks/*.ipynb."""
    for path in nbutil.find_notebooks((notebooks_dir,)):
        for cell in nbutil.read_notebook(path).cells:
            if is_hidden_test(cell):
                yield path, cell


def coverage() -> dict[str, list[str]]:
    """claim id -> ['notebook:cell id', ...] of the well-formed hidden test cells naming it."""
    found = defaultdict(list)
    for path, cell in hidden_test_cells():
        m = _CLAIM_LINE.fullmatch(first_line(cell))
        if m and cell.metadata.get("jupyter", {}).get("source_hidden") is True:
            found[m.group(1)].append(f"{path.name}:{cell.get('id')}")
    return found


CLAIMS = claim_ids()
# Issue 25's new claims, written by helpers to shmlab/facts/new/<name>.json until they are merged
# into the fact base: a hidden cell may name them already.
PENDING = {c["id"] for path in (nbutil.REPO / "shmlab" / "facts" / "new").glob("*.json")
           for c in json.loads(path.read_text(encoding="utf-8"))["claims"]}


def test_claims_table_is_readable():
    assert len(CLAIMS) == len(set(CLAIMS)) >= 20, CLAIMS
    assert {"C1.1", "C1.5", "C2.3", "C4.0", "C4.2.6", "C5.2"} <= set(CLAIMS)


def test_every_claim_has_an_owner_notebook():
    orphans = [c for c in CLAIMS if group_of(c) is None]
    assert not orphans, f"add these claim ids to OWNER in {__file__}: {orphans}"


@pytest.mark.skipif(not SEED_CLAIMS_MD.is_file(), reason="../shared/seed/CLAIMS.md not present")
def test_claims_copy_matches_the_seed():
    handout = CLAIMS_MD.read_text(encoding="utf-8").split(ADDITIONS_HEADING)[0]
    assert handout == SEED_CLAIMS_MD.read_text(encoding="utf-8"), (
        f"docs/CLAIMS.md (before {ADDITIONS_HEADING.strip()!r}) differs from {SEED_CLAIMS_MD}: "
        "copy it again, verbatim, and keep the additions after it"
    )


def test_the_additions_go_beyond_the_handout():
    text = CLAIMS_MD.read_text(encoding="utf-8")
    assert ADDITIONS_HEADING in text, f"docs/CLAIMS.md has no {ADDITIONS_HEADING.strip()!r}"
    ours = claim_ids_in(text.split(ADDITIONS_HEADING, 1)[1])
    assert ours and all(c.startswith("C12.") for c in ours), ours


@pytest.mark.parametrize("group", sorted(OWNER), ids=lambda g: f"{g}-{OWNER[g][:2]}")
def test_claims_are_covered_by_hidden_test_cells(group):
    owner_notebook(OWNER[group])
    found = coverage()
    claims = [c for c in CLAIMS if group_of(c) == group]
    missing = [c for c in claims if not found.get(c)]
    assert claims, f"no claim id in docs/CLAIMS.md belongs to {group}"
    assert not missing, (
        f"no hidden test cell proves {missing}: add a code cell tagged {TAG!r}, with "
        f"metadata.jupyter.source_hidden = true, whose first line is '# claim <id>'"
    )


def test_a_missing_owner_notebook_fails_instead_of_skipping(tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "NOTEBOOKS_DIR", tmp_path)  # an empty notebooks/
    with pytest.raises(AssertionError, match="01_what_is_torch_multiprocessing.ipynb is missing"):
        test_claims_are_covered_by_hidden_test_cells("C1")


def test_hidden_test_cells_are_well_formed_and_name_real_claims():
    problems = []
    for path, cell in hidden_test_cells():
        where = f"{path.name}:{cell.get('id')}"
        m = _CLAIM_LINE.fullmatch(first_line(cell))
        if not m:
            problems.append(f"{where}: first line {first_line(cell)!r} is not '# claim <id>'")
        elif m.group(1) not in CLAIMS and m.group(1) not in PENDING:
            problems.append(f"{where}: {m.group(1)!r} is not a claim id of docs/CLAIMS.md")
        if cell.metadata.get("jupyter", {}).get("source_hidden") is not True:
            problems.append(f"{where}: metadata.jupyter.source_hidden is not true")
    assert not problems, "\n".join(problems)


def test_claim_cells_are_tagged():
    """A code cell that starts with '# claim <id>' but lacks the tag would not be counted."""
    untagged = []
    for path in nbutil.find_notebooks((NOTEBOOKS_DIR,)):
        for cell in nbutil.read_notebook(path).cells:
            if (cell.cell_type == "code" and _CLAIM_LINE.fullmatch(first_line(cell))
                    and not is_hidden_test(cell)):
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
