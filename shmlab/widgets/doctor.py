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
from ._live import CSS, table

HEAD = ["", "severity", "check", "finding", "fix"]
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
        self.refresh_button = W.Button(description="Refresh", icon="refresh", **auto)
        self.clean_button = W.Button(description="Clean leaked segments…", icon="trash", **auto)
        self.confirm_button = W.Button(description="Remove them", button_style="danger")
        self.cancel_button = W.Button(description="Cancel")
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
        self.summary.value = CSS + (f"<b>⚠️ {len(todo)} finding(s) need action</b>" if todo else
                                    "<b>✅ nothing needs action</b>") + (
            ' &middot; <span class="shmlab-muted">same as <code>python -m shmlab doctor'
            "</code></span>")
        rows = [[_MARK[f.severity], f.severity, f.check, html.escape(f.message),
                 f"<code>{html.escape(f.fix)}</code>" if f.fix else ""] for f in self.findings]
        classes = [f"shmlab-doctor-{f.severity}" for f in self.findings]
        # text columns read left to right and wrap, so a long finding cannot push the short
        # ones off-screen (the table sizes to its content, up to the output's width)
        self.table.value = CSS + table(HEAD, rows, classes, left=(0, 1, 2, 3, 4), wrap=(3, 4))

    def ask_clean(self) -> None:
        """Show what a clean would remove, and wait for "Remove them" (or Cancel)."""
        self._pending = doctor.cleanable(self.findings)
        if not self._pending:
            self.question.value = "No leaked segment of yours is safe to remove."
            self.confirm_button.disabled = True
        else:
            names = "".join(f"<li><code>{html.escape(i['path'])}</code> ({i['size']:,} bytes, "
                            f"creator pid {i['creator_pid']} gone)</li>" for i in self._pending)
            self.question.value = (f"Remove these {len(self._pending)} segment(s)? No process "
                                   f"maps them and their creators are gone.<ul>{names}</ul>")
            self.confirm_button.disabled = False
        self.confirm_box.layout.display = None

    def clean(self) -> None:
        """Remove what ask_clean() listed (each checked again first), then refresh."""
        self.cleaned = doctor.clean(self._pending)
        self._hide_question()
        self.refresh()
        self.summary.value += (f" &middot; removed {len(self.cleaned['removed'])}, freed "
                               f"{self.cleaned['bytes_freed']:,} bytes")

    def _hide_question(self) -> None:
        self._pending = []
        self.confirm_box.layout.display = "none"

    def render_text(self) -> str:
        return doctor.render(self.findings)

    def __repr__(self) -> str:  # plain Python (no browser): the command's text report
        return self.render_text()
