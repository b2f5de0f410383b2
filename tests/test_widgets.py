"""shmlab.widgets, headless: the values the live views show, against real processes and files.

No browser here (tests/test_browser.py renders them). Children are forked before any widget
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

from shmlab import introspect, workers
from shmlab.widgets import Dashboard, FdMonitor, LeakCleanup, ShmFiles, in_kernel

FORK = multiprocessing.get_context("fork")
LIBS = ["shmlab", "torch"]


def wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"gave up after {timeout} s waiting for {what}")


def start_sender(lib: str, n: int):
    """The leak scenario's sender child (it forks the receiver); returns (proc, info, release)."""
    info, release = FORK.Queue(), FORK.Event()
    proc = FORK.Process(target=workers.share_with_receiver, args=(lib, n, 4096, info, release))
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
    child = FORK.Process(target=workers.open_shared_fds, args=(lib, 50, go, opened, release))
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
        ended = [fds for _, fds in monitor.history if child.pid in fds]
        assert max(f[child.pid]["total"] for f in ended) >= base + 50  # its line stays drawn
    finally:
        monitor.close()
        stop(child, release)
    assert not monitor.poller.running


@pytest.mark.timeout(60)
@pytest.mark.parametrize("lib", LIBS)
def test_shm_files_shows_refcount_2_while_a_consumer_holds_it(lib):
    sender, info, release = start_sender(lib, 1)
    files = ShmFiles()
    try:
        pids = info.get(timeout=30)
        prefix = f"{lib}_{pids['sender']}_"
        row = wait_for(lambda: [s for s in files.rows if s.name.startswith(prefix)], 2.0,
                       "the segment to be listed")[0]
        assert (row.owner, row.creator_pid, row.refcount, row.leaked) == (
            lib, pids["sender"], 2, False)  # the sender and the consumer each hold one count
        assert row.size == 4096 + 64  # data plus the refcount header
        assert f'<tr class="shmlab-segment"><td class="l">{row.name}</td>' in files.table.value
        assert row.name in files.text()
    finally:
        files.close()
        stop(sender, release)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("lib", LIBS)
def test_leak_cleanup_times_the_reclaim_after_a_sigkill(lib):
    sender, info, release = start_sender(lib, 50)
    dash = Dashboard()
    try:
        pids = info.get(timeout=30)
        os.kill(pids["receiver"], signal.SIGKILL)  # its 50 refcounts never come back
        sender.join(30)  # the sender sees its receiver die and exits: nobody holds the files
        prefix = f"{lib}_{pids['sender']}_"
        mine = lambda: [s for s in dash.files.rows if s.name.startswith(prefix)]
        rec = wait_for(lambda: [r for r in dash.leaks.records if r["creator"] == pids["sender"]],
                       20, "the manager to reclaim the leaked segments")[0]
        assert rec["owner"] == lib and rec["segments"] == 50
        assert 0 < rec["reclaim_s"] < 15
        assert max(leaked for _, _, leaked, _ in dash.files.history) >= 50
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
    code = ("from shmlab.widgets import Dashboard, FdMonitor\n"
            "FdMonitor(autostart=False).show()\n"
            "print(repr(Dashboard(autostart=False)))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=50, check=True).stdout
    assert out.count("open fds (kernel and descendants)") == 2
    assert "kernel" in out and "/dev/shm:" in out and "leak cleanup" in out
    assert not in_kernel()


@pytest.mark.timeout(30)
def test_errors_go_into_the_widget_never_into_the_caller(monkeypatch):
    def broken(*args, **kwargs):
        raise OSError(24, "Too many open files")

    monkeypatch.setattr(introspect, "snapshot", broken)
    leaks = LeakCleanup(hz=20)
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
