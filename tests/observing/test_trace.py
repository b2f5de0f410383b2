"""shmlab.trace: one tensor's handoff, traced, has the hops the handout describes, in order.

Each traced handoff runs in a process of its own (tests/observing/trace_scene.py), torch's and
shmlab's side by side, under real strace; a test process never becomes a manager's client.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time

import pytest
from support.nbutil import REPO

from shmlab.trace import StraceUnavailable, Trace, TraceError, trace
from shmlab.trace import strace as strace_mod
from shmlab.trace.model import Event, ProcessInfo

SCENE = os.path.join(os.path.dirname(__file__), "trace_scene.py")
LIBS = ("torch", "shmlab")
needs_strace = pytest.mark.skipif(shutil.which("strace") is None, reason="strace not installed")


def run_scenes(tmp_path, scenes, env=None, timeout=120) -> dict:
    """{scene: Trace} for each (lib, strategy, method, syscalls), two at a time."""
    env = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    out, procs = {}, {}
    for scene in scenes:
        path = tmp_path / ("-".join(map(str, scene)) + ".json")
        procs[scene] = (path, subprocess.Popen(
            [sys.executable, SCENE, *map(str, scene), str(path)], env=env,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
        if len(procs) % 2 == 0:
            _wait(procs, out, timeout)
    _wait(procs, out, timeout)
    return out


def _wait(procs, out, timeout):
    for scene, (path, proc) in list(procs.items()):
        try:
            text, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            text, _ = proc.communicate()
        assert proc.returncode == 0, f"{scene} failed:\n{text[-3000:]}"
        out[scene] = Trace.from_json(path.read_text())
        del procs[scene]


def sides(tr: Trace):
    """(sender pid, receiver pid, the tensor's segment)."""
    main, child = tr.overhead["main_pid"], tr.overhead["child_pid"]
    seg = next(e.segment for e in tr.events if e.name == "reduce_storage")
    assert seg and tr.processes[main].label == "main", tr.processes
    return main, child, seg


def in_order(expected: list[str], actual: list[str]) -> bool:
    """``expected`` is a subsequence of ``actual``."""
    it = iter(actual)
    return all(step in it for step in expected)


def first(tr, pid, seg, name):
    return next(e for e in tr.events if e.pid == pid and e.segment == seg and e.name == name)


# --- file_descriptor --------------------------------------------------------------------------
@needs_strace
@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_file_descriptor_handoff_has_every_hop_in_order_for_both_libraries(tmp_path, method):
    traces = run_scenes(tmp_path, [(lib, "file_descriptor", method, "true") for lib in LIBS])
    seen = {}
    for (lib, *_), tr in traces.items():
        sender, receiver, seg = sides(tr)
        send, recv = tr.steps(sender, seg), tr.steps(receiver, seg)
        # create, unlink at once (before the fd leaves), the fd over SCM_RIGHTS, the map
        assert in_order(["create", "map", "unlink", "send fd"], send), (lib, send)
        assert in_order(["receive fd", "map"], recv), (lib, recv)
        created, unlinked = first(tr, sender, seg, "openat"), first(tr, sender, seg, "unlink")
        # "at once": no other process touches the segment between its creation and its
        # unlink (an order, not a time: strace's stops on a loaded machine stretch any time).
        # A Python call learns the segment from what it returns (the receiver's Queue.get
        # may start waiting before the segment exists), so it has it only at its end.
        between = [e for e in tr.events if e.segment == seg and e.pid != sender
                   and created.t < (e.end if e.layer == "python" else e.t) < unlinked.t]
        assert not between, ("unlinked at once, before anyone else has it", between)
        assert unlinked.t < first(tr, sender, seg, "sendmsg").t
        # the Python-level hops, in order, each side; the name ties the two sides together
        assert in_order(["Queue.put", "ForkingPickler.dumps", "reduce_tensor", "reduce_storage",
                         "_share_fd_cpu_", "DupFd"], tr.hops(sender, "python")), lib
        assert in_order(["ForkingPickler.loads", "rebuild_storage_fd", "DupFd.detach",
                         "recvfds", "_new_shared_fd_cpu", "rebuild_tensor"],
                        tr.hops(receiver, "python")), lib
        # the receiver's recvmsg blocks before the fd is sent: it ends after the send starts
        assert first(tr, receiver, seg, "recvmsg").end >= first(tr, sender, seg, "sendmsg").t
        assert "sendfds" in tr.hops(sender, "python", seg), "the resource_sharer's thread"
        seen[lib] = ([s for s in send if s in ("create", "unlink", "send fd")],
                     [s for s in recv if s in ("receive fd", "map")][:2])
        mermaid = tr.to_mermaid()
        assert f"participant P{sender} as main" in mermaid
        assert f"P{sender}->>P{receiver}: the fd over SCM_RIGHTS" in mermaid, mermaid
        assert f"P{sender}->>P{receiver}: pickle bytes via the queue pipe" in mermaid
    assert seen["torch"] == seen["shmlab"] == (["create", "unlink", "send fd"],
                                               ["receive fd", "map"]), seen


# --- file_system ------------------------------------------------------------------------------
@needs_strace
@pytest.mark.slow
@pytest.mark.timeout(240)
def test_file_system_handoff_has_every_hop_in_order_for_both_libraries(tmp_path):
    traces = run_scenes(tmp_path, [(lib, "file_system", "fork", "true") for lib in LIBS])
    seen = {}
    for (lib, *_), tr in traces.items():
        sender, receiver, seg = sides(tr)
        send, recv = tr.steps(sender, seg), tr.steps(receiver, seg)
        # create by name after the manager's register; the in-flight count; the receiver
        # opens by name, registers, maps and gives the in-flight count back
        assert in_order(["register", "create", "map", "refcount +1"], send), (lib, send)
        assert in_order(["register", "open", "map", "refcount -1"], recv), (lib, recv)
        assert first(tr, receiver, seg, "openat").t > first(tr, sender, seg, "openat").t
        # the last closer unlinks the name: after both have let go
        unlinks = [e for e in tr.events if e.segment == seg and e.name == "unlink"]
        assert len(unlinks) == 1, unlinks
        assert unlinks[0].t > first(tr, receiver, seg, "mmap").t
        managers = [p for p in tr.processes.values() if p.label == "manager"]
        assert managers, tr.processes
        mermaid = tr.to_mermaid()
        assert f"P{sender}->>P{managers[0].pid}:" in mermaid, mermaid
        assert f"participant P{managers[0].pid} as manager" in mermaid
        seen[lib] = ([s for s in send if s in ("register", "create")][:2],
                     [s for s in recv if s in ("register", "open")][:2])
        if lib == "shmlab":  # the count itself, read at each change
            counts = [e.detail for e in tr.events if e.segment == seg
                      and e.name in ("incref", "decref")]
            assert counts[0] == "refcount now 2" and counts[-1] == "refcount now 0", counts
            closer = unlinks[0].pid
            assert [e for e in tr.events if e.pid == closer and e.name == "decref"][-1].detail \
                == "refcount now 0"
        else:
            assert "_shared_incref" in tr.hops(sender, "python", seg)
            assert "_shared_decref" in tr.hops(receiver, "python", seg)
    assert seen["torch"] == seen["shmlab"] == (["register", "create"], ["register", "open"])


# --- errors -------------------------------------------------------------------------------------
def test_strace_missing_raises_when_asked_and_is_a_limit_otherwise(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # no strace on it
    with pytest.raises(StraceUnavailable, match="apt-get install strace"):
        with trace(syscalls=True):
            pass
    with trace() as tr:
        [].append(1)
    assert tr.limits[0].startswith("strace not attached: strace was not found"), tr.limits
    assert tr.overhead["strace"] is False


def _unshare_works() -> bool:
    return shutil.which("unshare") is not None and subprocess.run(
        ["unshare", "--user", "true"], capture_output=True).returncode == 0


needs_userns = pytest.mark.skipif(not (_unshare_works() and shutil.which("strace")),
                                  reason="needs strace and unshare --user")


@needs_userns
def test_refused_ptrace_names_the_fix(monkeypatch):
    # a user namespace of its own has no CAP_SYS_PTRACE over this process: EPERM, for real
    monkeypatch.setenv("SHMLAB_STRACE", "unshare --user strace")
    with pytest.raises(TraceError, match="SYS_PTRACE") as err:
        with trace(syscalls=True):
            pass
    assert "Operation not permitted" in str(err.value)
    with trace(syscalls="auto") as tr:
        pass
    assert "strace not attached" in tr.limits[0] and "ptrace" in tr.limits[0]


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_python_level_trace_works_without_strace(tmp_path):
    traces = run_scenes(tmp_path, [(lib, "file_descriptor", "fork", "auto") for lib in LIBS],
                        env={"SHMLAB_STRACE": str(tmp_path / "no-strace")})
    for (lib, *_), tr in traces.items():
        sender, receiver, seg = sides(tr)
        assert tr.overhead["syscall_events"] == 0 and "strace not attached" in tr.limits[0]
        assert in_order(["reduce_storage", "_share_fd_cpu_", "DupFd", "sendfds"],
                        tr.hops(sender, "python", seg)), lib
        assert in_order(["rebuild_storage_fd", "recvfds", "_new_shared_fd_cpu"],
                        tr.hops(receiver, "python", seg)), lib
        assert f"P{sender}->>P{receiver}: the fd over SCM_RIGHTS" in tr.to_mermaid()


@needs_userns
@pytest.mark.slow
@pytest.mark.timeout(120)
def test_python_level_trace_works_when_ptrace_is_refused(tmp_path):
    traces = run_scenes(tmp_path, [("shmlab", "file_system", "fork", "auto")],
                        env={"SHMLAB_STRACE": "unshare --user strace"})
    (tr,) = traces.values()
    sender, receiver, seg = sides(tr)
    assert "Operation not permitted" in tr.limits[0]
    assert in_order(["ManagerClient.register", "create_refcounted", "incref"],
                    tr.hops(sender, "python", seg))
    assert in_order(["rebuild_storage_filename", "attach_refcounted", "decref"],
                    tr.hops(receiver, "python", seg))


# --- the model, the pictures, the log reader ----------------------------------------------------
def test_bad_arguments_say_what_to_do():
    with pytest.raises(ValueError, match="'auto', True or False"):
        with trace(syscalls="yes"):
            pass
    with pytest.raises(ValueError, match="layer must be"):
        Trace().hops(layer="kernel")
    with pytest.raises(ValueError, match="not a trace"):
        Trace.from_json('{"events": [{"t": 1}], "processes": []}')


def _event(t, pid, name, layer="python", segment="/torch_1_2_0", detail="", lib="torch"):
    return Event(t=t, pid=pid, tid=pid, thread="MainThread", layer=layer, name=name, lib=lib,
                 detail=detail, segment=segment, fd=None, duration=0.001)


def test_json_round_trip_and_mermaid_lanes():
    tr = Trace(events=[_event(1.0, 10, "ForkingPickler.dumps", detail="300 bytes"),
                       _event(1.1, 10, "sendmsg", "syscall", detail="sendmsg(...) = 1 SCM_RIGHTS"),
                       _event(1.2, 11, "ForkingPickler.loads", detail="300 bytes"),
                       _event(1.3, 11, "recvmsg", "syscall", detail="recvmsg(...) = 1 SCM_RIGHTS"),
                       _event(1.4, 11, "mmap", "syscall"), _event(1.5, 11, "mmap", "syscall"),
                       _event(1.6, 11, "write", "syscall", detail="write(...) = 68 to the "
                              "manager: AllocInfo register pid 11 /torch_1_2_0")],
               processes={10: ProcessInfo(10, 1, "main"), 11: ProcessInfo(11, 10, "child 1"),
                          12: ProcessInfo(12, 10, "manager", ["torch_shm_manager"])},
               limits=["a limit"], overhead={"attach_s": 0.1})
    again = Trace.from_json(tr.to_json())
    assert again.events == tr.events and again.processes == tr.processes
    text = tr.to_mermaid()
    assert text.startswith("sequenceDiagram\n")
    assert "participant P12 as manager 12" in text
    assert "P10->>P11: pickle bytes via the queue pipe 300 bytes" in text
    assert "P10->>P11: the fd over SCM_RIGHTS torch_1_2_0" in text
    assert "Note over P11: mmap x2<br/>(torch_1_2_0)" in text  # repeats collapse
    assert "P11->>P12: AllocInfo register pid 11 /torch_1_2_0" in text
    assert tr.steps(11) == ["unpickle", "receive fd", "map", "map", "register"]
    assert len(tr.table().splitlines()) == 2 + len(tr.events)


def test_the_pickle_arrow_follows_the_reducers_that_dumps_called():
    """dumps() starts before the reduce_* calls it makes, but its bytes leave when it returns:
    the diagram must not show them sent before the tensor was moved to shared memory."""
    dumps = Event(t=1.0, pid=10, tid=10, thread="QueueFeederThread", layer="python",
                  name="ForkingPickler.dumps", lib="multiprocessing", detail="300 bytes",
                  segment=None, fd=None, duration=0.5)
    tr = Trace(events=[dumps, _event(1.1, 10, "reduce_tensor"), _event(1.2, 10, "reduce_storage"),
                       _event(1.6, 11, "ForkingPickler.loads", detail="300 bytes"),
                       _event(1.7, 11, "rebuild_storage_fd"), _event(1.8, 11, "rebuild_tensor")],
               processes={10: ProcessInfo(10, 1, "main"), 11: ProcessInfo(11, 10, "child 1")})
    lines = tr.to_mermaid().splitlines()
    reducers = next(i for i, line in enumerate(lines) if "reduce_tensor, reduce_storage" in line)
    arrow = next(i for i, line in enumerate(lines) if "P10->>P11: pickle bytes" in line)
    rebuild = next(i for i, line in enumerate(lines) if "rebuild_storage_fd" in line)
    assert reducers < arrow < rebuild, lines


def test_show_displays_the_diagram_as_a_mermaid_fence(monkeypatch):
    import IPython.display

    shown = []
    monkeypatch.setattr(IPython.display, "display", shown.append)
    Trace(events=[_event(1.0, 10, "reduce_storage")],
          processes={10: ProcessInfo(10, 1, "main")}, limits=["a limit"]).show()
    (markdown,) = shown
    assert markdown.data.startswith("```mermaid\nsequenceDiagram\n")
    assert "| reduce_storage |" in markdown.data and "- a limit" in markdown.data


def test_the_log_reader_joins_split_calls_and_reads_the_process_tree():
    log = "\n".join([
        '100 1.000001 clone(child_stack=NULL, flags=CLONE_CHILD_SETTID|SIGCHLD) = 200 <0.001>',
        '100 1.000002 clone3({flags=CLONE_VM|CLONE_THREAD, child_tid=0x1} => {parent_tid=[101]}'
        ', 88) = 101 <0.0001>',
        '101 1.1 openat(AT_FDCWD</>, "/dev/shm/torch_100_5_0", O_RDWR|O_CREAT|O_EXCL, 0600'
        ' <unfinished ...>',
        '200 1.2 recvmsg(5<UNIX-STREAM:[7->8]>, {msg_control=[{cmsg_level=SOL_SOCKET, '
        'cmsg_type=SCM_RIGHTS, cmsg_data=[9</dev/shm/torch_100_5_0>(deleted)]}]}, 0) = 1 <0.1>',
        '101 1.3 <... openat resumed>) = 6</dev/shm/torch_100_5_0> <0.0002>',
        '200 1.4 mmap(NULL, 4096, PROT_READ|PROT_WRITE, MAP_SHARED, 9</dev/shm/torch_100_5_0>'
        '(deleted), 0) = 0x7f0000001000 <0.00001>',
        '200 1.5 munmap(0x7f0000001000, 4096) = 0 <0.00001>',
        '100 1.6 connect(3<UNIX-STREAM:[55]>, {sa_family=AF_UNIX, sun_path="/tmp/torch-shm-dir-'
        'x/manager.sock"}, 41) = 0 <0.0001>',
        '100 1.7 write(3<UNIX-STREAM:[55->56]>, "d\\0\\0\\0\\1/torch_100_5_0\\0\\0", 68) = 68',
        '100 1.8 openat(AT_FDCWD</>, "/dev/shm/sem.abc", O_RDWR|O_CREAT, 0600) = 4</dev/shm/'
        'sem.abc>',
    ]) + "\n"
    reader = strace_mod.Reader(100)
    events = reader.events(log[:200]) + reader.events(log[200:])  # read in two parts
    names = [(e.pid, e.name) for e in sorted(events, key=lambda e: e.t)]
    assert names == [(100, "openat"), (200, "recvmsg"), (200, "mmap"), (200, "munmap"),
                     (100, "connect"), (100, "write")], names
    assert reader.parent == {200: 100} and reader.process_of[101] == 100
    assert all(e.segment == "/torch_100_5_0" for e in events if e.name != "connect")
    assert events[-1].detail.endswith("to the manager: AllocInfo free pid 100 /torch_100_5_0")


def test_nothing_is_left_and_keep_keeps_the_directory(tmp_path):
    before = set(os.listdir(os.environ.get("TMPDIR", "/tmp")))
    with trace(syscalls=False) as tr:
        pass
    assert set(os.listdir(os.environ.get("TMPDIR", "/tmp"))) - before == set()
    assert sys.getprofile() is None
    with trace(syscalls=False, keep=True) as tr:
        time.sleep(0)
    kept = tr.overhead["directory"]
    assert os.path.isfile(os.path.join(kept, "sitecustomize.py"))
    shutil.rmtree(kept)


def test_poll_reads_events_while_the_block_runs_and_import_installs_nothing():
    import multiprocessing

    assert sys.getprofile() is None  # importing shmlab.trace hooked nothing
    q = multiprocessing.Queue()
    try:
        with trace(syscalls=False) as tr:
            q.put(1)
            deadline, live = time.monotonic() + 10, []
            while "ForkingPickler.dumps" not in [e.name for e in live]:
                assert time.monotonic() < deadline, live
                live += tr.poll()
                time.sleep(0.01)
            assert q.get(timeout=10) == 1
        assert [e.name for e in live][0] == "Queue.put"
        assert tr.hops()[:1] == ["Queue.put"] and "ForkingPickler.loads" in tr.hops()
        assert sys.getprofile() is None
    finally:
        q.close()
        q.join_thread()


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_the_command_line_traces_a_script(tmp_path):
    script = tmp_path / "handoff.py"
    script.write_text(
        "import multiprocessing as mp, numpy as np, shmlab, shmlab.multiprocessing\n"
        "def child(q):\n    print('got', float(q.get().numpy()[0]))\n"
        "if __name__ == '__main__':\n"
        "    q = mp.Queue(); p = mp.get_context('fork').Process(target=child, args=(q,))\n"
        "    p.start(); q.put(shmlab.from_numpy(np.ones(1024, dtype=np.float32))); p.join()\n")
    out = tmp_path / "trace.json"
    run = subprocess.run([sys.executable, "-m", "shmlab", "trace", "--json", str(out), "--",
                          sys.executable, str(script)], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=100)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "got 1.0" in run.stdout and "sequenceDiagram" in run.stdout
    tr = Trace.from_json(out.read_text())
    assert "reduce_storage" in tr.hops() and "rebuild_storage_fd" in tr.hops()
    if shutil.which("strace"):
        assert "send fd" in tr.steps() and "receive fd" in tr.steps()
    labels = sorted(p.label for p in tr.processes.values())
    assert labels[:2] == ["child 1", "main"], labels
