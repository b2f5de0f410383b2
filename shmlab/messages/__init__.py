"""The language of what shmlab prints for a learner, and its Chinese messages.

    from shmlab.messages import tr
    print(tr("the segment is {size} bytes (got {got})", size=4096, got=st.st_size))

``tr`` looks the English format string up in ``zh_CN.po`` (next to this file) when the language
is Chinese, and formats the result with the same fields; an untranslated message stays English.
The English strings are the msgids, so the code reads as before and ``python -m shmlab.i18n
extract`` finds every ``tr("...")`` call to add to the catalog.

Mirrors: nothing in torch; the stdlib's ``gettext.translation(...).gettext``, with the language
chosen the way a notebook needs (``language``) and ``.po`` read by ``polib`` (no ``.mo`` build).

Note [Which language a message is in]
An explicit ``lang=`` wins; else ``SHMLAB_LANG`` (``zh``, ``zh_CN``, ``en``); else Chinese when
the process runs in a folder called ``zh`` (Jupyter starts a notebook's kernel in the notebook's
folder, so the Chinese edition in ``notebooks/zh/`` and ``labs/zh/`` speaks Chinese with no
set-up; the headless runner of the tests does the same); else English. The grader sets
``SHMLAB_LANG`` from the graded notebook's ``metadata.language``.

Note [A figure's language needs a CJK font]
matplotlib draws a Chinese label in the first family of ``font.sans-serif`` that has the glyph;
its default families (DejaVu Sans) have none, so an installed CJK font is not enough: it must
be named there, or every character is a box and matplotlib warns "Glyph ... missing" once per
character. ``figure_language`` puts an installed CJK family first and answers ``zh``; with none
it answers ``en``, so the figure is labelled in English, quietly (the doctor already reports the
missing font, with the command that installs one).
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

LANGUAGES = ("en", "zh")
CATALOGS = {"zh": Path(__file__).with_name("zh_CN.po")}


def language(lang: str | None = None) -> str:
    """``en`` or ``zh``: Note [Which language a message is in]."""
    for choice in (lang, os.environ.get("SHMLAB_LANG")):
        if choice:
            short = choice.strip().lower()[:2]
            if short not in LANGUAGES:
                raise ValueError(f"unknown language {choice!r}: use one of {LANGUAGES} "
                                 f"(or unset SHMLAB_LANG)")
            return short
    try:
        return "zh" if Path.cwd().name == "zh" else "en"
    except OSError:  # the working directory was removed under us
        return "en"


@functools.cache
def _table(lang: str) -> dict[str, str]:
    path = CATALOGS.get(lang)
    if path is None or not path.exists():
        return {}
    import polib

    return {e.msgid: e.msgstr for e in polib.pofile(str(path))
            if e.msgstr and not e.obsolete and "fuzzy" not in e.flags}


# Sans-serif CJK families, preferred first: Simplified Chinese, then the other Noto/Source Han
# cuts (the same Han glyphs for the labels shmlab draws), then the usual ones of macOS and Windows.
CJK_FAMILIES = ("Noto Sans CJK SC", "Source Han Sans SC", "Noto Sans SC", "Noto Sans CJK JP",
                "Noto Sans CJK TC", "Source Han Sans CN", "WenQuanYi Zen Hei",
                "WenQuanYi Micro Hei", "PingFang SC", "Hiragino Sans GB", "Microsoft YaHei",
                "SimHei", "Arial Unicode MS")


@functools.cache
def cjk_family() -> str | None:
    """The first of ``CJK_FAMILIES`` matplotlib knows (any family named "CJK" after them), or
    None: Note [A figure's language needs a CJK font]."""
    from matplotlib import font_manager

    known = {f.name for f in font_manager.fontManager.ttflist}
    return next((f for f in CJK_FAMILIES if f in known),
                next((f for f in sorted(known) if "CJK" in f and "Mono" not in f), None))


def figure_language(lang: str | None = None) -> str:
    """The language to label a matplotlib figure in: ``zh`` when the language is Chinese and a
    CJK font is installed (which this puts first in ``rcParams["font.sans-serif"]``), else
    ``en``: Note [A figure's language needs a CJK font]. Call it before drawing; pass the
    answer to ``tr(..., lang=)``."""
    if language(lang) != "zh":
        return "en"
    family = cjk_family()
    if family is None:
        return "en"
    import matplotlib

    fonts = matplotlib.rcParams["font.sans-serif"]
    if fonts[:1] != [family]:
        matplotlib.rcParams["font.sans-serif"] = [family, *(f for f in fonts if f != family)]
    return "zh"


def N_(message: str) -> str:
    """Mark ``message`` for the catalog where it is translated later (gettext's ``N_``): the
    grade buttons' names are data first, labels second."""
    return message


def tr(message: str, lang: str | None = None, **fields) -> str:
    """``message`` in the chosen language, formatted with ``fields`` (``str.format``)."""
    text = _table(language(lang)).get(message, message) if language(lang) != "en" else message
    return text.format(**fields) if fields else text
