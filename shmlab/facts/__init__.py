"""The fact base: every claim the project teaches, its conditions, and what asserts it.

Mirrors: nothing in torch; the project's fact base (issue 25).

    registry    claims.json: load and validate the claims (id, en, zh, conditions, checked)
    assertions  what asserts a claim: notebooks' hidden cells and ``@pytest.mark.claim`` tests
    coverage    claims nothing asserts, and claims asserted under fewer conditions than stated
    citations   flashcards, cheat sheets, mock interview and glossary cite known claim ids
    render      docs/CLAIMS.md, generated from the registry
    merge       fold the helpers' shmlab/facts/new/*.json into claims.json

``python -m shmlab.facts render|merge|check`` (or ``python -m shmlab facts ...``).
"""

from shmlab.facts.registry import REGISTRY, Claim, FactBaseError, load, load_text

__all__ = ["REGISTRY", "Claim", "FactBaseError", "load", "load_text"]
