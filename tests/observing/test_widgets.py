"""shmlab.widgets, headless: the values the live views show, against real processes and files.

No browser here (tests/browser/test_browser.py renders them). Children are forked before any widget
thread starts (a fork copies one thread only), and the test process never makes a file_system
tensor itself: the scenario runs in a sender child that forks its own receiver, so the
manager's clients are all children and it exits once they are gone.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
import time

import pytest
import torch  # noqa: F401 - imported once here, so forked children start in milliseconds
from support.families import LIBS
from support.waiting import wait_for

from shmlab import introspect
from shmlab.lessons import channels
from shmlab.widgets import Dashboard, FdMonitor, LeakCleanup, in_kernel

FORK = multiprocessing.get_context("fork")




def start_sender(lib: str, n: int):
    """The leak scenario's sender child (it forks the receiver); returns (proc, info, release)."""
    info, release = FORK.Queue(), FORK.Event()
    proc = FORK.Process(target=channels.share_with_receiver, args=(lib, n, 4096, info, release))
    proc.start()
    return proc, info, release


def stop(proc, release=None):
    if release is not None:
        release.set()
    proc.join(30)
    if proc.is_alive():
        proc.kill()
        proc.join(5)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("lib", LIBS)
def test_fd_monitor_follows_a_child_opening_50_shm_fds(lib):
    go, opened, release = FORK.Event(), FORK.Event(), FORK.Event()
    child = FORK.Process(target=channels.open_shared_fds, args=(lib, 50, go, opened, release))
    child.start()  # before the monitor's thread exists
    monitor = FdMonitor()
    try:
        wait_for(lambda: child.pid in monitor.current, 5, "the new child to get its own line")
        base, family = monitor.current[child.pid]["total"], monitor.family_total
        go.set()
        assert opened.wait(30), "the child did not open its fds"
        counts = wait_for(lambda: (monitor.current.get(child.pid, {}).get("total", 0) >= base + 50
                                   and monitor.current[child.pid]), 2.0, "the count to rise by 50")
        assert counts["shm-deleted"] >= 50  # file_descriptor: unlinked segments held by fd
        assert f'data-pid="{child.pid}">{counts["total"]}<' in monitor.numbers.value
        assert "<polyline" in monitor.chart.value
        stop(child, release)
        wait_for(lambda: child.pid not in monitor.current, 2.0, "the child's line to end")
        assert monitor.family_total <= family + 5  # back to about where it was
        wait_for(lambda: f'data-pid="{child.pid}">' in monitor.chart.value
                 and "(exited)" in monitor.chart.value, 2.0, "the exited child in the legend")
        ended = [fds for _, fds in monitor.history if child.pid in fds]
        assert max(f[child.pid]["total"] for f in ended) >= base + 50  # its line stays drawn
    finally:
        monitor.close()
        stop(child, release)
    assert not monitor.poller.running


@pytest.mark.timeout(60)
@pytest.mark.parametrize("lib", LIBS)
def test_shm_files_and_leak_cleanup_follow_a_sigkilled_consumer(lib):
    """While a consumer holds them, ShmFiles lists the file_system segments at refcount 2;
    after both are SIGKILLed they turn leaked (refcount 2, creator dead), and LeakCleanup
    records the manager's reclaim with the time it took."""
    sender, info, release = start_sender(lib, 50)
    dash = Dashboard()
    try:
        pids = info.get(timeout=30)
        prefix = f"{lib}_{pids['sender']}_"
        mine = lambda: [s for s in dash.files.rows if s.name.startswith(prefix)]
        held = wait_for(lambda: len(mine()) == 50 and mine(), 2.0, "the 50 segments listed")
        assert {(s.owner, s.creator_pid, s.refcount, s.leaked) for s in held} == {
            (lib, pids["sender"], 2, False)}  # the sender and the consumer hold one count each
        assert {s.size for s in held} == {4096 + 64}  # data plus the refcount header
        row = f'<tr class="shmlab-segment"><td class="l">{held[0].name}</td>'
        # rows and the rendered table are set one after the other by the refresh thread
        wait_for(lambda: row in dash.files.table.value, 2.0, "the segment's row in the table")
        assert held[0].name in dash.files.text()

        for pid in (pids["receiver"], pids["sender"]):  # the whole job is killed
            os.kill(pid, signal.SIGKILL)
        release = None  # see share_with_receiver: never set() an Event a killed process awaited
        sender.join(30)
        leaked = wait_for(lambda: [s for s in mine() if s.leaked], 5, "the segments to leak")
        assert {s.refcount for s in leaked} == {2}  # nobody gave a count back
        assert '<tr class="shmlab-leaked">' in dash.files.table.value
        # the leak panel says so while the table shows the red rows, not only after a reclaim
        # (the manager waits a 2 s grace before it reclaims; the panel refreshes 4x a second)
        wait_for(lambda: f"segments of dead pid {pids['sender']} leaked" in
                 dash.leaks.summary.value, 2.0, "the leak panel to show the leak")
        rec = wait_for(lambda: [r for r in dash.leaks.records if r["creator"] == pids["sender"]],
                       20, "the manager to reclaim the leaked segments")[0]
        assert rec["owner"] == lib and rec["segments"] == 50
        assert 0 < rec["reclaim_s"] < 15
        assert not mine() and not [n for n in os.listdir("/dev/shm") if n.startswith(prefix)]
        if lib == "shmlab":  # the manager's own clock: last client left -> reclaimed
            wait_for(lambda: rec["log_reclaim_s"] is not None, 5, "the manager's event log")
            assert rec["log"]["reclaimed"] == 50 and 0.5 < rec["log_reclaim_s"] < 15
        assert f"segments of pid {pids['sender']} reclaimed" in dash.leaks.summary.value
        assert "reclaimed" in dash.leaks.text()
    finally:
        dash.close()
        stop(sender, release)
    assert not dash.poller.running


@pytest.mark.timeout(60)
def test_text_snapshot_in_plain_python():
    code = ("from shmlab.widgets import Dashboard, FdMonitor, ShmFiles\n"
            "FdMonitor(autostart=False).show()\n"
            "ShmFiles(autostart=False).show()\n"
            "print(repr(Dashboard(autostart=False)))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=50, check=True).stdout
    assert out.count("open fds (kernel and descendants)") == 2
    assert out.count("/dev/shm:") == 2 and "kernel" in out and "leak cleanup" in out
    assert not in_kernel()


@pytest.mark.timeout(30)
def test_errors_go_into_the_widget_never_into_the_caller():
    def broken(*args, **kwargs):
        raise OSError(24, "Too many open files")

    leaks = LeakCleanup(hz=20, autostart=False)
    leaks.poller.probe = broken  # what a refresh reads from introspect fails
    leaks.start()
    try:
        wait_for(lambda: leaks.errors, 2, "the error to be logged")
        assert "Too many open files" in leaks.log_line.value
        assert leaks.poller.running  # it keeps trying
    finally:
        leaks.close()
    assert len(leaks.errors) <= leaks.errors.maxlen


@pytest.mark.timeout(30)
def test_dashboard_buttons_history_bound_and_classes():
    dash = Dashboard(hz=50, autostart=False)
    try:
        dash.fd.history = type(dash.fd.history)(maxlen=5)
        dash.start_button.click()
        assert dash.poller.running and dash.start_button.disabled
        wait_for(lambda: len(dash.fd.history) == 5, 5, "history to fill")
        time.sleep(0.2)
        assert len(dash.fd.history) == 5  # bounded
        dash.stop_button.click()
        assert not dash.poller.running and "stopped" in dash.status.value
        classes = {c for w in (dash, dash.fd, dash.files, dash.leaks) for c in w._dom_classes}
        assert {"shmlab-dashboard", "shmlab-fd-monitor", "shmlab-shm-files",
                "shmlab-leak-cleanup"} <= classes
        with pytest.raises(ValueError, match="positive"):
            FdMonitor(hz=0)
    finally:
        dash.close()


@pytest.mark.timeout(30)
def test_probe_gives_what_introspect_snapshot_gives():
    from shmlab.widgets._probe import Prober

    probe = Prober()

    def both():  # an earlier test's child may still be exiting between the two reads
        ours, theirs = probe(), introspect.snapshot()
        return set(ours.fds) == set(theirs.fds) and (ours, theirs)

    # The same family (this process, plus multiprocessing's long-lived helpers -- forkserver,
    # resource tracker -- when earlier tests in the session started them).
    ours, theirs = wait_for(both, 5.0, "the probe and snapshot() to see the same family")
    assert os.getpid() in ours.fds
    assert ours.limits == theirs.limits and type(ours.segments) is type(theirs.segments)
    assert probe().managers is ours.managers  # cached for a second
