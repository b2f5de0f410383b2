"""ShmFiles: a live table of the torch_/shmlab_/psm_ files in /dev/shm.

One row per segment: name, owner, size, creator pid, alive/LEAKED, refcount (file_system
segments: the int32 in their 64-byte header) and age. A segment whose creator has died while
the file is still there is leaked: its row carries the CSS class ``shmlab-leaked``.
"""

from __future__ import annotations

import html

import ipywidgets as W

from .. import introspect
from ..messages import N_, tr
from ._live import CSS, DEFAULT_HZ, LiveView, table, text_table

MAX_ROWS = 100  # a table of thousands of rows would cost the browser more than it tells


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def _state(seg: introspect.ShmSegment) -> str:
    return {True: tr("LEAKED"), False: tr("alive"), None: "?"}[seg.leaked]


def _cells(seg: introspect.ShmSegment) -> list:
    rc = "" if seg.refcount is None else seg.refcount
    pid = "" if seg.creator_pid is None else seg.creator_pid
    return [seg.name, seg.owner, _size(seg.size), pid, _state(seg), rc, f"{seg.age_s:.1f} s"]


# the column names (translated where shown: tr(h) for h in HEAD)
HEAD = [N_("name"), N_("owner"), N_("size"), N_("creator"), N_("state"), N_("refcount"), N_("age")]


def _head() -> list[str]:
    return [tr(h) for h in HEAD]


class ShmFiles(LiveView, W.VBox):
    """Live table of shared-memory segments (``files.rows`` holds the ShmSegments shown)."""

    def __init__(self, hz: float = DEFAULT_HZ, history: int = 2000, autostart: bool = True):
        self.summary, self.table = W.HTML(""), W.HTML("")
        self.summary.add_class("shmlab-shm-summary")
        self.table.add_class("shmlab-shm-table")
        super().__init__([self.summary, self.table])
        self.rows: list[introspect.ShmSegment] = []
        self._init_live("shmlab-shm-files", hz, autostart, history)
        self.children = (self.summary, self.table, self.log_line)

    @property
    def leaked(self) -> list[introspect.ShmSegment]:
        return [s for s in self.rows if s.leaked]

    def update(self, snap: introspect.Snapshot) -> None:
        self.rows = list(snap.segments)
        total = sum(s.size for s in self.rows)
        self.history.append((snap.time, len(self.rows), len(self.leaked), total))
        lim = snap.limits
        count = f'<span class="shmlab-shm-count">{len(self.rows)}</span>'
        leaked = f'<span class="shmlab-shm-leaked-count">{len(self.leaked)}</span>'
        self.summary.value = CSS + (
            "<b>" + tr("{n} segments in /dev/shm", n=count) + "</b> &middot; "
            + tr("{n} leaked", n=leaked) + " &middot; "
            + tr("{used} used", used=_size(total)) + " &middot; "
            + tr("{free} free of {total}", free=_size(lim.shm_free), total=_size(lim.shm_total)))
        shown = sorted(self.rows, key=lambda s: (not s.leaked, s.name))[:MAX_ROWS]
        rows = [[html.escape(str(c)) for c in _cells(s)] for s in shown]
        for r in rows:
            r[4] = f'<span class="shmlab-state">{r[4]}</span>'
        classes = ["shmlab-leaked" if s.leaked else "shmlab-segment" for s in shown]
        more = len(self.rows) - len(shown)
        self.table.value = CSS + (
            table(_head(), rows, classes) if self.rows else
            '<div class="shmlab-muted">' + tr("no torch_/shmlab_/psm_ files in /dev/shm")
            + "</div>"
        ) + ('<div class="shmlab-muted">' + tr("... and {n} more", n=more) + "</div>"
             if more > 0 else "")

    def render_text(self) -> str:
        head = tr("/dev/shm: {n} segments, {leaked} leaked", n=len(self.rows),
                  leaked=len(self.leaked))
        return head + ("\n" + text_table(_head(), [_cells(s) for s in self.rows]) if self.rows
                       else "")
