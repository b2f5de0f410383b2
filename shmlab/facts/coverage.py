"""Claims nothing asserts, and claims asserted under fewer conditions than their text states.

Mirrors: nothing in torch; the project's fact base.

A claim is covered when the union of its assertions' conditions holds its own: every start
method it names is run by some assertion (a cell's notebook runs, or its ``# under:`` line, or a
marker's start_methods), and a claim for "all" Pythons has an assertion in tests/pythons that
says pythons="all". The device is not compared: a CUDA claim is marked ``checked: "source"``
while no GPU runs it, which the registry says in words, not the coverage.
"""

from __future__ import annotations

from shmlab.facts.assertions import Assertion, by_claim
from shmlab.facts.registry import Claim


def unasserted(claims: list[Claim], assertions: list[Assertion]) -> list[str]:
    """Ids of claims no hidden cell and no marked test asserts."""
    found = by_claim(assertions)
    return [c.id for c in claims if not found.get(c.id)]


def unknown_ids(claims: list[Claim], assertions: list[Assertion]) -> list[str]:
    """'where: id' for every assertion naming an id the registry does not have."""
    known = {c.id for c in claims}
    return [f"{a.where}: {cid}" for a in assertions for cid in a.claims if cid not in known]


def missing_conditions(claim: Claim, assertions: list[Assertion]) -> list[str]:
    """What the claim states that none of these assertions (all naming it) runs under."""
    methods = set().union(*(a.start_methods for a in assertions)) if assertions else set()
    missing = [f"start method {m}" for m in claim.start_methods if m not in methods]
    if claim.pythons == "all" and not any(a.pythons == "all" for a in assertions):
        missing.append("every installed Python (pythons='all', a test in tests/pythons)")
    return missing


def narrowed(claims: list[Claim], assertions: list[Assertion]) -> dict[str, list[str]]:
    """claim id -> what its text states but its assertions do not check (asserted claims only)."""
    found = by_claim(assertions)
    out = {}
    for claim in claims:
        if found.get(claim.id):
            missing = missing_conditions(claim, found[claim.id])
            if missing:
                out[claim.id] = missing
    return out


def where_asserted(claim_id: str, assertions: list[Assertion]) -> list[str]:
    return [a.where for a in by_claim(assertions).get(claim_id, [])]
