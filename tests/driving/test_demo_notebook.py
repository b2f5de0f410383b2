"""shmlab.harness.session.Session with real processes, pools, managers and /dev/shm files."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import psutil
import pytest

from shmlab import introspect
from shmlab.harness import session as notebook
from shmlab.harness.session import Session
from shmlab.harness.watch import alive


def share_under_file_system(names, release):
    """Child: one file_system tensor (starts a manager), report its file, wait, exit."""
    import shmlab
    import shmlab.multiprocessing as mp

    mp.set_sharing_strategy("file_system")
    t = shmlab.zeros(256).share_memory_()
    names.put(sorted(f for f in os.listdir("/dev/shm") if f.startswith(f"shmlab_{os.getpid()}_")))
    release.wait(60)
    del t


def lead_a_group_with_a_sleeper(pids):
    """Child: lead a new session (process group), start a sleeping grandchild, sleep."""
    os.setsid()
    pids.put(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"]).pid)
    time.sleep(120)


def _gone(pid: int) -> bool:
    return not alive(pid)  # a zombie counts as gone


@pytest.mark.timeout(120)
def test_tracks_processes_and_pools_and_closes_them_all():
    before = set(psutil.Process().children())  # e.g. a forkserver an earlier test started
    s = Session("fork")
    sleeper = s.process(time.sleep, 60)
    pool = s.pool(2)
    assert pool.map(abs, [-1, 2]) == [1, 2]
    workers = set(psutil.Process().children()) - before - {psutil.Process(sleeper.pid)}
    assert sleeper.pid in s.pids and {w.pid for w in workers} <= s.pids
    left = s.close()
    assert left == {"files": [], "managers": [], "children": []}
    assert sleeper.exitcode is not None and all(_gone(w.pid) for w in workers)
    assert s.close() == left  # twice is fine


@pytest.mark.timeout(120)
def test_lists_its_own_files_and_managers_and_leaves_nothing():
    s = Session("fork")
    names, release = s.queue(), s.ctx.Event()
    child = s.process(share_under_file_system, names, release)
    files = names.get(timeout=60)
    assert files and set(files) <= set(s.our_files()), (files, s.our_files())
    managers = s.our_managers()
    assert [m.kind for m in managers] == ["shmlab"] and managers[0].ppid == child.pid
    release.set()
    assert s.close() == {"files": [], "managers": [], "children": []}  # after the grace
    assert not [f for f in os.listdir("/dev/shm") if f in files]
    assert _gone(managers[0].pid)


@pytest.mark.timeout(120)
def test_a_killed_child_s_file_is_waited_for_until_its_manager_reclaims_it():
    s = Session("fork")
    names, release = s.queue(), s.ctx.Event()
    child = s.process(share_under_file_system, names, release)
    files = names.get(timeout=60)
    child.kill()  # no destructor runs: the file stays until the manager's grace is over
    child.join(10)
    assert set(files) <= set(s.our_files())
    assert s.close() == {"files": [], "managers": [], "children": []}


def test_close_puts_the_sharing_strategies_back():
    s = Session()
    assert s.strategies == {"torch": "file_descriptor", "shmlab": "file_descriptor"}
    for mp in s.mp.values():
        mp.set_sharing_strategy("file_system")
    s.close()
    assert {lib: mp.get_sharing_strategy() for lib, mp in s.mp.items()} == s.strategies


def test_side_by_side_runs_each_library_in_its_own_thread():
    both = threading.Barrier(2, timeout=30)  # passes only if the two run at the same time

    def scenario(lib):
        both.wait()
        return lib, threading.get_ident()

    session = Session()
    try:
        out = session.side_by_side(scenario)
    finally:
        session.close()
    assert [out[lib][0] for lib in notebook.LIBS] == list(notebook.LIBS)
    assert out["torch"][1] != out["shmlab"][1]


def test_a_widget_that_cannot_be_made_does_not_fail_the_notebook(capsys):
    assert notebook.show_widget(lambda: 1 / 0) is None
    assert "live widget not available: ZeroDivisionError" in capsys.readouterr().out
    assert notebook.show_widget("NoSuchWidget") is None


def test_show_table_prints_markdown_text(capsys):
    notebook.show_table(["", "fds"], [["torch", 1], ["shmlab", 2]])
    out = capsys.readouterr().out
    assert "|  | fds |\n|---|---|\n| torch | 1 |\n| shmlab | 2 |" in out, out


@pytest.mark.timeout(120)
def test_an_exiting_kernel_takes_its_children_down(tmp_path):
    """atexit: a kernel that exits (or restarts) without close() leaves no child behind."""
    # multiprocessing's own atexit hook would wait for the non-daemon child; Session's runs
    # first (registered later) and stops it.
    script = textwrap.dedent("""
        import time
        from shmlab.harness.session import Session
        s = Session("spawn")
        p = s.ctx.Process(target=time.sleep, args=(600,))  # not a daemon: multiprocessing
        p.start()                                         # alone would join it for 600 s
        print(s.track(p).pid, flush=True)
    """)
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=90, cwd=tmp_path, env=dict(os.environ, PYTHONPATH=repo))
    assert out.returncode == 0, out.stderr
    pid = int(out.stdout.split()[-1])
    deadline = time.monotonic() + 10
    while not _gone(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _gone(pid), f"child {pid} outlived its kernel"


@pytest.mark.timeout(180)
def test_tracks_actors_and_their_managers_and_closes_them():
    s = Session("fork")
    q = s.queue()
    producer = s.holder("shmlab", q, "file_system")  # its first allocation starts a manager
    consumer = s.holder("shmlab", q, "file_system")
    h = producer("make", "a", 1, 100)
    assert producer("send", "a") == 1 and consumer("recv", "a", 1) == {"received": 1, "error": None}
    assert {producer.pid, consumer.pid} <= s.pids
    assert h["name"] in s.our_files() and [m.ppid for m in s.our_managers()] == [producer.pid]
    assert s.close() == {"files": [], "managers": [], "children": []}
    assert not producer.is_alive() and not consumer.is_alive()
    assert s.close() == {"files": [], "managers": [], "children": []}


@pytest.mark.timeout(120)
def test_an_orphan_it_was_told_of_is_reported_until_its_group_is_killed():
    s = Session("fork")
    pids = s.queue()
    parent = s.process(lead_a_group_with_a_sleeper, pids)
    orphan = pids.get(timeout=60)
    s.pids.add(orphan)
    s.track_group(parent.pid)
    os.kill(parent.pid, signal.SIGKILL)  # the grandchild lives on, re-parented away from us
    parent.join(10)
    assert orphan in s.children() and orphan not in introspect.process_family()
    assert s.close() == {"files": [], "managers": [], "children": []}
    assert _gone(orphan)
