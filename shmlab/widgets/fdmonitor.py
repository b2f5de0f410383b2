"""FdMonitor: a live chart of open fds for this kernel and every process it started.

Each process is one line (or one line per fd kind with ``by_kind=True``): a child that starts
gets a new line on the next tick, one that exits simply stops getting points, so its line ends
where it died. Beside the chart, the current numbers per process, per kind, as a table.
"""

from __future__ import annotations

import html
import os
import time

import ipywidgets as W

from .. import introspect
from ..messages import tr
from ._live import CSS, DEFAULT_HZ, PALETTE, LiveView, svg_chart, table, text_table

KINDS = introspect.FD_KINDS  # shm-deleted, shm-named, socket, pipe, file, other


def _swatch(colour: str) -> str:
    """A line's colour key: a filled box, not a coloured character (it is no text to read)."""
    return (f'<span class="shmlab-swatch" style="display:inline-block;width:.75em;height:.75em;'
            f'background:{colour}"></span>')


class FdMonitor(LiveView, W.HBox):
    """Live fd counts of the kernel and its descendants (``monitor.current[pid]['total']``)."""

    def __init__(self, hz: float = DEFAULT_HZ, by_kind: bool = False, window_s: float = 60.0,
                 history: int = 1200, autostart: bool = True):
        self.chart, self.numbers = W.HTML(""), W.HTML("")
        self.chart.add_class("shmlab-fd-chart")
        self.numbers.add_class("shmlab-fd-numbers")
        # side by side where there is room, the table below the chart where there is not: a
        # table squeezed beside it scrolls sideways and cuts its last columns
        super().__init__([self.chart, W.VBox([self.numbers])],
                         layout=W.Layout(flex_flow="row wrap", grid_gap="4px 16px"))
        self.by_kind, self.window_s = by_kind, window_s
        self.current: dict[int, dict[str, int]] = {}  # pid -> fd counts, live processes only
        self.labels: dict[int, str] = {}  # pid -> 'kernel' | 'manager (shmlab)' | 'pid 123'
        self._colours: dict[int, str] = {}
        self._lines: list[tuple[int, str]] = []
        self._init_live("shmlab-fd-monitor", hz, autostart, history)
        self.children[1].children = (self.numbers, self.log_line)

    @property
    def family_total(self) -> int:
        """All fds held right now by this process and its live descendants."""
        return sum(c["total"] for c in self.current.values())

    def update(self, snap: introspect.Snapshot) -> None:
        self.current = dict(snap.fds)
        mgr = {m.pid: tr("manager ({kind})", kind=m.kind) for m in snap.managers}
        for pid in self.current:
            self.labels[pid] = (tr("kernel") if pid == os.getpid()
                                else mgr.get(pid, f"pid {pid}"))
            self._colours.setdefault(pid, PALETTE[len(self._colours) % len(PALETTE)])
        self.history.append((snap.time, {p: dict(c) for p, c in snap.fds.items()}))
        self.chart.value = CSS + self._svg(snap.time)
        self.numbers.value = CSS + self._numbers_html(snap)

    def _series(self) -> list[tuple]:
        """(label, colour, points, dash) per line: one per process, or per process and kind."""
        lines: dict[tuple[int, str], list] = {}
        recent = []  # only the samples the chart shows: a long history costs nothing per tick
        for sample in reversed(self.history):
            if self.history[-1][0] - sample[0] > self.window_s:
                break
            recent.append(sample)
        for t, fds in reversed(recent):
            for pid, counts in fds.items():
                for kind in (KINDS if self.by_kind else ("total",)):
                    if counts[kind] or (pid, kind) in lines:
                        lines.setdefault((pid, kind), []).append((t, counts[kind]))
        self._lines = list(lines)  # (pid, kind) drawn: the legend's entries
        dash = ("", "6,3", "2,2", "8,2,2,2", "1,3", "4,4")  # one pattern per fd kind
        dashes = dict(zip(KINDS, dash, strict=True), total="")
        return [(f"{self.labels.get(pid, pid)} {kind}", self._colours.get(pid, PALETTE[0]), pts,
                 dashes[kind]) for (pid, kind), pts in sorted(lines.items())]

    def _svg(self, now: float) -> str:
        series = self._series()
        return svg_chart(series, now, self.window_s, unit=tr("open fds")) + self._legend()

    def _legend(self) -> str:
        """One swatch per process drawn, those that exited too (their line just stops)."""
        pids = sorted({pid for pid, _ in self._lines}, key=lambda p: (p != os.getpid(), p))
        items = []
        for pid in pids:
            gone = pid not in self.current
            name = html.escape(str(self.labels.get(pid, f"pid {pid}")))
            items.append(f'<span class="{"gone" if gone else ""}" data-pid="{pid}">'
                         f"{_swatch(self._colours.get(pid, PALETTE[0]))} {name}"
                         f"{' ' + tr('(exited)') if gone else ''}</span>")
        kinds = "" if not self.by_kind else (
            '<span class="gone">' + tr("dash pattern = fd kind (hover a line)") + "</span>")
        return f'<div class="shmlab-legend shmlab-fd-legend">{"".join(items)}{kinds}</div>'

    def _numbers_html(self, snap) -> str:
        rows, pids = [], sorted(self.current, key=lambda p: (p != os.getpid(), p))
        for pid in pids:
            c = self.current[pid]
            swatch = _swatch(self._colours[pid])
            rows.append([f"{swatch} {html.escape(self.labels[pid])}",
                         f'<span class="shmlab-fd-total" data-pid="{pid}">{c["total"]}</span>',
                         *(str(c[k]) for k in KINDS)])
        rows.append([f"<b>{tr('all')}</b>", f'<b class="shmlab-fd-family-total">'
                     f"{self.family_total}</b>",
                     *(str(sum(c[k] for c in self.current.values())) for k in KINDS)])
        lim = snap.limits
        soft = tr("unlimited") if lim.nofile_soft < 0 else lim.nofile_soft
        stamp = time.strftime("%H:%M:%S", time.localtime(snap.time))
        return (table(_head(), rows)
                + '<div class="shmlab-muted">'
                + tr("RLIMIT_NOFILE {soft} per process", soft=soft) + " &middot; "
                + tr("{n} processes", n=len(pids)) + f" &middot; {stamp}</div>")

    def render_text(self) -> str:
        rows = [[self.labels.get(p, p), c["total"], *(c[k] for k in KINDS)]
                for p, c in sorted(self.current.items())]
        rows.append([tr("all"), self.family_total,
                     *(sum(c[k] for c in self.current.values()) for k in KINDS)])
        return tr("open fds (kernel and descendants)") + "\n" + text_table(_head(), rows)


def _head() -> list[str]:
    """The table's columns: process, total, then the fd kinds (introspect's names, kept)."""
    return [tr("process"), tr("total"), *KINDS]
