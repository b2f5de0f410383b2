"""TraceTimeline, headless: the lanes and marks it draws from a trace that grows while it runs.

The trace here is hand-made (``Recording``: a ``poll()`` and a ``processes`` dict, as
``shmlab.trace.Trace`` has), fed from the test while the widget's refresh thread polls it, so
what is checked is the widget alone; the notebook and the browser test draw real traces.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import pytest
from support.waiting import wait_for

from shmlab.widgets import TraceTimeline
from shmlab.widgets.tracetimeline import svg_lanes


@dataclass(frozen=True)
class Ev:  # the fields of shmlab.trace.Event the widget reads
    t: float
    pid: int
    layer: str
    name: str
    lib: str | None = None
    detail: str = ""
    segment: str | None = None
    fd: int | None = None
    duration: float | None = None


@dataclass
class Proc:
    pid: int
    label: str


class Recording:
    """A trace being recorded: ``add`` from the test, ``poll`` from the widget's thread."""

    def __init__(self):
        self.processes: dict[int, Proc] = {}
        self._new: list[Ev] = []
        self._lock = threading.Lock()
        self.running = True

    def add(self, *events: Ev, label: str | None = None) -> None:
        with self._lock:
            for e in events:
                self.processes.setdefault(e.pid, Proc(e.pid, label or f"pid {e.pid}"))
            self._new += events

    def poll(self) -> list[Ev]:
        with self._lock:
            new, self._new = self._new, []
        return new


T0 = 1_700_000_000.0


@pytest.mark.timeout(30)
def test_the_timeline_grows_while_the_trace_records_and_stops_when_it_ends():
    tr = Recording()
    tr.add(Ev(T0, 100, "python", "Queue.put", "torch"),
           Ev(T0 + 0.001, 100, "python", "reduce_storage", "torch", duration=0.002),
           Ev(T0 + 0.002, 100, "syscall", "openat", segment="/torch_100_1_0"), label="main")
    tl = TraceTimeline(tr, hz=20)
    try:
        # seen is counted before the chart is drawn: wait for the drawing itself
        wait_for(lambda: tl.seen == 3 and 'class="shmlab-trace-lane"' in tl.chart.value, 5,
                 "the first three events drawn")
        chart = tl.chart.value
        assert chart.count('class="shmlab-trace-lane"') == 1 and ">main</text>" in chart
        assert chart.count("shmlab-trace-mark shmlab-trace-python") == 2
        assert chart.count("shmlab-trace-mark shmlab-trace-syscall") == 1
        assert "reduce_storage [torch]" in chart  # the tooltip names the hop

        tr.add(Ev(T0 + 0.010, 200, "syscall", "recvmsg", detail="SCM_RIGHTS", fd=7),
               Ev(T0 + 0.011, 200, "python", "rebuild_storage_fd", "torch"), label="child 1")
        wait_for(lambda: tl.chart.value.count('class="shmlab-trace-lane"') == 2, 5,
                 "a second lane for the child")
        assert [label for _, label in tl.lanes()] == ["main", "child 1"]
        assert tl.recent.value.index("rebuild_storage_fd") < tl.recent.value.index("Queue.put")
        assert "fd 7 SCM_RIGHTS" in tl.recent.value and "recording" in tl.status.value
        assert tl.poller.running

        tr.running = False
        wait_for(lambda: not tl.poller.running, 5, "the refresh thread to stop at the end")
        assert "trace ended" in tl.status.value
        assert [e.name for e in tl.events][-1] == "rebuild_storage_fd"
    finally:
        tl.close()
    assert not tl.poller.running


@pytest.mark.timeout(30)
def test_late_events_are_put_in_time_order_and_history_is_bounded():
    tr = Recording()
    tl = TraceTimeline(tr, autostart=False, history=5)
    try:
        tr.add(*(Ev(T0 + i, 1, "python", f"e{i}") for i in (0, 2, 4)))
        tl.refresh()
        tr.add(Ev(T0 + 1, 1, "syscall", "mmap"), Ev(T0 + 3, 2, "syscall", "mmap"),
               Ev(T0 + 5, 2, "python", "e5"))  # another process's file, read later
        tl.refresh()
        assert [e.t - T0 for e in tl.events] == [1, 2, 3, 4, 5]  # the 5 latest, in order
        assert tl.seen == 6
        text = tl.text()
        assert text.startswith("trace: 6 events from 2 processes")
    finally:
        tl.close()


def test_stop_takes_what_was_recorded_since_the_last_tick():
    tr = Recording()
    tl = TraceTimeline(tr, autostart=False)
    tr.add(Ev(T0, 1, "python", "Queue.get"))
    tl.stop()
    assert tl.seen == 1 and "Queue.get" in tl.recent.value
    tl.close()


def test_a_bad_argument_says_what_to_pass():
    with pytest.raises(TypeError, match="with trace\\(\\) as tr"):
        TraceTimeline([1, 2, 3])


def test_an_empty_trace_draws_empty_lanes():
    svg = svg_lanes([], [(1, "main")])
    assert svg.startswith("<svg") and svg.endswith("</svg>") and ">main</text>" in svg


@pytest.mark.timeout(30)
def test_errors_in_poll_go_into_the_widget():
    class Broken(Recording):
        def poll(self):
            raise OSError(2, "No such file or directory")

    tl = TraceTimeline(Broken(), hz=20)
    try:
        wait_for(lambda: tl.errors, 5, "the error to be logged")
        assert "No such file" in tl.log_line.value and tl.poller.running
    finally:
        tl.close()
    time.sleep(0.1)
    assert not tl.poller.running


def test_once_the_trace_has_ended_the_timeline_draws_all_of_it():
    """Events written after the last tick are only in ``tr.events`` once the block is over
    (the live reader's files are gone): the last refresh draws the whole trace."""
    tr = Recording()
    tl = TraceTimeline(tr, autostart=False)
    tr.add(Ev(T0, 1, "python", "Queue.put"), label="main")
    tl.refresh()
    tr.poll = lambda: []  # nothing more to read live
    tr.events = [Ev(T0, 1, "python", "Queue.put"), Ev(T0 + 0.5, 2, "syscall", "mmap")]
    tr.running = False
    tl.stop()
    assert tl.seen == 2 and [e.name for e in tl.events] == ["Queue.put", "mmap"]
    assert "trace ended" in tl.status.value
    tl.close()
