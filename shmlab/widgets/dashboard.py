"""Dashboard: FdMonitor, ShmFiles and LeakCleanup fed by one refresh thread, with start/stop."""

from __future__ import annotations

import ipywidgets as W

from ._live import DEFAULT_HZ, LiveView, Poller
from .fdmonitor import FdMonitor
from .leakcleanup import LeakCleanup
from .shmfiles import ShmFiles


class Dashboard(LiveView, W.VBox):
    """The three live views; one ``introspect.snapshot()`` per tick serves all of them."""

    def __init__(self, hz: float = DEFAULT_HZ, by_kind: bool = False, autostart: bool = True,
                 scope: str = "family"):
        self.fd = FdMonitor(hz, by_kind=by_kind, autostart=False)
        self.files = ShmFiles(hz, autostart=False)
        self.leaks = LeakCleanup(hz, autostart=False, scope=scope)
        self.start_button = W.Button(description="start", icon="play", tooltip="start refreshing")
        self.stop_button = W.Button(description="stop", icon="stop", tooltip="stop refreshing")
        self.status = W.HTML("")
        for w, cls in ((self.start_button, "shmlab-start"), (self.stop_button, "shmlab-stop"),
                       (self.status, "shmlab-status")):
            w.add_class(cls)
        self.start_button.on_click(lambda _: self.start())
        self.stop_button.on_click(lambda _: self.stop())
        bar = W.HBox([self.start_button, self.stop_button, self.status])
        lower = W.HBox([self.files, self.leaks], layout=W.Layout(flex_flow="row wrap",
                                                                   grid_gap="16px"))
        super().__init__([bar, self.fd, lower])
        self.add_class("shmlab-widget")
        self.add_class("shmlab-dashboard")
        self.hz = hz
        self.errors = self.fd.errors  # the fd view's log line shows the shared thread's errors
        self.updated = None
        self.poller = Poller([self.fd, self.files, self.leaks, self], hz)
        self._set_status(False)
        if autostart:
            self.start()

    def start(self) -> None:
        self.poller.start()
        self._set_status(True)

    def stop(self) -> None:
        self.poller.stop()
        self._set_status(False)

    def close(self) -> None:
        self.poller.stop()
        for view in (self.fd, self.files, self.leaks):
            view.close()
        super(LiveView, self).close()

    def _set_status(self, running: bool) -> None:
        self.start_button.disabled, self.stop_button.disabled = running, not running
        state = f"refreshing {self.hz:g}x per second" if running else "stopped"
        self.status.value = f'<span class="shmlab-muted shmlab-state-{running}">{state}</span>'

    # The Dashboard itself is the last view of its poller: it just records the time.
    def safe_update(self, snap) -> None:
        self.updated = snap.time

    def log_error(self, exc: BaseException) -> None:
        pass  # already logged by the three views

    def refresh(self) -> None:
        self.poller.tick()

    def render_text(self) -> str:
        return "\n\n".join(v.render_text() for v in (self.fd, self.files, self.leaks))
