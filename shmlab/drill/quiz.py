"""`Quiz`: the interview drill as an ipywidget, with a plain-text mode for headless runs.

    from shmlab.drill import Quiz
    quiz = Quiz()      # the widget: question, your answer, Reveal, again/hard/good/easy, chart
    quiz               # (the last expression of a cell displays it)
    print(quiz.text()) # the same card as plain text (no front end needed)

Reveal shows the answer, the common wrong answer and why it is wrong, and a link to the notebook
section that proves the answer (in 中文 mode, the same section of the Chinese notebook); then
the four grade buttons schedule the card (shmlab.drill.schedule) and the state is saved at once
(shmlab.drill.state), so a reloaded notebook shows the same progress. The chart has one bar per
handout question: known (box 3 and up), seen, not seen.
Every part carries a `shmlab-drill-*` CSS class, which the browser test clicks and reads.
"""

from __future__ import annotations

import html
import re

import ipywidgets as w

from ..messages import N_, language, tr
from . import notebooks
from .bank import QUESTIONS
from .deck import Deck
from .schedule import GRADES

# The grade buttons' labels, marked for the catalog (their Chinese is in shmlab/messages).
GRADE_LABELS = (N_("again"), N_("hard"), N_("good"), N_("easy"))

LANGS = {"中文": "zh", "English": "en", "both": "both"}
# The grade buttons keep the theme's button colours (white on ipywidgets' orange, teal or green
# is below WCAG AA's 4.5:1) and carry their meaning in a coloured bar under the label instead.
GRADE_BAR = {"again": "--jp-error-color1", "hard": "--jp-warn-color1",
             "good": "--jp-info-color1", "easy": "--jp-success-color1"}
STYLE = "<style>" + "".join(
    f".shmlab-drill-grade-{g}{{box-shadow:inset 0 -3px var({v})}}" for g, v in GRADE_BAR.items()
) + "</style>"


def _html(text: str) -> str:
    """Card text (Markdown-ish: `code`, **bold**, *italics*) as safe HTML, lines kept."""
    parts = re.split(r"`([^`]*)`", html.escape(text))  # odd items: the code spans
    for i, part in enumerate(parts):
        if i % 2:
            parts[i] = f"<code>{part}</code>"
        else:
            part = re.sub(r"\*\*(.+?)\*\*", r"<b>\1</b>", part)
            # ASCII word characters only: Chinese has no spaces, so *前台进程组* sits between
            # Han characters, which Python's \w would count as a word and leave unrendered
            parts[i] = re.sub(r"(?<![A-Za-z0-9_*])\*(\S[^*]*?)\*(?![A-Za-z0-9_*])", r"<i>\1</i>",
                              part)
    return "".join(parts).replace("\n", "<br>")


# JupyterLab's theme variables (fallbacks: its light theme), so the light and the dark theme both
# read: a hard-coded light grey glares on a dark page, and dark red vanishes into it.
_BAR = "background:var(--jp-layout-color3,#bdbdbd);border:1px solid var(--jp-border-color1,#bdbdbd)"
_KNOWN = "var(--jp-success-color1,#388e3c)"
_SEEN = "var(--jp-brand-color2,#64b5f6)"
_WRONG = "color:var(--jp-error-color1,#d32f2f)"


def progress_html(progress: dict, counts: str = "{known}/{total} known · {seen} seen") -> str:
    """One bar per handout question: dark = known, light = seen, empty = not seen yet."""
    rows = []
    for q in QUESTIONS:
        row = progress.get(q)
        if not row:
            continue
        known = 100 * row["known"] / row["total"]
        seen = 100 * (row["seen"] - row["known"]) / row["total"]
        rows.append(
            f'<div class="shmlab-drill-bar" data-question="{q}" data-known="{row["known"]}" '
            f'data-seen="{row["seen"]}" data-total="{row["total"]}" style="display:flex;'
            f'align-items:center;gap:6px;margin:2px 0"><span style="width:52px">{q}</span>'
            f'<span style="display:flex;width:240px;height:12px;{_BAR}">'
            f'<span style="width:{known:.1f}%;background:{_KNOWN}"></span>'
            f'<span style="width:{seen:.1f}%;background:{_SEEN}"></span></span>'
            f'<span>{counts.format(**row)}</span></div>')
    return '<div class="shmlab-drill-progress">' + "".join(rows) + "</div>"


class Quiz:
    """A drill session in a widget. `deck` defaults to a Deck over the whole bank; `lang` is
    "both", "en" or "zh"; `limit` caps the cards graded this session."""

    def __init__(self, deck: Deck | None = None, lang: str | None = None,
                 limit: int | None = 10, seed: int = 0, questions=None):
        self.deck = deck or Deck(seed=seed, questions=questions, limit=limit)
        # None: Chinese in the Chinese edition (shmlab.messages.language), else both
        self.lang = lang or ("zh" if language() == "zh" else "both")
        self.revealed = False
        self._build()
        self._render()

    # --- plain text (headless) ----------------------------------------------------------------
    def text(self, reveal: bool | None = None) -> str:
        """The current card as text; with the answer if revealed (or if reveal=True)."""
        card = self.deck.current()
        if card is None:
            return "No card is due: come back tomorrow. " + self._progress_line()
        lines = [f"[{card.question} · {card.level}] {card.text('prompt', self.lang)}"]
        if self.revealed if reveal is None else reveal:
            lines += ["", card.text("answer", self.lang), "",
                      f"✗ {card.text('wrong', self.lang)}",
                      f"  → {card.text('why_wrong', self.lang)}", "", f"see {self._href(card)}"]
        return "\n".join(lines)

    def _progress_line(self) -> str:
        return ", ".join(f"{q}: {r['known']}/{r['total']} known"
                         for q, r in self.deck.progress().items())

    # --- actions (the buttons call these; so can code) ------------------------------------------
    def reveal(self) -> None:
        self.revealed = True
        self._render()

    def grade(self, grade: str) -> None:
        if not self.revealed:
            raise RuntimeError("reveal the answer before grading it")
        self.deck.grade(grade)
        self.revealed = False
        self._render()

    def set_lang(self, lang: str) -> None:
        self.lang = lang
        self._render()

    # --- the widget -----------------------------------------------------------------------------
    def _ui(self, english: str, both: str | None = None) -> str:
        """A label in the quiz's language: Chinese in 中文 mode, else ``both`` (the bilingual
        label) or the English."""
        return tr(english, lang="zh") if self.lang == "zh" else (both or english)

    def _build(self) -> None:
        self.lang_buttons = w.ToggleButtons(options=list(LANGS), value=self._lang_label(),
                                            description="language")
        self.lang_buttons.observe(lambda ch: self.set_lang(LANGS[ch["new"]]), names="value")
        self.question = w.HTML()
        self.answer_box = w.Textarea(placeholder="your answer / 你的回答 (optional)",
                                     # auto: the column's width less the widget's
                                     # margins; 100% plus the margins scrolled sideways
                                     layout=w.Layout(width="auto", height="70px"))
        self.reveal_button = w.Button(description="Reveal / 显示答案", button_style="primary")
        self.reveal_button.on_click(lambda _: self.reveal())
        self.answer = w.HTML()
        self.grade_buttons = []
        for g in GRADES:
            b = w.Button(description=g)
            b.on_click(lambda _, g=g: self.grade(g))
            b.add_class(f"shmlab-drill-grade-{g}")
            self.grade_buttons.append(b)
        self.status = w.HTML()
        self.chart = w.HTML()
        for part, name in ((self.question, "question"), (self.reveal_button, "reveal"),
                           (self.answer, "answer"), (self.status, "status"),
                           (self.chart, "chart"), (self.lang_buttons, "lang")):
            part.add_class(f"shmlab-drill-{name}")
        self.widget = w.VBox([self.lang_buttons, self.question, self.answer_box,
                              self.reveal_button, self.answer, w.HBox(self.grade_buttons),
                              self.status, self.chart])
        self.widget.add_class("shmlab-drill")

    def _lang_label(self) -> str:
        return next(label for label, code in LANGS.items() if code == self.lang)

    def _render(self) -> None:
        card = self.deck.current()
        done = card is None
        self.question.value = (
            "<p>" + self._ui("<b>Session done.</b> No card is due now; come back later.",
                             "<b>Session done / 本轮完成。</b> No card is due now; come back "
                             "later.") + "</p>"
            if done else
            f"<p><small>{card.question} · {card.level}</small><br>"
            f"<b>{_html(card.text('prompt', self.lang))}</b></p>")
        self.answer.value = "" if done or not self.revealed else self._answer_html(card)
        self.reveal_button.disabled = done or self.revealed
        for b in self.grade_buttons:
            b.disabled = done or not self.revealed
        self.status.value = "<small>" + self._ui(
            "graded this session: {answered} · session {sessions}").format(
            answered=self.deck.answered, sessions=self.deck.sessions) + "</small>"
        self.chart.value = STYLE + progress_html(self.deck.progress(), self._ui(
            "{known}/{total} known · {seen} seen"))
        self._relabel()

    def _relabel(self) -> None:
        """The buttons' and boxes' labels in the current language (the 中文 switch too)."""
        self.lang_buttons.description = self._ui("language")
        self.answer_box.placeholder = self._ui("your answer (optional)",
                                               "your answer / 你的回答 (optional)")
        self.reveal_button.description = self._ui("Reveal", "Reveal / 显示答案")
        for b, g in zip(self.grade_buttons, GRADES, strict=True):
            b.description = self._ui(g)
        if not self.revealed:
            self.answer_box.value = ""

    def _href(self, card) -> str:
        """The card's heading, from the notebook the quiz runs in: the Chinese notebook's
        heading in 中文 mode (Note [A card's link in Chinese]), else the English one."""
        return notebooks.href(card.link, self.lang)

    def _answer_html(self, card) -> str:
        link = self._href(card)
        path, _, fragment = link.partition("#")
        return (f"<div>{_html(card.text('answer', self.lang))}</div>"
                f"<p style='{_WRONG}'>✗ {_html(card.text('wrong', self.lang))}<br>"
                f"→ {_html(card.text('why_wrong', self.lang))}</p>"
                f"<p><a href='{html.escape(link)}' target='_blank'>"
                f"{html.escape(path.rsplit('/', 1)[-1])} § "
                f"{html.escape(fragment.replace('-', ' '))}</a></p>")

    def _ipython_display_(self):
        from IPython.display import display

        display(self.widget)

    def __repr__(self) -> str:  # what a plain-text front end shows
        return self.text()
