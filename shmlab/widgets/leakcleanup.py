"""LeakCleanup: a timeline of a process dying, its segments leaking, and a manager reclaiming them.

Two clocks measure the time to reclaim:
- observed (torch and shmlab): the poll that first sees a segment whose creator is dead
  (leaked) and the poll that first sees all of that creator's leaked segments gone; the
  resolution is one refresh period (250 ms at 4 Hz);
- the manager's event log (shmlab only; torch_shm_manager keeps none): from the ``left`` of
  the last client to the last ``reclaimed``, both stamped by the daemon itself. A WATCH
  observer streams the events (it does not keep the manager alive, so the final ``reclaimed``
  and ``exiting`` arrive before end-of-file); ``introspect.events()`` fills in what happened
  before we subscribed.
"""

from __future__ import annotations

import html
import threading
import time
from collections import Counter, deque

import ipywidgets as W

from .. import introspect
from ..manager import client as manager_client
from ..messages import tr
from ._live import CSS, DEFAULT_HZ, LiveView, svg_chart

_QUIET = frozenset({"registered", "freed"})  # shown as counts per tick, not line by line
WATCH_TIMEOUT_S = 10.0  # longer than a manager's grace (see _watch)


class LeakCleanup(LiveView, W.VBox):
    """Timeline of leaks and reclaims; ``leaks.records`` holds one dict per reclaimed leak.

    ``scope="family"`` (default) follows the segments made by, and the managers started by,
    processes ever seen in this kernel's family; ``"all"`` follows everyone's on the machine.
    """

    def __init__(self, hz: float = DEFAULT_HZ, history: int = 2000, autostart: bool = True,
                 scope: str = "family"):
        if scope not in ("family", "all"):
            raise ValueError(f"scope must be 'family' (this kernel's processes) or 'all', "
                             f"got {scope!r}")
        self.scope = scope
        self._ours: set[int] = set()  # every pid ever seen in the kernel's family
        self.summary, self.chart, self.events = W.HTML(""), W.HTML(""), W.HTML("")
        self.summary.add_class("shmlab-leak-summary")
        self.chart.add_class("shmlab-leak-chart")
        self.events.add_class("shmlab-leak-timeline")
        super().__init__([self.summary, self.chart, self.events])
        self.records: list[dict] = []  # closed incidents, oldest first
        self.timeline: deque[tuple[float, str]] = deque(maxlen=300)
        self.manager_events: deque[dict] = deque(maxlen=20000)
        self._incidents: dict[int, dict] = {}  # creator pid -> open incident
        self._leaked_at: dict[str, float] = {}  # segment name -> first poll that saw it leaked
        self._family: set[int] | None = None
        self._managers: dict[int, str] = {}
        self._inbox: deque[dict] = deque()  # events from watcher threads, drained per tick
        self._keys: set[tuple] = set()
        self._watchers: dict[str, threading.Thread] = {}
        self._halt = threading.Event()
        self.t0 = time.time()
        self._init_live("shmlab-leak-cleanup", hz, autostart, history)
        self.children = (self.summary, self.chart, self.events, self.log_line)

    # -- one tick ------------------------------------------------------------------------
    def update(self, snap: introspect.Snapshot) -> None:
        now = snap.time
        self._processes(snap)
        self._watch_managers(snap)
        self._drain_manager_events()
        live = {s.name: s for s in snap.segments if s.owner != "stdlib" and self._mine(s)}
        for seg in live.values():
            if seg.leaked and seg.name not in self._leaked_at:
                self._leaked_at[seg.name] = now
                inc = self._incidents.get(seg.creator_pid)
                if inc is None:
                    inc = self._incidents[seg.creator_pid] = {
                        "owner": seg.owner, "creator": seg.creator_pid, "leaked_t": now,
                        "names": set(), "reclaimed_t": None}
                inc["names"].add(seg.name)
        for pid, inc in list(self._incidents.items()):
            if not inc["names"] & live.keys():
                self._close(pid, inc, now)
        for name in [n for n in self._leaked_at if n not in live]:
            del self._leaked_at[name]
        for rec in self.records[-5:]:  # a log that has not come within 30 s never will
            if rec["owner"] == "shmlab" and rec["log_reclaim_s"] is None and (
                    now - rec["reclaimed_t"] < 30):
                self._from_log(rec)  # the watcher may deliver the log a tick after the unlink
        leaked = sum(1 for s in live.values() if s.leaked)
        self.history.append((now, len(live), leaked))
        self._render(now)

    def _mine(self, seg: introspect.ShmSegment) -> bool:
        return self.scope == "all" or seg.creator_pid in self._ours

    def _processes(self, snap) -> None:
        family = set(snap.fds)
        if len(self._ours) > 100_000:  # bounded, like every history here
            self._ours = set(family)
        self._ours |= family
        if self._family is not None:
            for pid in sorted(self._family - family):
                self._note(snap.time, tr("process {pid} ended (no longer in the kernel's "
                                         "family)", pid=pid))
        self._family = family
        # A manager is ours if one of our processes started it (we see it while its starter
        # lives: the starter holds a connection), even after it is re-parented to init.
        now_managers = {m.pid: m.kind for m in snap.managers if self.scope == "all"
                        or m.pid in self._managers or m.pid in family or m.ppid in self._ours}
        for pid, kind in now_managers.items():
            if pid not in self._managers:
                self._note(snap.time, tr("{kind} manager {pid} is running", kind=kind,
                                         pid=pid))
        for pid in self._managers.keys() - now_managers.keys():
            self._note(snap.time, tr("{kind} manager {pid} exited", kind=self._managers[pid],
                                     pid=pid))
        self._managers = now_managers

    def _close(self, pid: int, inc: dict, now: float) -> None:
        del self._incidents[pid]
        inc["reclaimed_t"] = now
        rec = {"owner": inc["owner"], "creator": pid, "segments": len(inc["names"]),
               "names": sorted(inc["names"]), "leaked_t": inc["leaked_t"], "reclaimed_t": now,
               "reclaim_s": now - inc["leaked_t"], "log_reclaim_s": None, "log": None}
        self.records.append(rec)
        del self.records[:-50]  # bounded, like every history here
        self._note(now, tr("{n} {owner} segments of dead pid {pid} are gone: reclaimed {s} s "
                           "after they were seen leaked", n=rec["segments"], owner=rec["owner"],
                           pid=pid, s=f"{rec['reclaim_s']:.2f}"))
        if rec["owner"] == "shmlab":
            self._from_log(rec)

    def _from_log(self, rec: dict) -> None:
        names = set(rec["names"])
        events = list(self.manager_events)
        mine = [e for e in events if e.get("event") == "reclaimed" and e.get("name") in names]
        if not mine:
            return
        done, manager = [e["t"] for e in mine], mine[0]["manager"]  # one manager per creator
        left = [e["t"] for e in events if e.get("event") == "left" and e["t"] <= min(done)
                and e["manager"] == manager]
        if left:
            rec["log_reclaim_s"] = max(done) - max(left)
            rec["log"] = {"last_client_left_t": max(left), "last_reclaimed_t": max(done),
                          "reclaimed": len(done)}

    # -- the manager's event log --------------------------------------------------------
    def _watch_managers(self, snap) -> None:
        self._halt.clear()
        for m in snap.managers:
            if m.pid not in self._managers:
                continue  # not started by the kernel's family (scope="family")
            path = m.socket_path
            if m.kind == "shmlab" and path and not (
                    path in self._watchers and self._watchers[path].is_alive()):
                t = threading.Thread(target=self._watch, args=(path,), daemon=True,
                                     name=f"shmlab-watch-{m.pid}")
                self._watchers[path] = t
                t.start()

    def _watch(self, path: str) -> None:
        """Follow one manager until it exits; resubscribe every WATCH_TIMEOUT_S to notice a
        stop().

        Why not every second: between the timeout and the new subscription the stream is
        closed, and a manager that shuts down in that gap takes its log directory with it, so
        its last events ("reclaimed", "exiting") are lost. A family's death is logged at t and
        its segments are reclaimed at t + grace (2 s, plus the liveness poll), which is exactly
        when a 1-second timeout restarted from the last event resubscribes. A timeout longer
        than the grace keeps the stream open across the whole wait."""
        while not self._halt.is_set():
            try:
                stream = manager_client.watch(path.encode(), timeout=WATCH_TIMEOUT_S)
                # what came before we subscribed, then the stream; tagged with their manager
                self._inbox.extend({**e, "manager": path} for e in introspect.events(path))
                for event in stream:
                    self._inbox.append({**event, "manager": path})
                return  # end of file: the manager has exited
            except TimeoutError:
                continue  # quiet for a second; the log file covers the gap on resubscribe
            except Exception:  # noqa: BLE001 - the manager is gone (or never was ours)
                return

    def _drain_manager_events(self) -> None:
        quiet: Counter = Counter()
        last: dict[tuple, float] = {}
        while self._inbox:
            e = self._inbox.popleft()
            key = (e.get("manager"), e.get("t"), e.get("event"), e.get("pid"), e.get("name"))
            if key in self._keys:
                continue
            self._keys.add(key)
            self.manager_events.append(e)
            kind = e.get("event")
            if kind in _QUIET or kind == "reclaimed":
                quiet[(kind, e.get("pid"))] += 1
                last[(kind, e.get("pid"))] = max(e["t"], last.get((kind, e.get("pid")), 0.0))
            else:
                why = f" ({e['reason']})" if e.get("reason") else ""
                self._note(e["t"], tr("manager log: {event} pid {pid}{why}", event=kind,
                                      pid=e.get("pid"), why=why))
        for (kind, pid), n in sorted(quiet.items(), key=str):
            self._note(last[(kind, pid)], tr("manager log: {event} x{n} (pid {pid})",
                                             event=kind, n=n, pid=pid))
        if len(self._keys) > 4 * self.manager_events.maxlen:
            self._keys = {(e.get("manager"), e.get("t"), e.get("event"), e.get("pid"),
                           e.get("name"))
                          for e in self.manager_events}

    def on_stop(self) -> None:
        self._halt.set()  # watcher threads notice within WATCH_TIMEOUT_S (daemon threads)

    # -- drawing --------------------------------------------------------------------------
    def _note(self, t: float, text: str) -> None:
        self.timeline.append((t, text))

    def _render(self, now: float) -> None:
        # what leaks right now first (the file table shows those rows in red on the same tick),
        # then the last reclaims; "no leak seen yet" only when there is neither
        leaking = sum(len(inc["names"]) for inc in self._incidents.values())
        lines = [f'<span class="shmlab-leak-open">{html.escape(line)}</span>'
                 for line in self._open_lines(now)]
        lines += [f'<span class="shmlab-leak-record">{html.escape(line)}</span>'
                  for line in self._record_lines()[-3:]]
        title = f"<b>{tr('Leak cleanup')}</b>"
        count = f'<span class="shmlab-leak-open-count">{leaking}</span>'
        self.summary.value = CSS + (
            title + " &middot; " + tr("{n} leaked, waiting for a reclaim", n=count) + "<br>"
            if leaking else title + "<br>"
        ) + ("<br>".join(lines) or '<span class="shmlab-muted">' + tr("no leak seen yet")
             + "</span>")
        series = [(tr("segments"), "#1f77b4", [(t, n) for t, n, _ in self.history]),
                  (tr("leaked"), "#d62728", [(t, k) for t, _, k in self.history])]
        self.chart.value = svg_chart(series, now, 60.0, height=140,
                                     unit=tr("segments (blue) / leaked (red)"))
        lines = [f"{t - self.t0:+8.2f} s  {text}" for t, text in sorted(self.timeline)[-14:]]
        self.events.value = CSS + '<pre class="shmlab-muted" style="margin:0">' + html.escape(
            "\n".join(lines)) + "</pre>"

    def _open_lines(self, now: float) -> list[str]:
        return [tr("{owner}: {n} segments of dead pid {pid} leaked {s} s ago, not reclaimed "
                   "yet", owner=inc["owner"], n=len(inc["names"]), pid=pid,
                   s=f"{now - inc['leaked_t']:.1f}")
                for pid, inc in sorted(self._incidents.items())]

    def _record_lines(self) -> list[str]:
        out = []
        for r in self.records:
            line = tr("{owner}: {n} segments of pid {pid} reclaimed {s} s after seen leaked "
                      "(observed)", owner=r["owner"], n=r["segments"], pid=r["creator"],
                      s=f"{r['reclaim_s']:.2f}")
            if r["log_reclaim_s"] is not None:
                line += "; " + tr("{s} s after the last client left (manager log)",
                                  s=f"{r['log_reclaim_s']:.2f}")
            out.append(line)
        return out

    def render_text(self) -> str:
        lines = [tr("leak cleanup"), *self._open_lines(time.time()), *self._record_lines()]
        lines += [f"{t - self.t0:+8.2f} s  {text}" for t, text in sorted(self.timeline)[-20:]]
        return "\n".join(lines)
