"""docs/CLAIMS.md, generated from the registry: ``python -m shmlab.facts render``.

Mirrors: nothing in torch; the project's fact base.

The first part is the handout's claims exactly as ../shared/seed/CLAIMS.md has them (its
introduction and its table, byte for byte: tests/notebooks/test_claims.py compares them). After
FACT_BASE_HEADING comes every claim, ours and the handout's, with its Chinese text, its
conditions and where it is asserted (hidden cells and marked tests, scanned at render time).
"""

from __future__ import annotations

from pathlib import Path

from shmlab.facts import registry
from shmlab.facts.assertions import REPO, Assertion, all_assertions, by_claim
from shmlab.facts.registry import Claim

CLAIMS_MD = REPO / "docs" / "CLAIMS.md"

# The seed's introduction, verbatim (it predates the registry: its words stay as they are).
HANDOUT_INTRO = """\
# The handout's claims, one per line

Every claim the handout makes, with an id. Each must be proven (or corrected, with evidence) by at
least one hidden test cell in the notebooks; put the id in that cell's first comment line, e.g.
`# claim C4.1.3`, so the coverage can be counted. "Current" means the torch and Python versions the
project pins; where a claim is true only for some versions, the cell says which.

| id | question | claim |
|---|---|---|
"""
FACT_BASE_HEADING = "\n## The fact base: every claim, its conditions and its proof\n"
FACT_BASE_INTRO = """
Generated from `shmlab/facts/claims.json` by `python -m shmlab.facts render`; edit the registry,
never this file (tests/meta/test_facts.py fails when they differ). Every claim, the handout's
above and the project's own, in English and Chinese, with the conditions its text states and
the hidden test cells (`# claim <id>` on their first line) and tests
(`@pytest.mark.claim("<id>", ...)`) that assert it. Conditions: the start methods the claim names
("any" when it does not depend on one), the Python it holds on ("suite": the venv's; "all": every
Python the suite installs), the device, and how it is checked ("run": by running code; "source":
from the installed source only, as every CUDA claim while no GPU runs the suite).
"""
SECTIONS = {
    "handout": "The handout's claims",
    "issue12": "Corrections and additions (issue 12)",
    "issue25": "Corrections and additions (issue 25)",
    "issue29": "Beyond the handout (issue 29)",
    "project": "The project's own claims",
}
HEADER = ("| id | owner | claim | 中文 | conditions | asserted by |\n"
          "|---|---|---|---|---|---|\n")


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def conditions(claim: Claim) -> str:
    methods = ", ".join(claim.start_methods) or "any"
    pythons = "suite Python" if claim.pythons == "suite" else "all Pythons"
    checked = "run" if claim.checked == "run" else "source only"
    return f"{methods} · {pythons} · {claim.device.upper()} · {checked}"


def short(where: str) -> str:
    """notebooks/04_x.ipynb:cell -> 04:cell; tests/a/test_b.py::t stays as it is."""
    if where.startswith("notebooks/"):
        name, _, cell = where[len("notebooks/"):].partition(":")
        return f"{name[:2]}:{cell}"
    return where


def render(claims: list[Claim], assertions: list[Assertion]) -> str:
    out = [HANDOUT_INTRO]
    out += [f"| {c.id} | {c.question} | {c.en} |\n" for c in claims if c.origin == "handout"]
    out += [FACT_BASE_HEADING, FACT_BASE_INTRO]
    found = by_claim(assertions)
    for origin, title in SECTIONS.items():
        rows = [c for c in claims if c.origin == origin]
        if not rows:
            continue
        out += [f"\n### {title}\n\n", HEADER]
        for c in rows:
            owner = c.owner[:2] if c.owner else "–"
            where = ", ".join(dict.fromkeys(short(a.where) for a in found.get(c.id, []))) or "–"
            out.append(f"| {c.id} | {owner} | {_cell(c.en)} | {_cell(c.zh)} | {conditions(c)} "
                       f"| {where} |\n")
    return "".join(out)


def render_repo(repo: Path = REPO) -> str:
    """docs/CLAIMS.md's text for this checkout: its registry and its notebooks' and tests' ids."""
    assertions, _ = all_assertions(repo)
    return render(registry.load(repo / "shmlab" / "facts" / "claims.json"), assertions)
