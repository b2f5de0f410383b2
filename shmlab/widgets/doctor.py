"""DoctorReport: ``python -m shmlab doctor``'s report as a widget, with a clean button that asks.

The same findings as the command (``shmlab.introspect.doctor.diagnose``), one table row each with
its severity and fix. Read-only, except "Clean leaked segments…": it lists what
``--clean`` would remove and removes it only after "Remove them" is pressed; like the command
it never signals a process. Not a live view: it reads the machine on creation and on Refresh.
"""

from __future__ import annotations

import html

import ipywidgets as W

from .. import introspect
from ..introspect import doctor
from ..introspect.leaks import MIN_AGE_S
from ..messages import N_, tr
from ._live import CSS, table

HEAD = ["", N_("severity"), N_("check"), N_("finding"), N_("fix")]  # tr'd when drawn
_MARK = {"ok": "✅", "info": "ℹ️", "warn": "⚠️", "error": "❌"}


class DoctorReport(W.VBox):
    """The doctor's report; ``.findings`` holds the Findings shown, ``.cleaned`` the last clean."""

    def __init__(self, shm_dir: str = introspect.SHM_DIR, min_age_s: float = MIN_AGE_S):
        self.shm_dir, self.min_age_s = shm_dir, min_age_s
        self.findings: list = []
        self.cleaned: dict | None = None
        self._pending: list[dict] = []  # what the confirm button would remove
        self.summary, self.table, self.question = W.HTML(), W.HTML(), W.HTML()
        auto = {"layout": W.Layout(width="auto")}  # the default 148 px cuts the label
        self.refresh_button = W.Button(description=tr("Refresh"), icon="refresh", **auto)
        self.clean_button = W.Button(description=tr("Clean leaked segments…"), icon="trash",
                                     **auto)
        self.confirm_button = W.Button(description=tr("Remove them"), button_style="danger")
        self.cancel_button = W.Button(description=tr("Cancel"))
        self.confirm_box = W.VBox([self.question, W.HBox([self.confirm_button,
                                                          self.cancel_button])])
        self.confirm_box.layout.display = "none"  # shown only while a clean waits for a yes
        self.refresh_button.on_click(lambda _: self.refresh())
        self.clean_button.on_click(lambda _: self.ask_clean())
        self.confirm_button.on_click(lambda _: self.clean())
        self.cancel_button.on_click(lambda _: self._hide_question())
        super().__init__([self.summary, self.table, W.HBox([self.refresh_button,
                                                            self.clean_button]),
                          self.confirm_box])
        self.add_class("shmlab-doctor")
        self.refresh()

    def refresh(self) -> None:
        """Read the machine again (the command's checks, in its order)."""
        self.findings = doctor.diagnose(self.shm_dir, self.min_age_s)
        todo = [f for f in self.findings if f.needs_action]
        self.summary.value = CSS + (
            "<b>⚠️ " + tr("{n} finding(s) need action", n=len(todo)) + "</b>" if todo else
            "<b>✅ " + tr("nothing needs action") + "</b>") + (
            ' &middot; <span class="shmlab-muted">'
            + tr("same as {command}", command="<code>python -m shmlab doctor</code>")
            + "</span>")
        rows = [[_MARK[f.severity], f.severity, f.check, html.escape(f.message),
                 f"<code>{html.escape(f.fix)}</code>" if f.fix else ""] for f in self.findings]
        classes = [f"shmlab-doctor-{f.severity}" for f in self.findings]
        # text columns read left to right and wrap, so a long finding cannot push the short
        # ones off-screen (the table sizes to its content, up to the output's width)
        self.table.value = CSS + table([tr(h) if h else h for h in HEAD], rows, classes,
                                       left=(0, 1, 2, 3, 4), wrap=(3, 4))

    def ask_clean(self) -> None:
        """Show what a clean would remove, and wait for "Remove them" (or Cancel)."""
        self._pending = doctor.cleanable(self.findings)
        if not self._pending:
            self.question.value = tr("No leaked segment of yours is safe to remove.")
            self.confirm_button.disabled = True
        else:
            names = "".join(f"<li><code>{html.escape(i['path'])}</code> "
                            + tr("({size:,} bytes, creator pid {pid} gone)", size=i["size"],
                                 pid=i["creator_pid"]) + "</li>" for i in self._pending)
            self.question.value = tr("Remove these {n} segment(s)? No process maps them and "
                                     "their creators are gone.", n=len(self._pending)) + (
                f"<ul>{names}</ul>")
            self.confirm_button.disabled = False
        self.confirm_box.layout.display = None

    def clean(self) -> None:
        """Remove what ask_clean() listed (each checked again first), then refresh."""
        self.cleaned = doctor.clean(self._pending)
        self._hide_question()
        self.refresh()
        self.summary.value += " &middot; " + tr(
            "removed {n}, freed {freed:,} bytes", n=len(self.cleaned["removed"]),
            freed=self.cleaned["bytes_freed"])

    def _hide_question(self) -> None:
        self._pending = []
        self.confirm_box.layout.display = "none"

    def render_text(self) -> str:
        return doctor.render(self.findings)

    def __repr__(self) -> str:  # plain Python (no browser): the command's text report
        return self.render_text()
