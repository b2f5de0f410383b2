"""Which cells of a notebook are translated, and the rule a translated code cell must keep.

Mirrors: nothing in torch; gettext's xgettext decides what is a message in source code, and
this is that decision for notebook cells (babel's extractors read Python files, not cells).

Note [What a translation may change in a code cell]
A Chinese code cell is the English one with its comments and string literals translated,
nothing else: dropping COMMENT and STRING tokens (and the layout tokens), the two token streams
are equal. So every experiment, check and hidden test runs the same code in both editions.
Two kinds of comment carry meaning to tools and stay byte for byte: the first line of a hidden
test cell (``# claim C4.1.3``, read by the fact base) and nbgrader's ``### BEGIN/END ...``
markers (read by ``shmlab.labs.release``).
"""

from __future__ import annotations

import hashlib
import io
import re
import tokenize

# Tokens that carry no code: what a translation may change, or the layout around it.
_FREE = {tokenize.COMMENT, tokenize.STRING, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT,
         tokenize.DEDENT, tokenize.ENCODING, tokenize.ENDMARKER}
for _name in ("FSTRING_START", "FSTRING_MIDDLE", "FSTRING_END"):  # Python 3.12+: f-strings
    if hasattr(tokenize, _name):
        _FREE.add(getattr(tokenize, _name))
# The tokens that hold text: a comment, a string, the literal parts of an f-string (3.12+).
_TEXT = {tokenize.COMMENT, tokenize.STRING, getattr(tokenize, "FSTRING_MIDDLE", -1)}
# Comments tools read (Note [What a translation may change in a code cell]).
_KEPT_COMMENT = re.compile(r"^\s*(# claim\b|# under:|###\s*(BEGIN|END)\b|#\s*noqa\b).*$", re.M)
# Two English words in a row: a comment or string a learner reads, not a name or a path.
_PROSE = re.compile(r"[A-Za-z]{2,}[,:;]? [A-Za-z]{2,}")


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def is_hidden_test(cell) -> bool:
    return "hidden-test" in cell.get("metadata", {}).get("tags", [])


def _tokens(source: str):
    # IPython magics (%%writefile, !ls) are not Python: tokenize them as comments.
    lines = [("#" + ln) if ln.lstrip().startswith(("%", "!")) else ln
             for ln in source.splitlines(keepends=True)]
    return list(tokenize.generate_tokens(io.StringIO("".join(lines)).readline))


def prose(source: str) -> list[str]:
    """The comments and string literals of a code cell that read as English prose."""
    try:
        toks = _tokens(source)
    except (tokenize.TokenError, SyntaxError, IndentationError):
        return []
    found = []
    for tok in toks:
        if tok.type in _TEXT:
            if tok.type == tokenize.COMMENT and _KEPT_COMMENT.match(tok.string):
                continue
            if _PROSE.search(tok.string):
                found.append(tok.string)
    return found


def translatable(cell) -> bool:
    """Markdown cells always; code cells when a learner reads English in them."""
    if cell.cell_type == "markdown":
        return bool(cell.source.strip())
    return cell.cell_type == "code" and bool(prose(cell.source))


def code_stream(source: str) -> list[tuple[int, str]]:
    """The code of a cell: its tokens less comments, strings and layout."""
    return [(t.type, t.string) for t in _tokens(source) if t.type not in _FREE]


def kept_comments(source: str) -> list[str]:
    return [m.group(0).strip() for m in _KEPT_COMMENT.finditer(source)]


def code_problems(english: str, chinese: str) -> list[str]:
    """Why ``chinese`` is not a faithful translation of the code cell ``english`` ([] if it
    is): Note [What a translation may change in a code cell]."""
    try:
        want, got = code_stream(english), code_stream(chinese)
    except (tokenize.TokenError, SyntaxError, IndentationError) as err:
        return [f"the translation does not tokenize: {err}"]
    problems = []
    if want != got:
        diff = next((i for i, (a, b) in enumerate(zip(want, got, strict=False)) if a != b),
                    min(len(want), len(got)))
        problems.append(f"the code differs from the English at token {diff}: English "
                        f"{want[diff:diff + 3]!r}, translation {got[diff:diff + 3]!r} (only "
                        f"comments and string literals may change)")
    if kept_comments(english) != kept_comments(chinese):
        problems.append("a `# claim`, `# under:`, `# noqa` or `### BEGIN/END` line changed: "
                        "tools read those, keep them as in the English")
    return problems
