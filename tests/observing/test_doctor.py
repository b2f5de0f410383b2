"""python -m shmlab doctor against problems planted on purpose: real processes, real files.

Segments are planted in a private folder on the /dev/shm tmpfs (``--shm-dir``), so neither
the doctor's --clean nor other test runs going on at the same time ever see each other's
files. Other engineers' processes (managers, orphans) may be on the machine too: every
assertion looks only at the items this test planted, found by name or pid.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import textwrap

import jsonschema
import psutil
import pytest
from support.waiting import wait_for

from shmlab import __main__ as shmlab_main
from shmlab import introspect
from shmlab.introspect import checks, doctor, leaks
from shmlab.tools import doctor as doctor_cli

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [REPO, os.environ.get(
    "PYTHONPATH")]))}
NOBODY = 65534
SIZE = 4096 + 64  # a file_system segment: 64-byte header, then the data


@pytest.fixture
def shm_folder():
    folder = tempfile.mkdtemp(prefix="doctor-test-", dir=introspect.SHM_DIR)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def dead_pid() -> int:
    """The pid of a process that has exited (and been reaped) just now."""
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def plant(folder: str, name: str, refcount: int = 1) -> str:
    """A file_system-shaped segment: an int32 refcount header, then zeros."""
    path = os.path.join(folder, name)
    with open(path, "wb") as f:
        f.write(struct.pack("<i", refcount) + bytes(SIZE - 4))
    return path


def run_doctor(*args, preexec_fn=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "shmlab", "doctor", *args], env=ENV,
                          capture_output=True, text=True, timeout=120, preexec_fn=preexec_fn,
                          stdin=subprocess.DEVNULL)


def by_name(findings, name):
    """The segment finding about ``name`` (details are dicts in JSON, Finding objects here)."""
    for f in findings:
        details = f["details"] if isinstance(f, dict) else f.details
        check = f["check"] if isinstance(f, dict) else f.check
        if check == "segment" and details.get("name") == name:
            return f
    raise AssertionError(f"no finding about {name}")


def schema():
    return json.loads(doctor.SCHEMA_PATH.read_text())


@pytest.fixture
def mapper():
    """A live process that maps a file and closes its fd (as file_system receivers do)."""
    procs = []

    def start(path):
        code = ("import mmap, os, sys; fd = os.open(sys.argv[1], os.O_RDWR); "
                "m = mmap.mmap(fd, 0); os.close(fd); print('ready', flush=True); sys.stdin.read()")
        proc = subprocess.Popen([sys.executable, "-c", code, path], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True)
        procs.append(proc)
        assert proc.stdout.readline().strip() == "ready"
        return proc.pid

    yield start
    for proc in procs:
        proc.stdin.close()  # end of input: it exits and unmaps
        proc.wait(30)
        proc.stdout.close()


def orphan(code: str) -> int:
    """Run ``code`` in a grandchild whose parent (the starter) exits at once; its pid.

    ``code`` prints one line when it is ready; the starter waits for it, then exits, so the
    grandchild is re-parented to init (or a subreaper), as after a crash of its parent.
    """
    starter = textwrap.dedent("""
        import subprocess, sys
        p = subprocess.Popen([sys.executable, *sys.argv[1:]], stdin=subprocess.DEVNULL,
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        line = p.stdout.readline()
        print(p.pid, line.decode().strip(), flush=True)
    """)
    out = subprocess.run([sys.executable, "-c", starter, *code], env=ENV, capture_output=True,
                         text=True, timeout=60, check=True).stdout.split()
    return int(out[0])


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def stop(pid: int, sig=signal.SIGKILL) -> None:
    """Signal a process that is not our child, and wait until init has reaped it."""
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        return
    wait_for(lambda: gone(pid), timeout=30, what=f"pid {pid} to exit")


# --- leaked segments and --clean ----------------------------------------------------------------
@pytest.mark.timeout(180)
def test_clean_removes_only_the_dead_pids_unused_segment_of_ours(shm_folder, mapper):
    dead = dead_pid()
    leaked = plant(shm_folder, f"torch_{dead}_1_0")
    mapped = plant(shm_folder, f"torch_{dead}_2_1")
    foreign = plant(shm_folder, f"shmlab_{dead}_3_2", refcount=2)
    os.chown(foreign, NOBODY, NOBODY)  # another user's leak: never ours to remove
    user = mapper(mapped)

    findings = leaks.segments(shm_folder, min_age_s=0)
    f = by_name(findings, os.path.basename(leaked))
    assert (f.severity, f.details["cleanable"], f.details["creator_alive"]) == ("warn", True, False)
    assert f.details["refcount"] == 1 and f.details["size"] == SIZE and f.details["used_by"] == []
    f = by_name(findings, os.path.basename(mapped))
    assert (f.severity, f.details["cleanable"], f.details["used_by"]) == ("info", False, [user])
    f = by_name(findings, os.path.basename(foreign))
    assert (f.severity, f.details["cleanable"], f.details["uid"]) == ("warn", False, NOBODY)
    assert f.details["refcount"] == 2 and foreign in f.fix

    out = run_doctor("--clean", "--yes", "--json", "--shm-dir", shm_folder, "--min-age", "0")
    result = json.loads(out.stdout)
    jsonschema.validate(result, schema())
    assert result["cleaned"]["removed"] == [os.path.basename(leaked)], out.stderr
    assert result["cleaned"]["bytes_freed"] == SIZE
    assert f"freed {SIZE:,} bytes" in out.stderr and leaked in out.stderr  # the list, shown
    assert not os.path.exists(leaked)
    assert os.path.exists(mapped) and os.path.exists(foreign)  # in use / another user's


@pytest.mark.timeout(60)
def test_a_young_segment_and_a_live_creators_are_left_alone(shm_folder):
    young = plant(shm_folder, f"torch_{dead_pid()}_1_0")
    mine = plant(shm_folder, f"shmlab_{os.getpid()}_1_0")
    findings = leaks.segments(shm_folder)  # default --min-age: 5 s
    f = by_name(findings, os.path.basename(young))
    assert (f.severity, f.details["cleanable"]) == ("info", False)
    with pytest.raises(AssertionError):
        by_name(findings, os.path.basename(mine))  # our pid is alive: in use, no finding
    assert doctor.clean(doctor.cleanable(findings)) == {"removed": [], "skipped": [],
                                                        "bytes_freed": 0}
    assert os.path.exists(young) and os.path.exists(mine)


@pytest.mark.timeout(60)
def test_clean_checks_again_and_skips_a_segment_mapped_since(shm_folder, mapper):
    leaked = plant(shm_folder, f"torch_{dead_pid()}_1_0")
    items = doctor.cleanable(leaks.segments(shm_folder, min_age_s=0))
    assert [i["path"] for i in items] == [leaked]
    pid = mapper(leaked)  # someone attaches between the report and the clean
    assert doctor.clean(items) == {"removed": [], "bytes_freed": 0, "skipped": [
        {"name": os.path.basename(leaked), "reason": f"now used by pid(s) [{pid}]"}]}


@pytest.mark.timeout(60)
def test_clean_without_yes_asks_and_removes_nothing_without_a_terminal(shm_folder, capsys):
    leaked = plant(shm_folder, f"torch_{dead_pid()}_1_0")
    doctor_cli.show_list(doctor.cleanable(leaks.segments(shm_folder, min_age_s=0)), sys.stdout)
    assert not doctor_cli._confirm(sys.stdout)  # pytest's stdin is no terminal: the answer is no
    out = capsys.readouterr().out
    assert leaked in out and "add --yes" in out and os.path.exists(leaked)


# --- the fd limit ---------------------------------------------------------------------------------
def _low_limit():
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, 4096))


@pytest.mark.timeout(180)
def test_a_low_fd_limit_is_flagged_with_the_line_that_fixes_it(shm_folder):
    out = run_doctor("--json", "--shm-dir", shm_folder, preexec_fn=_low_limit)
    result = json.loads(out.stdout)
    jsonschema.validate(result, schema())
    (f,) = [f for f in result["findings"] if f["check"] == "fd_limit"]
    assert f["severity"] == "warn" and f["fix"] == "ulimit -n 4096", f
    assert (f["details"]["soft"], f["details"]["hard"]) == (256, 4096)
    assert out.returncode == 1 and result["exit_status"] == 1


def test_a_hard_limit_only_root_can_raise_says_so():
    (f,) = checks.fd_limit(introspect.Limits(1024, 1024, 0, 0))
    assert f.severity == "warn" and "only root" in f.message and "file_system" in f.fix
    (f,) = checks.fd_limit(introspect.Limits(1024, resource.RLIM_INFINITY, 0, 0))
    assert f.fix == f"ulimit -n {checks._nr_open()}"  # 'unlimited' is refused for nofile
    assert checks.fd_limit(introspect.Limits(65536, 65536, 0, 0))[0].severity == "ok"


# --- orphans: a manager and a deleted fd ----------------------------------------------------------
@pytest.mark.timeout(120)
def test_an_orphaned_manager_with_no_clients_is_found():
    pid = orphan(["-m", "shmlab.manager", "--grace", "120"])  # its starter has exited
    try:
        wait_for(lambda: introspect.orphaned(pid, introspect.process_table()), timeout=10)
        (f,) = [f for f in leaks.managers() if f.details["pid"] == pid]
        assert f.severity == "warn" and f.details["kind"] == "shmlab", f
        assert f.details["parent_gone"] and f.details["clients"] == 0
        assert f.fix.startswith(f"kill -INT {pid}")
    finally:
        stop(pid, signal.SIGINT)  # the daemon reclaims, removes its folder and exits


@pytest.mark.timeout(120)
def test_a_deleted_shm_fd_held_by_an_orphan_is_found():
    holder = ("import time; from shmlab._shm import create_unlinked; "
              "fd, mapping = create_unlinked(8192); print('ready', flush=True); time.sleep(90)")
    pid = orphan(["-c", holder])
    try:
        wait_for(lambda: introspect.orphaned(pid, introspect.process_table()), timeout=10)
        (f,) = [f for f in leaks.fd_leaks() if f.details["pid"] == pid]
        assert f.severity == "warn" and f.details["fds"] == 1 and f.details["bytes"] == 8192
        assert f.fix.startswith(f"kill {pid}")
    finally:
        stop(pid)


# --- the report, the schema and the command table -------------------------------------------------
def test_the_schema_accepts_a_report_and_rejects_a_warning_without_a_fix(shm_folder):
    findings = [checks.Finding("fd_limit", "warn", "low", "ulimit -n 4096"),
                checks.Finding("versions", "ok", "fine")]
    good = doctor.report(findings, shm_folder)
    jsonschema.validate(good, schema())
    assert good["exit_status"] == 1 and good["counts"] == {"ok": 1, "info": 0, "warn": 1,
                                                           "error": 0}
    good["findings"][0]["fix"] = None
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(good, schema())
    with pytest.raises(ValueError, match="severity"):
        checks.Finding("versions", "bad", "x")


def test_the_text_report_is_one_line_per_finding_with_severity_and_fix():
    text = doctor.render([checks.Finding("fd_limit", "warn", "low", "ulimit -n 4096"),
                          checks.Finding("versions", "ok", "fine")])
    lines = text.splitlines()
    assert lines[0].endswith("warn  fd_limit: low  ->  fix: ulimit -n 4096")
    assert "ok    versions: fine" in lines[1] and lines[2] == "1 finding(s) need action."


def test_python_m_shmlab_dispatches_through_its_command_table(capsys):
    assert shmlab_main.main([]) == 2 and "doctor" in capsys.readouterr().out
    assert shmlab_main.main(["nope"]) == 2 and "unknown command 'nope'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        shmlab_main.main(["doctor", "--yes"])  # --yes without --clean: argparse says why
    assert "--yes only makes sense with --clean" in capsys.readouterr().err


@pytest.mark.timeout(120)
@pytest.mark.parametrize("command", ["doctor", "drill", "bench", "stress", "labs", "manager",
                                     "facts", "trace"])
def test_every_command_s_help_names_the_one_command_line(command):
    """One command line: each command's usage reads ``python -m shmlab <command>``, also where
    the module runs under its own name (the manager is exec'd as ``python -m shmlab.manager``)."""
    assert command in shmlab_main.COMMANDS
    out = subprocess.run([sys.executable, "-m", "shmlab", command, "--help"], env=ENV,
                         capture_output=True, text=True, timeout=90, stdin=subprocess.DEVNULL)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(f"usage: python -m shmlab {command} "), out.stdout[:200]


def test_the_command_table_is_the_eight_commands():
    assert set(shmlab_main.COMMANDS) == {"doctor", "drill", "bench", "stress", "labs", "manager",
                                         "facts", "trace"}


def test_a_tiny_dev_shm_in_a_container_gets_the_container_fixes(monkeypatch):
    class Vfs:  # Docker's default: 64 MiB
        f_blocks, f_frsize, f_bavail, f_files, f_favail = 16384, 4096, 16000, 1000, 990

    monkeypatch.setattr(checks.os, "statvfs", lambda p: Vfs)
    monkeypatch.setattr(checks, "container", lambda: "docker")
    (f,) = checks.dev_shm()
    assert f.severity == "warn" and "Docker's default" in f.message
    for fix in ("--shm-size", "--ipc=host", "emptyDir", "medium: Memory"):
        assert fix in f.fix


# --- the widget (notebook 00) -------------------------------------------------------------------
@pytest.mark.timeout(60)
def test_the_widget_shows_the_report_and_cleans_only_after_confirmation(shm_folder):
    from shmlab.widgets import DoctorReport

    leaked = plant(shm_folder, f"torch_{dead_pid()}_1_0")
    report = DoctorReport(shm_dir=shm_folder, min_age_s=0)
    assert os.path.basename(leaked) in report.table.value and "need action" in report.summary.value
    report.clean_button.click()  # asks: lists the file, removes nothing yet
    assert report.confirm_box.layout.display is None and leaked in report.question.value
    assert os.path.exists(leaked)
    report.confirm_button.click()
    assert report.cleaned == {"removed": [os.path.basename(leaked)], "skipped": [],
                              "bytes_freed": SIZE}
    assert not os.path.exists(leaked) and report.confirm_box.layout.display == "none"
    assert repr(report) == doctor.render(report.findings)
