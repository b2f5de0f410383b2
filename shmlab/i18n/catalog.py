"""The translation catalogs: one gettext ``.po`` file per notebook and lab, kept in step.

Mirrors: nothing in torch; gettext's ``msgmerge`` (an entry per message, the old text kept as
``#| msgid`` and the entry marked ``fuzzy`` when the source changed), read and written with
``polib``.

Note [The catalog format]
``i18n/<locale>/notebooks/<stem>.po`` translates ``notebooks/<stem>.ipynb``, and
``i18n/<locale>/labs/<stem>.po`` the instructor copy ``shmlab/labs/source/<stem>.ipynb`` (its
learner copy is released from the translated instructor copy, so both editions share cells).
One entry per translatable cell (``cells.translatable``): ``msgctxt`` is the cell id,
``msgid`` the English source of the cell, ``msgstr`` its translation, and an extracted comment
``#. sha256:<hex>`` the hash of the English (so a reviewer can tell which English a line in a
diff belongs to). An entry is *missing* while its ``msgstr`` is empty and *stale* when it is
``fuzzy`` or its ``msgid`` is not the cell's English any more; ``extract`` marks a changed
cell fuzzy, keeps the old English as ``#| msgid`` and the old translation as a draft.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import nbformat

from . import cells

LOCALE = "zh_CN"
# kind -> where its English notebooks are, relative to the repository root
ENGLISH = {"notebooks": Path("notebooks"), "labs": Path("shmlab/labs/source")}
WRAP = 100  # the .po line width: the house line length, so diffs stay readable


def _polib():
    try:
        import polib
    except ImportError:  # a dependency of shmlab: an old venv misses it
        raise ImportError("shmlab.i18n needs polib: run `make setup` (or "
                          "`pip install polib`)") from None
    return polib


@dataclass(frozen=True)
class Source:
    """One English notebook and its catalog."""

    kind: str  # "notebooks" or "labs"
    stem: str
    root: Path

    @property
    def english(self) -> Path:
        return self.root / ENGLISH[self.kind] / f"{self.stem}.ipynb"

    def catalog(self, locale: str = LOCALE) -> Path:
        return self.root / "i18n" / locale / self.kind / f"{self.stem}.po"

    @property
    def rel(self) -> str:
        return f"{self.kind}/{self.stem}"


def sources(root=".") -> list[Source]:
    """Every English notebook and lab of the checkout at ``root``, sorted."""
    root = Path(root)
    found = []
    for kind, folder in ENGLISH.items():
        for path in sorted((root / folder).glob("*.ipynb")):
            found.append(Source(kind, path.stem, root))
    if not found:
        raise FileNotFoundError(f"no notebooks under {root.resolve()}: run this in the "
                                f"repository's root (or pass --root)")
    return found


def read_notebook(path) -> nbformat.NotebookNode:
    return nbformat.read(str(path), as_version=4)


def load(path, locale: str = LOCALE):
    """The catalog at ``path``, or a new empty one (nothing is written)."""
    polib = _polib()
    if Path(path).exists():
        po = polib.pofile(str(path), wrapwidth=WRAP)
    else:
        po = polib.POFile(wrapwidth=WRAP)
        po.metadata = {"Project-Id-Version": "shmlab", "Language": locale,
                       "MIME-Version": "1.0", "Content-Type": "text/plain; charset=UTF-8",
                       "Content-Transfer-Encoding": "8bit"}
    return po


def by_id(po) -> dict:
    """The live (not obsolete) entries of a catalog by cell id."""
    return {e.msgctxt: e for e in po if not e.obsolete}


def _comment(cell) -> str:
    kind = "hidden test cell" if cells.is_hidden_test(cell) else f"{cell.cell_type} cell"
    return f"{kind}\nsha256:{cells.sha256(cell.source)}"


def merge(po, nb) -> dict[str, int]:
    """Bring ``po`` in step with the notebook ``nb`` (Note [The catalog format]); return how
    many entries were added, marked fuzzy and made obsolete."""
    polib = _polib()
    old, counts = by_id(po), {"added": 0, "fuzzy": 0, "obsolete": 0}
    obsolete = [e for e in po if e.obsolete]  # from earlier runs: kept for reuse
    entries = []
    for cell in nb.cells:
        if not cells.translatable(cell):
            continue
        entry = old.pop(cell.id, None)
        if entry is None:
            entry = polib.POEntry(msgctxt=cell.id, msgid=cell.source, msgstr="")
            counts["added"] += 1
        elif entry.msgid != cell.source:
            entry.previous_msgid, entry.msgid = entry.msgid, cell.source
            if entry.msgstr and "fuzzy" not in entry.flags:
                entry.flags.append("fuzzy")
                counts["fuzzy"] += 1
        entry.comment = _comment(cell)
        entries.append(entry)
    for entry in old.values():  # the cell is gone (or has nothing to translate any more)
        entry.obsolete = True
        counts["obsolete"] += 1
    po[:] = entries + list(old.values()) + obsolete
    return counts


def extract(root=".", locale: str = LOCALE, only=None) -> list[tuple[Path, dict]]:
    """Write (or update) the catalog of every English notebook and lab; ``only``: a set of
    stems. Returns each catalog written with its counts."""
    written = []
    for src in sources(root):
        if only and src.stem not in only:
            continue
        path = src.catalog(locale)
        po = load(path, locale)
        counts = merge(po, read_notebook(src.english))
        path.parent.mkdir(parents=True, exist_ok=True)
        po.save(str(path))
        written.append((path, counts))
    return written


def translation(entry) -> str | None:
    """The cell source to use for an entry: its ``msgstr`` if done and current, else None."""
    if entry is None or not entry.msgstr or "fuzzy" in entry.flags:
        return None
    return entry.msgstr


def translated_count(po) -> int:
    return sum(1 for e in by_id(po).values() if translation(e) is not None)


# The messages shmlab prints (shmlab.messages): the tr("...") calls of the package.
MESSAGES = Path("shmlab/messages")
# The calls whose first argument is a message: tr("...") (tr_ where `tr` names a Trace), N_("...")
# and the quiz's _ui("...").
MARKERS = {"tr", "tr_", "N_", "_ui"}


def package_messages(root=".") -> dict[str, list[str]]:
    """Every ``tr("literal", ...)`` (or other ``MARKERS``) message of the package at ``root``:
    msgid -> where."""
    import ast

    found: dict[str, list[str]] = {}
    for path in sorted((Path(root) / "shmlab").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for node in ast.walk(tree):
            name = getattr(node.func, "id", getattr(node.func, "attr", None)) \
                if isinstance(node, ast.Call) else None
            if (name in MARKERS and node.args
                    and isinstance(node.args[0], ast.Constant)
                    and isinstance(node.args[0].value, str)):
                where = f"{path.relative_to(root).as_posix()}:{node.lineno}"
                found.setdefault(node.args[0].value, []).append(where)
    return found


def messages_catalog(root=".", locale: str = LOCALE) -> Path:
    return Path(root) / MESSAGES / f"{locale}.po"


def extract_messages(root=".", locale: str = LOCALE) -> tuple[Path, dict]:
    """Bring ``shmlab/messages/<locale>.po`` in step with the package's ``tr`` calls: new
    messages added, vanished ones made obsolete (their translation kept for reuse)."""
    polib = _polib()
    path = messages_catalog(root, locale)
    po = load(path, locale)
    old = {e.msgid: e for e in po if not e.obsolete}
    obsolete = [e for e in po if e.obsolete]
    counts = {"added": 0, "fuzzy": 0, "obsolete": 0}
    entries = []
    for msgid, where in package_messages(root).items():
        entry = old.pop(msgid, None)
        if entry is None:
            entry = polib.POEntry(msgid=msgid, msgstr="")
            counts["added"] += 1
        entry.occurrences = [(w.split(":")[0], w.split(":")[1]) for w in where]
        entries.append(entry)
    for entry in old.values():
        entry.obsolete = True
        counts["obsolete"] += 1
    po[:] = entries + list(old.values()) + obsolete
    path.parent.mkdir(parents=True, exist_ok=True)
    po.save(str(path))
    return path, counts
