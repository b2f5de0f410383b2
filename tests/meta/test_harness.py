"""The harness can fail: leaks are caught, outputs are caught, and `make lab` really serves.

These tests prove the checks in support/leakcheck.py and test_notebooks.py are not vacuous, and
that the README's first command starts a JupyterLab rooted at notebooks/.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import nbformat
import psutil
import pytest
from support import nbutil

TESTS = Path(__file__).resolve().parents[1]  # tests/: where `support` is

# --- (a) the leak checker fails a leaking test and cleans up after it ------------------------

LEAKY_TESTS = """
import os
import subprocess

def test_clean():
    pass

def test_leaks_a_shm_file():
    name = f"/dev/shm/shmlab_{os.getpid()}_0_0"
    os.close(os.open(name, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600))
    with open("leaked_file", "w") as f:
        f.write(name)

def test_leaks_a_child_process():
    child = subprocess.Popen(["sleep", "60"])
    with open("leaked_pid", "w") as f:
        f.write(str(child.pid))
"""


@pytest.fixture
def leaky_run(pytester, monkeypatch):
    """Run LEAKY_TESTS in a separate pytest with only the leak checker loaded."""
    pytester.makepyfile(test_leaky=LEAKY_TESTS)
    monkeypatch.setenv("PYTHONPATH", str(TESTS), prepend=os.pathsep)
    monkeypatch.setenv("SHMLAB_LEAKCHECK_GRACE", "0.5")  # the leak is real; no need to wait 6 s
    result = pytester.runpytest_subprocess(
        "-p", "support.leakcheck", "-p", "no:cacheprovider", "-v"
    )
    return pytester, result


@pytest.mark.timeout(120)
def test_leakcheck_fails_a_test_that_leaks_and_cleans_up(leaky_run):
    pytester, result = leaky_run
    # Both leaking tests pass their own body and then error in the checker's teardown.
    result.assert_outcomes(passed=3, errors=2)
    result.stdout.fnmatch_lines(
        [
            "*ERROR at teardown of test_leaks_a_shm_file*",
            "*left these behind*",
            "*/dev/shm/shmlab_*_0_0*",
            "*ERROR at teardown of test_leaks_a_child_process*",
            "*left these behind*",
            "*process * 'sleep 60'*",
        ]
    )
    result.stdout.no_fnmatch_line("*ERROR at teardown of test_clean*")
    leaked_file = (pytester.path / "leaked_file").read_text()
    assert not os.path.exists(leaked_file), "the checker should have unlinked the leaked file"
    leaked_pid = int((pytester.path / "leaked_pid").read_text())
    assert not psutil.pid_exists(leaked_pid), "the checker should have killed the leaked child"


ORPHAN = """
import subprocess, sys
p = subprocess.Popen([sys.executable, "-m", "shmlab.manager", "--grace", "60"],
                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
print(p.pid, p.stdout.readline().decode().strip(), flush=True)
"""  # the starter exits at once: its manager is an orphan, re-parented away from us


def _orphaned_manager(env: dict, dirs: list[str]) -> int:
    out = subprocess.run([sys.executable, "-c", ORPHAN], env=env, capture_output=True,
                         text=True, timeout=60, check=True).stdout.split()
    assert out[1].endswith("/manager.sock"), out
    dirs.append(os.path.dirname(out[1]))  # a SIGKILLed manager cannot remove its directory
    return int(out[0])


TMP_TESTS = """
import multiprocessing.util, os, tempfile

def test_leaks_a_directory():
    with open(os.path.join(os.environ["OUT"], "leaked_dir"), "w") as f:
        f.write(tempfile.mkdtemp())

def test_torch_leaves_an_error_file():
    fd, path = tempfile.mkstemp(prefix="pytorch-errorfile-", suffix=".pickle")
    os.close(fd)  # what torch.multiprocessing.spawn leaves when a rank raises
    with open(os.path.join(os.environ["OUT"], "errorfile"), "w") as f:
        f.write(path)

def test_own_multiprocessing_tempdir_is_kept():
    assert os.path.isdir(multiprocessing.util.get_temp_dir())  # made once, removed at exit

def test_cleans_up_after_itself():
    os.rmdir(tempfile.mkdtemp())
    with open(os.path.join(os.environ["OUT"], "tmpdir"), "w") as f:
        f.write(tempfile.gettempdir())
"""


@pytest.mark.timeout(120)
def test_leakcheck_fails_a_test_that_leaves_an_entry_in_tmpdir(pytester, monkeypatch):
    """Note [A TMPDIR per run and per worker]: a test's leftover directory fails it and goes;
    torch's own leftovers are removed and named, not failed; the run's TMPDIR goes at the end."""
    pytester.makepyfile(test_tmp=TMP_TESTS)
    monkeypatch.setenv("PYTHONPATH", str(TESTS), prepend=os.pathsep)
    monkeypatch.setenv("SHMLAB_LEAKCHECK_GRACE", "0.5")
    monkeypatch.setenv("OUT", str(pytester.path))
    result = pytester.runpytest_subprocess("-p", "support.leakcheck", "-p", "no:cacheprovider",
                                           "-v")
    result.assert_outcomes(passed=4, errors=1)
    leaked = (pytester.path / "leaked_dir").read_text()
    result.stdout.fnmatch_lines(["*ERROR at teardown of test_leaks_a_directory*",
                                 f"*$TMPDIR/{os.path.basename(leaked)}*",
                                 "*torch's and multiprocessing's own leftovers in TMPDIR*",
                                 "*test_torch_leaves_an_error_file: pytorch-errorfile-*.pickle"])
    result.stdout.no_fnmatch_line("*ERROR at teardown of test_torch_leaves_an_error_file*")
    run_tmpdir = (pytester.path / "tmpdir").read_text()
    assert os.path.dirname(leaked) == run_tmpdir != tempfile.gettempdir()  # a TMPDIR of its own
    assert os.path.basename(run_tmpdir).startswith("slt")
    assert not os.path.exists(leaked) and not os.path.exists(
        (pytester.path / "errorfile").read_text())
    assert not os.path.exists(run_tmpdir), "the run's TMPDIR should go at the end of the run"


@pytest.mark.timeout(90)
def test_leakcheck_blames_only_orphaned_managers_of_its_own_run():
    """Two real shmlab managers orphaned the same way: one started under this run's marker,
    one under another run's (the environment a test run next to ours gives its children).
    Only ours is this test's leak once both are re-parented to init; the other is not killed."""
    from support import leakcheck

    ours = theirs = None
    dirs: list[str] = []
    try:
        ours = _orphaned_manager(dict(os.environ), dirs)
        theirs = _orphaned_manager(dict(os.environ, **{leakcheck.RUN_ENV: "another-run"}), dirs)
        found = leakcheck.manager_pids()
        parents = {pid: psutil.Process(pid).ppid() for pid in (ours, theirs)}
    finally:
        for pid in (ours, theirs):
            if pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        for d in dirs:
            shutil.rmtree(d, ignore_errors=True)
    print(f"ours {ours}, theirs {theirs}, parents {parents}, found {found}")
    assert all(ppid != os.getpid() for ppid in parents.values())  # orphans, both
    assert ours in found and theirs not in found
    deadline = time.monotonic() + 10  # not our children: whoever adopted them reaps them
    while {ours, theirs} & leakcheck.manager_pids() and time.monotonic() < deadline:
        time.sleep(0.05)


# Another program on the machine (another test run, a learner's notebook) makes a /dev/shm file
# while a test runs, and exits: Note [Whose /dev/shm file is it?] in support/leakcheck.py.
MAKE_FILE = """
import os, sys, time
deadline = time.monotonic() + 60
while not os.path.exists(sys.argv[1]) and time.monotonic() < deadline:
    time.sleep(0.01)  # wait for the go-ahead: the file must appear *during* the test
os.close(os.open(f"/dev/shm/shmlab_{os.getpid()}_x_0", os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600))
"""
LAUNCH = """
import subprocess, sys
maker = subprocess.Popen([sys.executable, "-c", *sys.argv[1:]])
print(maker.pid, flush=True)
maker.wait(120)  # reaped at once, as a test run reaps its children: no zombie stays behind
"""  # another run: the maker is not in the watched run's process family, nor is its parent

OTHER_RUNS_TESTS = """
import os, time

def test_while_another_run_makes_files():
    theirs = os.environ["THEIR_FILES"].split(",")
    open("go", "w").close()  # now the other programs make their files, and exit
    deadline = time.monotonic() + 60
    while not all(map(os.path.exists, theirs)) and time.monotonic() < deadline:
        time.sleep(0.01)
    pids = [int(os.path.basename(f).split("_")[1]) for f in theirs]
    while any(os.path.exists(f"/proc/{pid}") for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.01)  # their creators are dead and reaped: the case that used to be blamed
    assert all(map(os.path.exists, theirs))
"""


def _file_maker(env: dict, go: Path) -> tuple[subprocess.Popen, str]:
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCH, MAKE_FILE, str(go)], env=env,
                                stdout=subprocess.PIPE, text=True)
    return launcher, f"/dev/shm/shmlab_{int(launcher.stdout.readline())}_x_0"


@pytest.mark.timeout(120)
def test_leakcheck_leaves_files_of_other_runs_alone(pytester, monkeypatch):
    """A run's test is watched while two programs outside its process family make a
    /dev/shm/shmlab_<pid>_x_0 file each and exit: one with no run marker at all (env
    stripped), one with another run's marker. Neither counts as the test's leak (though its
    creator is dead), so neither is unlinked under its owner."""
    from support import leakcheck

    go = pytester.path / "go"
    stripped = {k: v for k, v in os.environ.items() if k != leakcheck.RUN_ENV}
    makers = [_file_maker(stripped, go),
              _file_maker(dict(os.environ, **{leakcheck.RUN_ENV: "another-run"}), go)]
    names = [name for _, name in makers]
    try:
        pytester.makepyfile(test_other_runs=OTHER_RUNS_TESTS)
        monkeypatch.setenv("PYTHONPATH", str(TESTS), prepend=os.pathsep)
        monkeypatch.setenv("SHMLAB_LEAKCHECK_GRACE", "0.5")
        monkeypatch.setenv(leakcheck.RUN_ENV, "the-watched-run")  # a run of its own
        monkeypatch.setenv("THEIR_FILES", ",".join(names))
        result = pytester.runpytest_subprocess("-p", "support.leakcheck", "-p",
                                               "no:cacheprovider", "-v")
        still_there = [os.path.exists(name) for name in names]
    finally:
        go.touch()  # if the run failed before its go-ahead: let the makers finish
        for launcher, name in makers:
            launcher.communicate(timeout=60)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(name)  # ours to remove: this (outer) test started their makers
    result.assert_outcomes(passed=1)
    result.stdout.no_fnmatch_line("*left these behind*")
    assert still_there == [True, True], "the checker unlinked another run's file"


EXITED_CHILD_TESTS = """
import os, subprocess, sys

MAKE = ("import os; "
        "os.close(os.open(f'/dev/shm/shmlab_{os.getpid()}_c_0', os.O_CREAT | os.O_RDWR, 0o600))")

def make():
    exec(MAKE)

def test_leaks_from_an_exited_child_without_the_marker():
    subprocess.run([sys.executable, "-c", MAKE], env={}, check=True, timeout=60)

def test_leaks_from_an_exited_fork_child():
    pid = os.fork()
    if pid == 0:  # makes its file and is gone within microseconds: no poll could see it
        try:
            make()
        finally:
            os._exit(0)
    assert os.waitpid(pid, 0)[1] == 0  # reaped at once
"""


@pytest.mark.timeout(120)
def test_leakcheck_catches_a_file_left_by_a_child_that_has_exited(pytester, monkeypatch):
    """The creator is gone, and reaped, before the test ends: one child ran without the run's
    marker (env={}), one was forked and exited microseconds after making its file (its
    /proc/<pid>/environ never names the marker; it announced itself through the watcher's
    fork pipe). The watcher knew both as the test's family, so both files are its leak."""
    pytester.makepyfile(test_exited=EXITED_CHILD_TESTS)
    monkeypatch.setenv("PYTHONPATH", str(TESTS), prepend=os.pathsep)
    monkeypatch.setenv("SHMLAB_LEAKCHECK_GRACE", "0.5")
    before = {n for n in os.listdir("/dev/shm") if n.endswith("_c_0")}
    result = pytester.runpytest_subprocess("-p", "support.leakcheck", "-p", "no:cacheprovider",
                                           "-v")
    left = {n for n in os.listdir("/dev/shm") if n.endswith("_c_0")} - before
    for name in left:  # only if the checker failed to remove them
        os.unlink(f"/dev/shm/{name}")
    result.assert_outcomes(passed=2, errors=2)
    result.stdout.fnmatch_lines(["*ERROR at teardown of test_leaks_from_an_exited_child_w*",
                                 "*/dev/shm/shmlab_*_c_0*",
                                 "*ERROR at teardown of test_leaks_from_an_exited_fork_child*",
                                 "*/dev/shm/shmlab_*_c_0*"])
    assert not left, "the checker should have unlinked the leaked files"


@pytest.mark.timeout(60)
def test_leakcheck_opens_no_fd_and_runs_no_thread_in_the_test_process():
    """While this test runs (the leak checker watching it), this process's fds stay as they
    are: its fds, counted back to back for 1 s (tens of thousands of counts, nothing else
    running), never change, and no thread of the checker exists: a watcher thread here,
    listing /proc and /dev/shm with a directory fd open, would show in such counts, as it
    would in the fd-counting tests (Note [Whose /dev/shm file is it?] in
    support/leakcheck.py)."""
    counts = collections.Counter()
    deadline = time.monotonic() + 1
    while time.monotonic() < deadline:
        counts[len(os.listdir("/proc/self/fd"))] += 1
    theirs = [t.name for t in threading.enumerate() if t.name.startswith("leakcheck")]
    assert (len(counts), theirs) == (1, []), (counts, theirs)


REPORT_TESTS = """
import json, os, threading, psutil

def _is_watcher(p):
    try:
        cmd = p.cmdline()
    except psutil.Error:
        return False
    return len(cmd) > 4 and cmd[1].endswith("leakwatch.py") and cmd[4] == str(os.getpid())

def test_report():
    me = psutil.Process()
    watchers = [p.pid for p in psutil.process_iter() if _is_watcher(p)]
    children = [c.pid for c in me.children(recursive=True)]
    print("REPORT", json.dumps({"threads": threading.active_count(), "watchers": watchers,
                                "children": children}))
"""


@pytest.mark.timeout(120)
def test_leakcheck_watches_from_a_process_of_its_own(pytester, monkeypatch):
    """A run with the checker has the same threads and children as one without it, and one
    leakwatch process watching it, which is nobody's child; a run without it (plugin disabled)
    starts no watcher; the watcher is gone once its pytest has exited."""
    pytester.makepyfile(test_report=REPORT_TESTS)
    monkeypatch.setenv("PYTHONPATH", str(TESTS), prepend=os.pathsep)
    reports = {}
    for plugin in ("support.leakcheck", "no:support.leakcheck"):
        result = pytester.runpytest_subprocess("-p", plugin, "-p", "no:cacheprovider", "-s")
        result.assert_outcomes(passed=1)
        line = next(x for x in result.stdout.lines if "REPORT {" in x)
        reports[plugin] = json.loads(line.split("REPORT ", 1)[1])
    watched, bare = reports["support.leakcheck"], reports["no:support.leakcheck"]
    assert watched["threads"] == bare["threads"], reports
    assert watched["children"] == bare["children"] == [], reports
    assert len(watched["watchers"]) == 1 and bare["watchers"] == [], reports
    pid = watched["watchers"][0]
    deadline = time.monotonic() + 10  # not our child: it exits on its own, soon after EOF
    while psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline, "the watcher outlived its pytest"
        time.sleep(0.05)


# Under pytest-xdist each worker is a run of its own (Note [One run per xdist worker] in
# support/leakcheck.py): two tests on two workers at once, one leaking a /dev/shm file, a child
# and an orphaned manager while the other is watched through it; only the leaker is blamed.
XDIST_TESTS = """
import os, subprocess, sys, time
import pytest

def wait_for(path):
    deadline = time.monotonic() + 60
    while not os.path.exists(path):
        assert time.monotonic() < deadline, f"never saw {path}: not run side by side?"
        time.sleep(0.01)

@pytest.mark.xdist_group("leaker")
def test_leaker():
    wait_for("clean_started")
    name = f"/dev/shm/shmlab_{os.getpid()}_w_0"
    os.close(os.open(name, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600))
    child = subprocess.Popen(["sleep", "60"])
    out = subprocess.run([sys.executable, "-c", os.environ["ORPHAN"]], capture_output=True,
                         text=True, timeout=60, check=True).stdout.split()
    with open("leaked", "w") as f:
        f.write(f"{name} {child.pid} {out[0]} {os.environ['SHMLAB_LEAKCHECK_RUN']} {out[1]}")
    wait_for("clean_checked")  # the other worker's teardown has judged its test meanwhile

@pytest.mark.xdist_group("clean")
def test_clean():
    open("clean_started", "w").close()
    wait_for("leaked")  # ends while the other test's leaks are all there
"""
XDIST_CONFTEST = """
def pytest_runtest_logreport(report):
    if report.when == "teardown" and report.nodeid.endswith("test_clean"):
        open("clean_checked", "w").close()  # after the leak checker's teardown judged it
"""


@pytest.mark.timeout(180)
def test_leakcheck_blames_each_xdist_worker_for_its_own_leaks_only(pytester, monkeypatch):
    """Without a marker of its own per worker, the clean test's worker counted the orphaned
    manager (it carried the run's one marker) and the file (its creator's environment named
    that marker too) as its own leaks, and killed and unlinked them under the other test."""
    pytester.makepyfile(test_xdist=XDIST_TESTS)
    pytester.makeconftest(XDIST_CONFTEST)
    monkeypatch.setenv("PYTHONPATH", str(TESTS), prepend=os.pathsep)
    monkeypatch.setenv("SHMLAB_LEAKCHECK_GRACE", "0.5")
    monkeypatch.setenv("ORPHAN", ORPHAN)
    result = pytester.runpytest_subprocess("-p", "support.leakcheck", "-p", "no:cacheprovider",
                                           "-n", "2", "--dist", "loadgroup", "-v")
    leaked = (pytester.path / "leaked").read_text().split()
    name, child, manager, marker = leaked[0], int(leaked[1]), int(leaked[2]), leaked[3]
    manager_dir = os.path.dirname(leaked[4])  # the checker SIGKILLs it: it cannot remove it
    try:
        result.assert_outcomes(passed=2, errors=1)
        result.stdout.fnmatch_lines(["*ERROR at teardown of test_leaker*",
                                     f"*{name}*", "*'sleep 60'*", "*shmlab.manager*"])
        result.stdout.no_fnmatch_line("*ERROR at teardown of test_clean*")
        assert marker.endswith(("-gw0", "-gw1")), marker
        assert not os.path.exists(name), "the leaker's checker should have unlinked its file"
        for pid in (child, manager):
            assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == \
                psutil.STATUS_ZOMBIE, f"the leaker's checker should have killed {pid}"
    finally:
        for pid in (child, manager):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name)
        shutil.rmtree(manager_dir, ignore_errors=True)


GROUPED_TESTS = """
import os, pytest

CASES = [pytest.param(n, g, id=f"{g}-{n}", marks=pytest.mark.xdist_group(f"g{g}"))
         for g in range(3) for n in range(4)]

@pytest.mark.parametrize("n, g", CASES)
def test_grouped(n, g):
    print("RAN", g, os.environ["PYTEST_XDIST_WORKER"])

@pytest.mark.parametrize("n", range(6))
def test_free(n):
    pass
"""


@pytest.mark.timeout(120)
def test_xdist_group_keeps_each_group_on_one_worker(pytester, monkeypatch):
    """Note [xdist groups under pytest 9] in support/xdistgroups.py: three groups of four
    parametrized cases on three workers, each group on one worker, ids as they are. Without
    the plugin the groups were spread over all three workers."""
    pytester.makepyfile(test_grouped=GROUPED_TESTS)
    monkeypatch.setenv("PYTHONPATH", str(TESTS), prepend=os.pathsep)
    result = pytester.runpytest_subprocess("-p", "support.xdistgroups", "-p", "no:cacheprovider",
                                           "-n", "3", "--dist", "loadgroup", "-rA")
    result.assert_outcomes(passed=18)
    workers = collections.defaultdict(set)
    for line in result.stdout.lines:
        if line.startswith("RAN "):
            _, group, worker = line.split()
            workers[group].add(worker)
    assert sorted(workers) == ["0", "1", "2"], result.stdout.str()
    assert all(len(w) == 1 for w in workers.values()), dict(workers)
    result.stdout.fnmatch_lines(["PASSED test_grouped.py::test_grouped[0-0]"])  # no @g0 suffix



def test_the_cost_summary_says_when_each_worker_ended():
    """support/cost.py: the worker that ended last, and by how much, in seconds from the first
    test of the run; a worker that recorded no span is left out."""
    from support.cost import worker_lines

    spans = {"gw0": {"start": 1000.0, "end": 1700.0}, "gw1": {"start": 1001.0, "end": 1760.0}}
    lines = worker_lines(spans, {"gw0": 690.0, "gw1": 755.5})
    assert lines == [
        "   gw0: tests from      0 s to    700 s (ends   60 s before the last), busy    690 s",
        "   gw1: tests from      1 s to    760 s (ends    0 s before the last), busy    756 s"]
    assert worker_lines({}, {}) == []

# --- (b) a notebook carrying outputs is detected ---------------------------------------------


def _notebook(with_outputs: bool) -> nbformat.NotebookNode:
    hidden = nbutil.code_cell(
        "# claim C0.0\nassert 1 + 1 == 2",
        jupyter={"source_hidden": True},
        tags=["hidden-test"],
    )
    nb = nbutil.new_notebook(nbutil.code_cell("print('hello')"), hidden)
    if with_outputs:
        nb.cells[0].execution_count = 1
        nb.cells[0].outputs = [nbformat.v4.new_output("stream", name="stdout", text="hello\n")]
    return nb


def test_a_notebook_with_outputs_is_detected(tmp_path):
    path = tmp_path / "with_outputs.ipynb"
    nbformat.write(_notebook(with_outputs=True), str(path))
    problems = nbutil.output_problems(nbutil.read_notebook(path))
    assert any("1 output(s)" in p for p in problems), problems
    assert any("execution_count 1" in p for p in problems), problems


def test_a_clean_notebook_with_hidden_test_cells_passes(tmp_path):
    """Our own metadata (source_hidden, tags, cell ids) is not mistaken for output."""
    path = tmp_path / "clean.ipynb"
    nbformat.write(_notebook(with_outputs=False), str(path))
    assert not nbutil.notebook_has_outputs(nbutil.read_notebook(path))


def test_nbstripout_verify_flags_outputs_but_not_our_metadata(tmp_path):
    dirty, clean = tmp_path / "with_outputs.ipynb", tmp_path / "clean.ipynb"
    nbformat.write(_notebook(with_outputs=True), str(dirty))
    nbformat.write(_notebook(with_outputs=False), str(clean))
    result = nbutil.nbstripout_verify([dirty, clean])  # one call: nbformat imports slowly
    assert result.returncode != 0, "nbstripout --verify should flag a notebook with outputs"
    assert "with_outputs.ipynb" in result.stdout
    assert "clean.ipynb" not in result.stdout, result.stdout + result.stderr


def test_saved_widget_state_counts_as_output(tmp_path):
    nb = _notebook(with_outputs=False)
    nb.metadata["widgets"] = {"application/vnd.jupyter.widget-state+json": {"state": {}}}
    assert nbutil.notebook_has_outputs(nb)


@pytest.mark.notebook
@pytest.mark.timeout(120)
def test_a_headless_run_records_its_time_and_marks_an_overrun(tmp_path, monkeypatch):
    """Going over the budget is recorded and shown, never a failure; other records stay."""
    times = tmp_path / "notebook-times.json"
    times.write_text(json.dumps({"notebooks": {"notebooks/earlier.ipynb": {"seconds": 1.0}}}))
    monkeypatch.setattr(nbutil, "TIMES_FILE", times)
    monkeypatch.setattr(nbutil, "TIMES", {})
    monkeypatch.setattr(nbutil, "BUDGET_S", 0)  # any run is over this budget
    path = tmp_path / "slow.ipynb"
    cells = [nbutil.code_cell("x = 1"), nbutil.code_cell("import time; time.sleep(0.5)")]
    nbformat.write(nbutil.new_notebook(*cells), str(path))
    nbutil.execute_notebook(path, timed=True)
    saved = json.loads(times.read_text())["notebooks"]
    assert "notebooks/earlier.ipynb" in saved, saved  # merged, not overwritten
    r = saved[nbutil.rel(path)]
    assert r == nbutil.TIMES[nbutil.rel(path)] and r["passed"] and r["over"], r
    assert r["budget_s"] == 0 and r["seconds"] >= 0.5 and r["cpu_seconds"] > 0, r
    slowest = r["slowest_cells"][0]
    assert slowest["index"] == 1 and 0.5 <= slowest["seconds"] < r["seconds"], r
    table = nbutil.times_table({nbutil.rel(path): r})  # (a worker's TIMES may hold others)
    assert "OVER BUDGET" in table[1] and "slow" in table[1], table
    assert "1 of 1 over" in table[2], table  # (under xdist a line on the workers follows)


# --- (c) `make lab` serves JupyterLab at the root, on notebooks/00 ------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str, timeout: float = 2.0):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.status, json.loads(r.read() or b"null")


def _group_members(pgid: int) -> list[int]:
    alive = []
    for proc in psutil.process_iter():
        try:
            if os.getpgid(proc.pid) == pgid and proc.status() != psutil.STATUS_ZOMBIE:
                alive.append(proc.pid)
        except (ProcessLookupError, psutil.NoSuchProcess):
            continue
    return alive


def _stop_group(proc: subprocess.Popen) -> None:
    """SIGTERM the whole process group (make and jupyter), then SIGKILL what is left."""
    for sig, wait_s in ((signal.SIGTERM, 15), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            proc.poll()
            if proc.returncode is not None and not _group_members(proc.pid):
                return
            time.sleep(0.2)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_make_lab_serves_jupyterlab_at_the_root_on_notebook_00(tmp_path):
    port, token = _free_port(), secrets.token_hex(16)
    lab_args = [
        "--no-browser",
        f"--port={port}",
        "--ServerApp.port_retries=0",
        f"--IdentityProvider.token={token}",
        "--ServerApp.open_browser=False",
    ]
    # (as root, the Makefile adds --allow-root itself)
    env = dict(os.environ)
    # Keep the learner's own Jupyter config and runtime files out of the test.
    env.update(
        JUPYTER_CONFIG_DIR=str(tmp_path / "config"), JUPYTER_RUNTIME_DIR=str(tmp_path / "rt")
    )
    log_path = tmp_path / "lab.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            ["make", "--no-print-directory", "lab", "LAB_ARGS=" + " ".join(lab_args)],
            cwd=nbutil.REPO,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group, so nothing it starts can escape
        )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        status = None
        while time.monotonic() < deadline and status != 200:
            assert proc.poll() is None, f"`make lab` exited early:\n{log_path.read_text()}"
            try:
                status, _ = _get(f"{base}/api/status?token={token}")
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                time.sleep(0.5)
        assert status == 200, f"/api/status never answered 200:\n{log_path.read_text()}"

        _, listing = _get(f"{base}/api/contents?token={token}&content=1")
        names = {item["name"] for item in listing["content"]}
        assert {"labs", "notebooks"} <= names, f"the lab is not rooted at the repository: {names}"
        _, listing = _get(f"{base}/api/contents/notebooks?token={token}&content=1")
        assert "00_start_here.ipynb" in {item["name"] for item in listing["content"]}
        # It opens on notebook 00: the URL printed names it.
        assert f":{port}/lab/tree/notebooks/00_start_here.ipynb" in log_path.read_text(), \
            log_path.read_text()
        # The README promises the URL is printed.
        assert f":{port}/lab" in log_path.read_text(), log_path.read_text()
        with pytest.raises(urllib.error.HTTPError) as denied:
            _get(f"{base}/api/contents?token=wrong")
        assert denied.value.code == 403
    finally:
        _stop_group(proc)
    assert not _group_members(proc.pid), "`make lab` left processes behind"
