"""The refresh loop every widget shares: a daemon thread, a snapshot per tick, errors kept in view.

Note [A thread, not asyncio]
A notebook cell that blocks (``p.join()``, ``time.sleep``) blocks the kernel's event loop, so an
asyncio task would freeze exactly while the interesting thing happens. A daemon thread keeps
running; it only *sets widget traits*, which ipykernel sends over its thread-safe IOPub socket.
One thread serves a whole Dashboard: one snapshot per tick feeds every view.
The thread stops when its widget is closed, when ``stop()`` is called, or at interpreter exit
(an ``atexit`` hook, so no update races the kernel's shutdown). Whatever fails inside a tick is
written into the widget's log line, never raised into the notebook.

Note [Why SVG in an HTML widget, not matplotlib]
matplotlib in an ``Output`` clears and redraws the image on every frame: it flickers (ipywidgets
#1940, #2419, #3608) and costs tens of ms of CPU per frame, which at 4 Hz would slow the very
benchmark we watch. An SVG polyline string is built in well under a millisecond, replaces the
HTML widget's value in one DOM swap (no blank frame), takes the theme's text colour through
``currentColor`` (light and dark JupyterLab themes alike), and is plain text a test can read.
"""

from __future__ import annotations

import atexit
import html
import threading
import time
import traceback
import weakref
from collections import deque

import ipywidgets as W

from ._helper import RemoteProber
from ._probe import Prober

DEFAULT_HZ = 4.0
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
           "#17becf", "#bcbd22", "#7f7f7f")
# Note [Colours from the theme]
# Every text colour and background here is one of JupyterLab's theme variables (fallback: the
# light theme's value), so the same HTML reads in the light and the dark theme: no hard-coded
# light grey that glares on black, no dark red that vanishes into it. A leaked row gets a
# translucent red that tints either background, its text keeps the theme's body colour (red
# text on a red tint fails contrast in one theme or the other), and a red bar at its left.
# Tables size to their content; long text wraps (class "w") instead of widening the table.
CSS = """<style>
.shmlab-table{border-collapse:collapse;font-family:var(--jp-code-font-family,monospace);
 font-size:12px;color:var(--jp-ui-font-color1,inherit);width:auto}
.shmlab-table th,.shmlab-table td{padding:1px 5px;text-align:right;vertical-align:top;
 border-bottom:1px solid var(--jp-border-color2,rgba(128,128,128,.3))}
.shmlab-table td,.shmlab-table th{white-space:nowrap}.shmlab-table th{font-weight:600}
.shmlab-shm-table{max-height:270px;overflow:auto}
.shmlab-table td.l,.shmlab-table th.l{text-align:left}
.shmlab-table td.w{white-space:normal;min-width:14em;max-width:40em;overflow-wrap:anywhere}
.shmlab-leaked td{background:rgba(229,57,53,.18);font-weight:600}
.shmlab-leaked td:first-child{box-shadow:inset 3px 0 var(--jp-error-color1,#d32f2f)}
.shmlab-muted{color:var(--jp-ui-font-color2,#616161);font-size:12px}
.shmlab-log{color:var(--jp-error-color1,#d32f2f);font-family:monospace;font-size:11px}
.shmlab-legend{display:flex;flex-wrap:wrap;gap:2px 12px;font-size:11px;max-width:520px;
 color:var(--jp-ui-font-color1,inherit)}
.shmlab-legend .gone{color:var(--jp-ui-font-color2,#616161)}
</style>"""

_running: weakref.WeakSet = weakref.WeakSet()


@atexit.register
def _stop_all() -> None:  # the kernel is shutting down: stop touching widgets first
    for poller in list(_running):
        poller.stop(timeout=1.0)


def in_kernel() -> bool:
    """True inside a Jupyter kernel, where widgets render; False in plain Python."""
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and getattr(shell, "kernel", None) is not None


class Poller:
    """A daemon thread: every 1/hz s take a snapshot (a ``Prober``) and pass it to each view."""

    def __init__(self, views, hz: float = DEFAULT_HZ):
        if not hz > 0:
            raise ValueError(f"hz must be a positive refresh rate, got {hz!r}")
        self.views, self.period = list(views), 1.0 / hz
        self.probe = Prober()  # introspect.snapshot() with managers/limits cached a while
        self.helper = True  # the thread probes through a helper process (False: in-process)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        if not self.running:
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="shmlab-widgets", daemon=True)
            self._thread.start()
            _running.add(self)

    def stop(self, timeout: float = 2.0) -> None:
        self._stop.set()
        for view in self.views:
            view.on_stop()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
        _running.discard(self)

    def tick(self, probe=None) -> bool:
        """One refresh, on the calling thread; never raises. False if ``probe`` failed."""
        try:
            snap = (probe or self.probe)()
        except Exception as exc:  # noqa: BLE001 - shown in the widget, never raised
            for view in self.views:
                view.log_error(exc)
            return False
        for view in self.views:
            view.safe_update(snap)
        return True

    def _remote(self) -> RemoteProber | None:
        """A helper process that probes for the thread (_helper.py, Note [Probing off the
        timed path]), or None: in-process, if it cannot start, or if ``probe`` was replaced."""
        if not self.helper or type(self.probe) is not Prober:
            return None  # asked not to, or someone (a test) put its own probe in: use that
        try:
            return RemoteProber()
        except Exception as exc:  # noqa: BLE001 - say why, then probe in-process as before
            for view in self.views:
                view.log_error(exc)
            return None

    def _run(self) -> None:
        remote = self._remote()
        try:
            due = time.monotonic()
            while not self._stop.is_set():
                if any(getattr(v, "comm", True) is None for v in self.views):
                    break  # a view was closed (its comm is gone): nothing left to draw on
                if not self.tick(remote) and remote is not None:
                    remote.close()  # the helper failed (its error is logged): in-process
                    remote = None
                due += self.period
                now = time.monotonic()
                if due < now:  # a slow tick: skip the missed ones instead of catching up
                    due = now
                self._stop.wait(due - now)
        finally:
            if remote is not None:
                remote.close()
            _running.discard(self)


class LiveView:
    """Mixin for a widget fed by snapshots: update/log/text/show and its own optional Poller."""

    poller: Poller | None = None

    def _init_live(self, css_class: str, hz: float, autostart: bool, history: int) -> None:
        self.add_class("shmlab-widget")
        self.add_class(css_class)
        self.errors: deque[str] = deque(maxlen=20)
        self.history: deque = deque(maxlen=history)  # bounded: a long session uses fixed memory
        self.log_line = W.HTML("")
        self.log_line.add_class("shmlab-log")
        self.poller = Poller([self], hz)
        self.updated = None  # time.time() of the last snapshot shown
        if autostart:
            self.poller.start()

    def start(self) -> None:
        self.poller.start()

    def on_stop(self) -> None:
        """Called when the poller feeding this view stops (override to stop helpers)."""

    def stop(self) -> None:
        self.poller.stop()

    def close(self) -> None:
        if self.poller is not None:
            self.poller.stop()
        super().close()

    def safe_update(self, snap) -> None:
        try:
            self.update(snap)
            self.updated = snap.time
        except Exception as exc:  # noqa: BLE001 - a view must keep running and say what broke
            self.log_error(exc)

    def log_error(self, exc: BaseException) -> None:
        try:
            last = traceback.format_exception_only(type(exc), exc)[-1].strip()
            self.errors.append(f"{time.strftime('%H:%M:%S')} {last}")
            self.log_line.value = "<br>".join(html.escape(e) for e in list(self.errors)[-3:])
        except Exception:  # noqa: BLE001, S110 - the last line of defence must not raise
            pass

    def refresh(self) -> None:
        """Take one snapshot now (on this thread), e.g. before printing a text snapshot."""
        Poller([self]).tick()

    def show(self) -> None:
        """Display the live widget in Jupyter; print a text snapshot in plain Python."""
        if in_kernel():
            from IPython.display import display

            display(self)
        else:
            print(self.text())

    def text(self) -> str:
        if self.updated is None:
            self.refresh()
        body = self.render_text()
        return body + "".join(f"\n! {e}" for e in self.errors)

    def __repr__(self) -> str:
        return self.text()


def svg_chart(series, t_now: float, window_s: float, width=520, height=210, unit="fds") -> str:
    """Lines over the last ``window_s`` seconds. ``series``: [(label, colour, [(t, y), ...], dash?)]
    where a line that ended (a process that exited) simply has no later points."""
    left, right, top, bottom = 44, 8, 20, 22  # top: room for the axis title above "100"
    pw, ph = width - left - right, height - top - bottom
    ymax = max([y for s in series for _, y in s[2]] + [1])
    ymax = _nice(ymax * 1.1)
    x = lambda t: left + pw * (1 - (t_now - t) / window_s)
    y = lambda v: top + ph * (1 - v / ymax)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'class="shmlab-chart" style="color:var(--jp-ui-font-color1,#333)">']
    for i in range(5):  # horizontal grid and y labels
        v = ymax * i / 4
        out.append(f'<line x1="{left}" x2="{width - right}" y1="{y(v):.1f}" y2="{y(v):.1f}" '
                   f'stroke="currentColor" stroke-opacity="0.15"/>'
                   f'<text x="{left - 4}" y="{y(v) + 4:.1f}" font-size="10" text-anchor="end" '
                   f'fill="currentColor">{v:g}</text>')
    for s in range(0, int(window_s) + 1, max(1, int(window_s) // 6)):
        out.append(f'<text x="{x(t_now - s):.1f}" y="{height - 6}" font-size="10" '
                   f'text-anchor="middle" fill="currentColor">-{s}s</text>')
    for label, colour, pts, *dash in series:
        pts = [(t, v) for t, v in pts if t_now - t <= window_s]
        if not pts:
            continue
        path = " ".join(f"{x(t):.1f},{y(v):.1f}" for t, v in pts)
        dashes = f' stroke-dasharray="{dash[0]}"' if dash and dash[0] else ""
        out.append(f'<polyline fill="none" stroke="{colour}" stroke-width="1.8"{dashes} '
                   f'points="{path}"><title>{html.escape(label)}</title></polyline>')
    out.append(f'<text x="4" y="12" font-size="10" fill="currentColor">{unit}</text>')
    return "".join(out) + "</svg>"


def _nice(v: float) -> float:
    """The next 'round' axis maximum at or above ``v``: 1, 2 or 5 times a power of ten."""
    step = 1.0
    while step * 10 <= v:
        step *= 10
    for m in (1, 2, 5, 10):
        if m * step >= v:
            return m * step
    return 10 * step


def table(head, rows, row_classes=None, left=(0,), wrap=()) -> str:
    """An HTML table; ``rows`` are lists of already-escaped cell strings. Columns in ``left``
    are left-aligned (numbers stay right-aligned), those in ``wrap`` wrap their text."""
    classes = row_classes or [""] * len(rows)

    def cls(i):
        return " ".join(c for c, on in (("l", i in left), ("w", i in wrap)) if on)

    th = "".join(f'<th class="{cls(i)}">{h}</th>' for i, h in enumerate(head))
    body = "".join(
        f'<tr class="{c}">' + "".join(
            f'<td class="{cls(i)}">{cell}</td>' for i, cell in enumerate(r))
        + "</tr>" for r, c in zip(rows, classes, strict=True))  # fmt: skip
    return f'<table class="shmlab-table"><tr>{th}</tr>{body}</table>'


def text_table(head, rows) -> str:
    """A plain-text table with right-aligned columns (the first one left-aligned)."""
    cells = [list(map(str, head))] + [list(map(str, r)) for r in rows]
    widths = [max(_width(r[i]) for r in cells) for i in range(len(head))]

    def pad(i: int, c: str, w: int) -> str:
        fill = " " * (w - _width(c))
        return c + fill if i == 0 else fill + c

    return "\n".join("  ".join(pad(i, c, w) for i, (c, w) in enumerate(zip(r, widths, strict=True)))
                     for r in cells)


def _width(text: str) -> int:
    """Columns ``text`` takes in a terminal: a Chinese character (East Asian wide or
    full-width) takes two, so a Chinese column name keeps the table aligned."""
    import unicodedata

    return sum(2 if unicodedata.east_asian_width(ch) in "WF" else 1 for ch in text)
