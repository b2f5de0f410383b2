"""The registry, ``shmlab/facts/claims.json``: one record per claim, validated on load.

Mirrors: nothing in torch; the project's fact base.

A record (the schema every helper of issue 25 writes)::

    {"id": "C4.1.2", "origin": "handout", "question": "Q4.1",
     "owner": "04_file_descriptor_strategy.ipynb",
     "en": "...", "zh": "...",
     "conditions": {"start_methods": ["fork", "spawn"], "pythons": "suite", "device": "cpu"},
     "checked": "run"}

``conditions`` say what the claim's text says it holds under: the start methods it names ([] when
it does not depend on one), ``pythons`` "suite" (the venv's Python) or "all" (every Python the
suite installs), ``device`` "cpu" or "cuda". ``checked`` is "run" (an assertion runs code that
shows it) or "source" (only the installed source is read: every CUDA claim while no GPU is lent).
Bad records raise FactBaseError naming the claim and the field, so a helper's file can be fixed
from the message alone.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

REGISTRY = Path(__file__).with_name("claims.json")
VERSION = 1

ID = re.compile(r"C\d+(?:\.\d+)+")
# also the order claims.json keeps
ORIGINS = ("handout", "issue12", "issue25", "issue29", "project")
QUESTION = re.compile(r"Q[1-5](?:\.[12])?|extra")
START_METHODS = ("fork", "spawn", "forkserver")
PYTHONS = ("suite", "all")
DEVICES = ("cpu", "cuda")
CHECKED = ("run", "source")
FIELDS = ("id", "origin", "question", "owner", "en", "zh", "conditions", "checked")
CONDITION_FIELDS = ("start_methods", "pythons", "device")
_CJK = re.compile(r"[\u4e00-\u9fff]")


class FactBaseError(ValueError):
    """A registry (or a helper's new-claims file) that breaks the schema; the message says where."""


@dataclass(frozen=True)
class Claim:
    id: str
    origin: str
    question: str
    owner: str | None
    en: str
    zh: str
    start_methods: tuple[str, ...]
    pythons: str
    device: str
    checked: str

    def to_json(self) -> dict:
        return {
            "id": self.id, "origin": self.origin, "question": self.question, "owner": self.owner,
            "en": self.en, "zh": self.zh,
            "conditions": {"start_methods": list(self.start_methods), "pythons": self.pythons,
                           "device": self.device},
            "checked": self.checked,
        }


def id_key(claim_id: str) -> tuple[int, ...]:
    """C4.1.10 after C4.1.9: ids sort by their numbers, not as strings."""
    return tuple(int(part) for part in claim_id[1:].split("."))


def sort_key(claim: Claim) -> tuple:
    return ORIGINS.index(claim.origin), id_key(claim.id)


def parse_claim(record: object, where: str) -> Claim:
    """One record -> Claim, or FactBaseError saying which field of which claim is wrong."""
    if not isinstance(record, dict):
        raise FactBaseError(f"{where}: a claim must be a JSON object, got {record!r}")
    cid = record.get("id")
    if not isinstance(cid, str) or not ID.fullmatch(cid):
        raise FactBaseError(f"{where}: bad id {cid!r}; ids look like C4.1.2 or C25.3")
    here = f"{where}: claim {cid}"
    unknown = sorted(set(record) - set(FIELDS))
    if unknown:
        raise FactBaseError(f"{here}: unknown field(s) {unknown}; the fields are {list(FIELDS)}")
    missing = [f for f in FIELDS if f not in record]
    if missing:
        raise FactBaseError(f"{here}: missing field(s) {missing}")
    if record["origin"] not in ORIGINS:
        raise FactBaseError(f"{here}: origin {record['origin']!r} is not one of {ORIGINS}")
    if not isinstance(record["question"], str) or not QUESTION.fullmatch(record["question"]):
        raise FactBaseError(f"{here}: question {record['question']!r} is not Q1..Q5, "
                            "Q4.1, Q4.2 or 'extra'")
    owner = record["owner"]
    if owner is not None and not (isinstance(owner, str) and owner.endswith(".ipynb")
                                  and "/" not in owner):
        raise FactBaseError(f"{here}: owner {owner!r} must be a notebook file name in "
                            "notebooks/ (e.g. '04_file_descriptor_strategy.ipynb') or null")
    for lang in ("en", "zh"):
        text = record[lang]
        if not isinstance(text, str) or not text.strip():
            raise FactBaseError(f"{here}: missing {lang!r} text; write the claim in both "
                                "English and Chinese")
        if "\n" in text:
            raise FactBaseError(f"{here}: {lang!r} text spans lines; keep a claim on one line")
    if not _CJK.search(record["zh"]):
        raise FactBaseError(f"{here}: 'zh' has no Chinese in it: {record['zh']!r}")
    start_methods, pythons, device = parse_conditions(record["conditions"], here)
    if record["checked"] not in CHECKED:
        raise FactBaseError(f"{here}: checked {record['checked']!r} is not one of {CHECKED}")
    return Claim(cid, record["origin"], record["question"], owner, record["en"], record["zh"],
                 start_methods, pythons, device, record["checked"])


def parse_conditions(conditions: object, here: str) -> tuple[tuple[str, ...], str, str]:
    if not isinstance(conditions, dict):
        raise FactBaseError(f"{here}: conditions must be an object with {CONDITION_FIELDS}")
    unknown = sorted(set(conditions) - set(CONDITION_FIELDS))
    missing = [f for f in CONDITION_FIELDS if f not in conditions]
    if unknown or missing:
        raise FactBaseError(f"{here}: conditions need exactly {list(CONDITION_FIELDS)} "
                            f"(unknown {unknown}, missing {missing})")
    methods = conditions["start_methods"]
    if not isinstance(methods, list) or any(m not in START_METHODS for m in methods):
        raise FactBaseError(f"{here}: start_methods {methods!r} must be a list drawn from "
                            f"{START_METHODS} ([] when the claim does not depend on one)")
    if len(set(methods)) != len(methods):
        raise FactBaseError(f"{here}: start_methods {methods!r} repeats a method")
    if conditions["pythons"] not in PYTHONS:
        raise FactBaseError(f"{here}: pythons {conditions['pythons']!r} is not one of {PYTHONS}")
    if conditions["device"] not in DEVICES:
        raise FactBaseError(f"{here}: device {conditions['device']!r} is not one of {DEVICES}")
    # Canonical order, so the rendered table and comparisons do not depend on how it was typed.
    ordered = tuple(m for m in START_METHODS if m in methods)
    return ordered, conditions["pythons"], conditions["device"]


def parse(data: object, where: str, *, top_level: tuple[str, ...] = ("version", "claims")
          ) -> list[Claim]:
    """A registry document (or a new-claims file: top_level=("claims",)) -> its claims."""
    if not isinstance(data, dict):
        raise FactBaseError(f"{where}: expected a JSON object with {list(top_level)}")
    unknown = sorted(set(data) - set(top_level))
    if unknown:
        raise FactBaseError(f"{where}: unknown top-level field(s) {unknown}")
    if "version" in top_level and data.get("version") != VERSION:
        raise FactBaseError(f"{where}: version {data.get('version')!r}, expected {VERSION}")
    records = data.get("claims")
    if not isinstance(records, list):
        raise FactBaseError(f"{where}: 'claims' must be a list")
    claims = [parse_claim(r, f"{where} #{i}") for i, r in enumerate(records)]
    seen: set[str] = set()
    for claim in claims:
        if claim.id in seen:
            raise FactBaseError(f"{where}: duplicate id {claim.id}; each id is used once")
        seen.add(claim.id)
    return claims


def load_text(text: str, where: str = "claims.json") -> list[Claim]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise FactBaseError(f"{where}: not valid JSON: {e}") from None
    return parse(data, where)


def load(path: Path = REGISTRY) -> list[Claim]:
    """The registry's claims, in file order; FactBaseError if any record breaks the schema."""
    return load_text(path.read_text(encoding="utf-8"), str(path.name))


def dumps(claims: list[Claim]) -> str:
    """claims.json's text: one claim per block, keys in schema order, Chinese unescaped."""
    body = {"version": VERSION, "claims": [c.to_json() for c in claims]}
    return json.dumps(body, ensure_ascii=False, indent=1) + "\n"
