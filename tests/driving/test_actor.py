"""shmlab.harness.actor: one command loop in a real child process, one proxy in this one."""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
import weakref

import numpy as np
import psutil
import pytest

import shmlab
from shmlab.harness.actor import Actor, ActorDied, ActorError

pytestmark = pytest.mark.timeout(120)
METHODS = ("fork", "spawn")


class Unpicklable(Exception):
    def __init__(self, a, b):  # pickles, but cannot be rebuilt from .args: a classic
        super().__init__(f"{a}-{b}")


def _raise_unpicklable():
    raise Unpicklable(1, 2)


def _fork_sleeper():
    """Fork a grandchild that holds a copy of the child's pipe end (as a manager daemon may)."""
    pid = os.fork()
    if pid == 0:
        time.sleep(30)
        os._exit(0)
    return pid


def _write_first(t, value):
    t.numpy()[0] = value
    return shmlab.from_numpy(np.arange(3, dtype=np.float32)).share_memory_()


class Held:
    """An object whose death a table can see (a stand-in for a tensor's storage)."""


def _fail_holding(kept):
    local = Held()
    kept.append(weakref.ref(local))
    raise RuntimeError("failed while holding a Held")


def table(offset, mark=None):
    """A small table: what every test below drives."""
    kept = []

    def on_exit():
        if mark:
            with open(mark, "w") as f:
                f.write("exited")

    return {"add": lambda x: x + offset, "div": lambda a, b: a / b, "sleep": time.sleep,
            "pid": os.getpid, "unpicklable": _raise_unpicklable, "fork_sleeper": _fork_sleeper,
            "write_first": _write_first, "exit": on_exit,
            "fail_holding": lambda: _fail_holding(kept),
            "held_alive": lambda: [r() is not None for r in kept]}


def broken_table():
    raise ImportError("no such library here")


@pytest.fixture(params=METHODS)
def actor(request):
    a = Actor(table, 10, ctx=request.param)
    yield a
    a.exit()


def test_a_command_runs_in_the_child_and_its_reply_comes_back(actor):
    assert actor("add", 5) == 15
    assert actor("pid") == actor.pid != os.getpid()
    assert actor.ready() == actor.pid


def test_a_command_that_raises_is_an_actor_error_with_type_message_and_traceback(actor):
    with pytest.raises(ActorError, match="ZeroDivisionError: division by zero") as info:
        actor("div", 1, 0)
    err = info.value
    assert (err.command, err.type, err.message) == ("div", "ZeroDivisionError", "division by zero")
    assert "a / b" in err.traceback and isinstance(err.exception, ZeroDivisionError)
    with pytest.raises(ActorError, match="Unpicklable: 1-2") as info:
        actor("unpicklable")
    assert info.value.exception is None  # only its text could travel
    with pytest.raises(ActorError, match="unknown command 'nope'"):
        actor("nope")
    assert actor("add", 1) == 11  # the child serves on


def test_a_failed_command_keeps_nothing_alive_in_the_child(actor):
    # The exception's traceback holds the command's frame: kept, it would keep a tensor's
    # memory alive after the table dropped it (torch then never frees it at all).
    with pytest.raises(ActorError, match="failed while holding"):
        actor("fail_holding")
    assert actor("held_alive") == [False]


def test_a_table_that_cannot_be_built_fails_the_first_call():
    a = Actor(broken_table, ctx="fork")
    try:
        with pytest.raises(ActorError, match="ImportError: no such library here"):
            a("anything")
    finally:
        a.exit()


def test_a_slow_command_times_out_naming_it_and_its_late_reply_is_dropped(actor):
    actor.ready()
    with pytest.raises(TimeoutError, match=r"'sleep' within 0.2 s") as info:
        actor("sleep", 1.0, timeout=0.2)
    assert str(actor.pid) in str(info.value)
    assert actor("add", 2) == 12  # not the None the sleep answered late


def test_tensors_travel_in_commands_and_replies(actor):
    t = shmlab.zeros(4).share_memory_()
    back = actor("write_first", t, 7.0)
    assert t.numpy()[0] == 7.0  # the child wrote into our memory
    assert back.numpy().tolist() == [0.0, 1.0, 2.0] and back.is_shared()


def test_a_child_killed_while_we_wait_is_actor_died_at_once(actor):
    actor.ready()
    actor.send("sleep", 30)
    time.sleep(0.2)
    os.kill(actor.pid, signal.SIGKILL)
    start = time.monotonic()
    with pytest.raises(ActorDied, match="before it answered 'sleep'") as info:
        actor.reply(timeout=30)
    assert time.monotonic() - start < 2 and info.value.exitcode == -signal.SIGKILL
    with pytest.raises(ActorDied):  # and stays dead
        actor("add", 1)


def test_died_is_seen_even_when_a_grandchild_holds_the_pipe_open():
    a = Actor(table, 0, ctx="fork")
    grandchild = a("fork_sleeper")
    try:
        a.send("sleep", 30)
        os.kill(a.pid, signal.SIGKILL)
        start = time.monotonic()
        with pytest.raises(ActorDied):
            a.reply(timeout=30)
        assert time.monotonic() - start < 2  # no EOF came: the sentinel told us
    finally:
        os.kill(grandchild, signal.SIGKILL)
        a.exit()
        _wait_gone(grandchild)


@pytest.mark.parametrize("method", METHODS)
def test_kill_reaps_at_once_even_when_a_grandchild_holds_the_sentinel(method):
    """A torch_shm_manager started by the child inherits its end of the sentinel pipe: kill()
    must not wait on that pipe (join would time out after 10 s and leave a zombie)."""
    a = Actor(table, 0, ctx=method)
    grandchild = a("fork_sleeper")
    try:
        start = time.monotonic()
        a.kill()
        assert a.exitcode == -signal.SIGKILL and time.monotonic() - start < 5
        assert not psutil.pid_exists(a.pid)  # reaped: not even a zombie
    finally:
        os.kill(grandchild, signal.SIGKILL)
        _wait_gone(grandchild)


def test_exit_runs_the_tables_exit_and_is_safe_twice(tmp_path):
    mark = tmp_path / "mark"
    with Actor(table, 0, str(mark), ctx="spawn") as a:
        assert a("add", 1) == 1
    assert mark.read_text() == "exited" and a.exitcode == 0
    a.exit()  # twice is fine
    a.kill()


def test_exit_of_a_stuck_child_kills_it():
    a = Actor(table, 0, ctx="fork")
    a.ready()
    a.send("sleep", 30)
    start = time.monotonic()
    a.exit(timeout=0.5)
    assert time.monotonic() - start < 5 and a.exitcode == -signal.SIGKILL


def _start_actor_and_wait(method, q):
    a = Actor(table, 0, ctx=method)
    q.put(a("pid"))
    time.sleep(60)


def _wait_gone(pid, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False


@pytest.mark.parametrize("method", METHODS)
def test_the_child_stops_when_its_parent_is_killed(method):
    ctx = multiprocessing.get_context("fork")
    q = ctx.Queue()
    parent = ctx.Process(target=_start_actor_and_wait, args=(method, q))  # may have children
    parent.start()
    try:
        child = q.get(timeout=60)
    finally:
        parent.kill()
        parent.join()
        q.close()
        q.join_thread()
    gone = _wait_gone(child, 5.0)  # it polls its parent once a second
    if not gone:
        os.kill(child, signal.SIGKILL)
    assert gone, "the actor outlived its parent"
