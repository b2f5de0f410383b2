"""Fold the helpers' new claims (shmlab/facts/new/*.json) into claims.json.

Mirrors: nothing in torch; the project's fact base.

Each file is ``{"claims": [...]}`` in the registry's schema. A claim whose id is new is added; one
identical to the registry's is skipped (merging twice changes nothing); one that differs from the
registry's claim of the same id is an error unless ``replace`` is set (a helper correcting a
claim's text), and then it takes that claim's place. Two files defining one id differently are
always an error. The result is validated as a whole and written in the registry's order (origin,
then id); the merged files are left for the caller to delete.
"""

from __future__ import annotations

import json
from pathlib import Path

from shmlab.facts import registry
from shmlab.facts.registry import Claim, FactBaseError

NEW = registry.REGISTRY.with_name("new")


def read_new(path: Path) -> list[Claim]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise FactBaseError(f"{path.name}: not valid JSON: {e}") from None
    return registry.parse(data, path.name, top_level=("claims",))


def merge(claims: list[Claim], files: list[Path], *, replace: bool = False
          ) -> tuple[list[Claim], list[str]]:
    """(the merged registry, one line per change); FactBaseError on a conflicting id."""
    by_id = {c.id: c for c in claims}
    origin_of: dict[str, str] = {}  # id -> the new file that defined it
    log = []
    for path in files:
        for claim in read_new(path):
            if claim.id in origin_of and by_id[claim.id] != claim:
                raise FactBaseError(f"{path.name}: {claim.id} is also defined, differently, in "
                                    f"{origin_of[claim.id]}; agree on one text")
            old = by_id.get(claim.id)
            if old == claim:
                continue
            if old is not None and not replace:
                raise FactBaseError(f"{path.name}: {claim.id} is already in the registry with "
                                    "other content; use a new id, or --replace to correct it")
            by_id[claim.id] = claim
            origin_of[claim.id] = path.name
            log.append(f"{'replaced' if old else 'added'} {claim.id} from {path.name}")
    merged = sorted(by_id.values(), key=registry.sort_key)
    registry.parse(json.loads(registry.dumps(merged)), "the merged registry")  # whole-file check
    return merged, log


def merge_files(files: list[Path] | None = None, *, replace: bool = False,
                target: Path = registry.REGISTRY) -> list[str]:
    files = sorted(NEW.glob("*.json")) if files is None else files
    merged, log = merge(registry.load(target), files, replace=replace)
    if log:
        target.write_text(registry.dumps(merged), encoding="utf-8")
    return log
