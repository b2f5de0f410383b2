"""TraceTimeline: a ``shmlab.trace`` trace drawn live, one lane per process, one mark per event.

Mirrors: nothing in torch; torch has no view of one tensor's trip across processes. What it
draws is what ``shmlab.trace`` recorded (its ``Trace``): the widget only reads ``tr.poll()``
(the events since the last call) and ``tr.processes`` (pid -> label), so it works on a trace
that is still being recorded, and on a finished one, or one read back with ``Trace.from_json``.

Each process is a lane, labelled as the trace labels it ("main", "child 1", "manager"); every
event is a mark at its time on one shared axis: a Python hop (``reduce_storage``,
``rebuild_storage_fd``, ...) a circle, a system call (``openat``, ``sendmsg``, ...) a bar, an
event with a duration a line as long as it lasted. Hovering a mark names it. Below the chart,
the last events as a table, the newest first. It grows while the traced code runs, from the
refresh thread every widget shares (``_live.py``): that thread calls ``tr.poll()`` instead of
probing ``/proc``, and it stops when the trace has ended, or at ``close()`` / ``stop()``.
"""

from __future__ import annotations

import html
import time
from dataclasses import dataclass, field

import ipywidgets as W

from ..messages import N_, tr
from ._live import CSS, DEFAULT_HZ, LiveView, Poller, table, text_table

# Two kinds of mark, told apart by shape first and colour second. Both colours keep at least
# 3:1 against the light theme's white and the dark theme's near-black (WCAG 1.4.11, non-text).
KINDS = {"python": ("#1f77b4", N_("Python hop (circle)")),
         "syscall": ("#d95f02", N_("system call (bar)"))}
MAX_EVENTS = 5000  # bounded: a long trace keeps its latest marks, the count says what was seen
ROWS = 12  # events in the table below the chart


@dataclass
class Polled:
    """One refresh: what ``tr.poll()`` gave, when, and whether the trace has ended."""

    time: float
    events: list = field(default_factory=list)
    finished: bool = False


def finished(tr) -> bool:
    """Has the trace stopped recording? ``tr.running`` says so; a trace read back from JSON
    (or a hand-made one) has none set and is finished."""
    return not getattr(tr, "running", False)


class TraceTimeline(LiveView, W.VBox):
    """Live lanes of a trace (``timeline.events``: every event drawn so far, in time order)."""

    def __init__(self, tr, hz: float = DEFAULT_HZ, width: int = 760, autostart: bool = True,
                 history: int = MAX_EVENTS):
        if not (hasattr(tr, "poll") and hasattr(tr, "processes")):
            raise TypeError(f"TraceTimeline draws a shmlab.trace Trace (from `with trace() as "
                            f"tr:`), got {type(tr).__name__}")
        self.trace, self.width = tr, width
        self.status, self.chart, self.recent = W.HTML(""), W.HTML(""), W.HTML("")
        self.status.add_class("shmlab-trace-status")
        self.chart.add_class("shmlab-trace-chart")
        self.recent.add_class("shmlab-trace-recent")
        super().__init__([self.status, self.chart, self.recent])
        self.seen = 0  # events polled in all, kept or not
        self.ended = False
        self._init_live("shmlab-trace-timeline", hz, False, history)
        self.events = self.history  # the bounded deque of events, oldest first
        self.poller.probe = self._poll  # not a Prober: the Poller runs it in-process
        self.children = (self.status, self.chart, self.recent, self.log_line)
        if autostart:
            self.start()

    def _poll(self) -> Polled:
        done = finished(self.trace)  # read first: an event polled after it is still drawn
        return Polled(time.time(), list(self.trace.poll()), done)

    def update(self, snap: Polled) -> None:
        new = sorted(snap.events, key=lambda e: e.t)
        self.seen += len(new)
        if snap.finished and getattr(self.trace, "events", None):
            new = self._whole()  # the trace is complete: draw all of it, in order
        if new and self.events and new[0].t < self.events[-1].t:  # late arrivals: re-sort
            merged = sorted([*self.events, *new], key=lambda e: e.t)
            self.events.clear()
            self.events.extend(merged)
        else:
            self.events.extend(new)
        self.ended = snap.finished
        if new or self.updated is None or snap.finished:
            self._draw(snap.time)
        if snap.finished and self.poller.running:
            self.poller.stop()  # from its own thread: it only sets the stop flag

    def _whole(self) -> list:
        """Once the block has ended: every event of the trace. Those written after the last
        tick are read at the block's end into ``tr.events`` (the live reader's files are gone
        by then), so the timeline starts over from the complete list."""
        self.events.clear()
        self.seen = len(self.trace.events)
        return sorted(self.trace.events, key=lambda e: e.t)

    def refresh(self) -> None:
        """Poll once now, on this thread (e.g. after the traced block, before ``text()``)."""
        Poller([self]).tick(self._poll)

    def stop(self) -> None:
        self.poller.stop()
        self.refresh()  # the events recorded since the thread's last tick
        self._draw(time.time())

    # --- drawing -------------------------------------------------------------------------------
    def lanes(self) -> list[tuple[int, str]]:
        """(pid, label) per lane: the trace's processes, then any other pid seen in an event,
        in the order each first appears ("main" first)."""
        procs = dict(self.trace.processes)  # one copy: the recorder may add a process meanwhile
        first: dict[int, float] = {}
        for e in self.events:
            first.setdefault(e.pid, e.t)
        pids = sorted(set(procs) | set(first), key=lambda p: (
            getattr(procs.get(p), "label", "") != "main", first.get(p, float("inf")), p))
        return [(p, getattr(procs.get(p), "label", None) or f"pid {p}") for p in pids]

    def _draw(self, now: float) -> None:
        lanes = self.lanes()
        state = tr("recording") if not self.ended else tr("trace ended")
        counts = tr("{events} events from {processes} processes",
                    events=f'<b class="shmlab-trace-count">{self.seen}</b>',
                    processes=f"<b>{len(lanes)}</b>")
        self.status.value = CSS + (
            f'<span class="shmlab-muted">{counts} &middot; '
            f'<span class="shmlab-trace-state">{state}</span> &middot; '
            f"{time.strftime('%H:%M:%S', time.localtime(now))}</span>")
        self.chart.value = CSS + svg_lanes(list(self.events), lanes, self.width) + _legend()
        self.recent.value = CSS + self._recent_html(dict(lanes))

    def _recent_html(self, labels: dict[int, str]) -> str:
        if not self.events:
            return f'<div class="shmlab-muted">{tr("no event yet")}</div>'
        t0 = self.events[0].t
        rows = [[f"{(e.t - t0) * 1e3:.1f}", html.escape(labels.get(e.pid, str(e.pid))),
                 e.layer, html.escape(e.name), html.escape(_about(e))]
                for e in reversed(list(self.events)[-ROWS:])]
        return table(["ms", tr("process"), tr("layer"), tr("event"),
                      tr("segment / fd / detail")], rows,
                     left=(1, 2, 3, 4), wrap=(4,))

    def render_text(self) -> str:
        lanes = self.lanes()
        counts = [[label, *(sum(e.pid == pid and e.layer == k for e in self.events)
                            for k in KINDS)] for pid, label in lanes]
        head = tr("trace: {events} events from {processes} processes", events=self.seen,
                  processes=len(lanes))
        return head + ("\n" + text_table([tr("process"), *KINDS], counts) if lanes else "")


def _about(e) -> str:
    parts = [e.segment or "", "" if e.fd is None else f"fd {e.fd}", e.detail or ""]
    return " ".join(p for p in parts if p)[:120]


def _legend() -> str:
    items = "".join(
        f'<span><svg width="14" height="10"><{shape} fill="{colour}"/></svg> {tr(label)}</span>'
        for (colour, label), shape in zip(KINDS.values(), (
            'circle cx="7" cy="5" r="4"', 'rect x="5" y="0" width="4" height="10"'), strict=True))
    return f'<div class="shmlab-legend shmlab-trace-legend">{items}</div>'


def svg_lanes(events, lanes, width: int = 760, lane_h: int = 30) -> str:
    """One lane per (pid, label), a mark per event at its time; the axis spans all events."""
    left, right, top, bottom = 120, 12, 8, 24
    height = top + bottom + lane_h * max(1, len(lanes))
    pw = width - left - right
    t0 = events[0].t if events else 0.0
    span = max((events[-1].t - t0) if events else 0.0, 1e-3)
    x = lambda t: left + pw * (t - t0) / span
    row = {pid: i for i, (pid, _) in enumerate(lanes)}
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'class="shmlab-trace-svg" style="color:var(--jp-ui-font-color1,#333)">']
    for i, (pid, label) in enumerate(lanes):
        mid = top + lane_h * i + lane_h / 2
        out.append(f'<g class="shmlab-trace-lane" data-pid="{pid}">'
                   f'<line x1="{left}" x2="{width - right}" y1="{mid}" y2="{mid}" '
                   f'stroke="currentColor" stroke-opacity="0.25"/>'
                   f'<text x="{left - 6}" y="{mid + 4}" font-size="11" text-anchor="end" '
                   f'fill="currentColor">{html.escape(label[:18])}</text></g>')
    for k in range(6):  # the time axis, in ms from the first event
        t = t0 + span * k / 5
        anchor = "end" if k == 5 else "middle"  # the last label inside the picture
        out.append(f'<text x="{x(t):.1f}" y="{height - 6}" font-size="10" '
                   f'text-anchor="{anchor}" fill="currentColor">{(t - t0) * 1e3:.0f} ms</text>')
    for e in events:
        if e.pid not in row:
            continue
        mid, (colour, _) = top + lane_h * row[e.pid] + lane_h / 2, KINDS.get(
            e.layer, KINDS["python"])
        tip = html.escape(f"{e.name} [{e.lib or e.layer}] {_about(e)}")
        if e.duration:
            out.append(f'<line x1="{x(e.t):.1f}" x2="{x(e.t + e.duration):.1f}" y1="{mid}" '
                       f'y2="{mid}" stroke="{colour}" stroke-width="3" stroke-opacity="0.6"/>')
        if e.layer == "python":  # above the lane's line; system calls below it
            tag, where = "circle", f'cx="{x(e.t):.1f}" cy="{mid - 6}" r="4"'
        else:
            tag, where = "rect", f'x="{x(e.t) - 1.5:.1f}" y="{mid - 1}" width="3" height="10"'
        out.append(f'<{tag} {where} fill="{colour}" class="shmlab-trace-mark '
                   f'shmlab-trace-{e.layer}"><title>{tip}</title></{tag}>')
    return "".join(out) + "</svg>"
