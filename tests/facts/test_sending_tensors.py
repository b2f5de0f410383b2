"""What crosses when torch sends a CPU tensor to another process, and what the strategy changes.

Mirrors: torch/multiprocessing/reductions.py and torch/multiprocessing/__init__.py (the installed
torch, not shmlab), for the claims the drill's Q1 and Q2 cards rest on.
"""

import importlib
import io
import pickle
import subprocess
import sys
import threading
from multiprocessing import reduction

import pytest
import torch
import torch.multiprocessing as tmp
from torch.multiprocessing import reductions

import shmlab.multiprocessing as shm_mp

TIMEOUT = 60


@pytest.fixture
def strategy():
    """Set torch's strategy inside a test and put the default back after it."""
    before = tmp.get_sharing_strategy()
    yield tmp.set_sharing_strategy
    tmp.set_sharing_strategy(before)


def in_child(body, *args):
    """Run body(*args) in a forked child and fail here with its traceback. A file_system
    segment connects its process to a torch_shm_manager for the rest of its life: made in the
    pytest process, that manager would outlive the test; a child's exits ~2 s after the child."""
    ctx = tmp.get_context("fork")
    q = ctx.Queue()
    child = ctx.Process(target=_run, args=(q, body, args))
    child.start()
    error = q.get(timeout=TIMEOUT)
    child.join(TIMEOUT)
    assert error is None, error
    assert child.exitcode == 0


def _run(q, body, args):
    import traceback

    try:
        body(*args)
    except BaseException:
        q.put(traceback.format_exc())
    else:
        q.put(None)


def _dumps(obj) -> bytes:
    return bytes(reduction.ForkingPickler.dumps(obj))


def _sent(obj) -> bytes:
    """The message, received here too: under file_system every pickle increfs the segment and
    only a receive gives that count back (else the file outlives the test)."""
    msg = _dumps(obj)
    pickle.loads(msg)
    return msg


@pytest.mark.claim("C25.100")
@pytest.mark.parametrize("name", ["file_descriptor", "file_system"])
def test_the_message_holds_a_handle_and_the_views_metadata(name):
    in_child(_message, name)


def _message(name):
    tmp.set_sharing_strategy(name)
    small, big = torch.zeros(10), torch.zeros(1_000_000)
    view = big[10:20]
    msg = _sent(view)
    assert b"rebuild_tensor" in msg
    rebuild, args = reductions.reduce_tensor(view)
    assert rebuild is reductions.rebuild_tensor
    assert args[2] == (10, torch.Size([10]), (1,), False)  # offset, shape, strides, grad flag
    storage_rebuild, storage_args = reductions.reduce_storage(big.untyped_storage())
    if name == "file_descriptor":
        assert storage_rebuild is reductions.rebuild_storage_fd
        assert b"rebuild_storage_fd" in msg and b"DupFd" in msg
        assert b"resource_sharer" in msg  # on a Queue the fd is fetched from the sender's
        assert storage_args[2] == 4_000_000  # the byte size
    else:
        assert storage_rebuild is reductions.rebuild_storage_filename
        manager, handle, size = storage_args[1:]
        assert handle in msg and size == 4_000_000  # the segment's name travels in the pickle
    storage_rebuild(*storage_args)  # received: the count the reduce took is given back
    assert b"float" in msg.lower()  # the dtype (the typed storage's)
    # a handle, not the data: 40 bytes and 4 MB pickle to a few hundred bytes each, a few apart
    assert abs(len(_sent(small)) - len(_sent(big))) < 16 and len(msg) < 1000


@pytest.mark.claim("C25.101", "C25.102", "C25.108", "C25.109",
                   start_methods=("fork", "spawn"))
@pytest.mark.slow
@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_a_round_trip_through_a_child(method):
    ctx = tmp.get_context(method)
    t = torch.zeros(1000)
    private_ptr = t.data_ptr()
    _dumps(t)  # the first pickle moves the storage into shared memory, on the sender
    assert t.is_shared() and t.data_ptr() != private_ptr
    shared_ptr = t.data_ptr()
    _dumps(t)
    assert t.data_ptr() == shared_ptr  # a second pickle copies nothing
    inq, outq = ctx.Queue(), ctx.Queue()
    child = ctx.Process(target=_echo, args=(inq, outq))
    child.start()
    try:
        inq.put(t[10:20])
        report = outq.get(timeout=TIMEOUT)
        back = outq.get(timeout=TIMEOUT)
    finally:
        inq.put(None)  # the child serves its fds until it exits: it waits for this
        child.join(TIMEOUT)
    assert child.exitcode == 0
    # the slice arrived as a view over the whole storage, at its offset
    assert report["nbytes"] == 4000 and report["offset"] == 10 and report["shared"]
    assert report["ptr_kept"]  # a received tensor pickles again without a copy
    # the child's in-place writes are seen here; its out-of-place result was private
    assert t[10].item() == 1 and t[11:20].eq(2).all() and report["plus_one_shared"] is False
    # sent back: the sender's own storage, not a copy
    assert back.untyped_storage().data_ptr() == t.untyped_storage().data_ptr()
    assert back.storage_offset() == 10


def _echo(inq, outq):
    s = inq.get(timeout=TIMEOUT)
    ptr = s.data_ptr()
    _dumps(s)
    s[0] = 1
    s[1:].add_(2)
    plus_one = s + 1
    outq.put({"nbytes": s.untyped_storage().nbytes(), "offset": s.storage_offset(),
              "shared": s.is_shared(), "ptr_kept": s.data_ptr() == ptr,
              "plus_one_shared": plus_one.is_shared()})
    outq.put(s)
    inq.get(timeout=TIMEOUT)


@pytest.mark.claim("C25.103")
def test_requires_grad_travels_the_graph_and_grad_do_not():
    leaf = torch.ones(3, requires_grad=True)
    (leaf * 2).sum().backward()
    assert leaf.grad is not None
    got = pickle.loads(_dumps(leaf))
    assert got.requires_grad and got.is_leaf and got.grad is None and got.grad_fn is None
    with pytest.raises(RuntimeError, match="Cowardly refusing to serialize non-leaf tensor "
                                           "which requires_grad"):
        _dumps(leaf * 2)


@pytest.mark.slow
@pytest.mark.claim("C25.104", "C25.301")
def test_importing_torch_registers_reducers_for_tensors_storages_and_events_only():
    # ForkingPickler already has the standard library's reducers (methods, functools.partial,
    # sockets, ...), so "the same as before import torch" is the claim, not "as plain pickle"
    code = (
        "import sys, functools, multiprocessing.reduction as r\n"
        "before = dict(r.ForkingPickler._extra_reducers)\n"
        "objs = [{'a': [1, 2.0, 'x']}, functools.partial(int, '3')]\n"
        "was = [bytes(r.ForkingPickler.dumps(o)) for o in objs]\n"
        "import torch\n"
        "print('torch.multiprocessing' in sys.modules)\n"
        "new = [c for c in r.ForkingPickler._extra_reducers if c not in before]\n"
        "mine = {torch.Tensor, torch.nn.Parameter, torch.storage.TypedStorage,\n"
        "        torch.cuda.Event, *torch._tensor_classes, *torch._storage_classes}\n"
        "other = sorted(f'{c.__module__}.{c.__name__}' for c in new if c not in mine)\n"
        "print(other == ['multiprocessing.connection.Connection'],\n"
        "      torch.Tensor in new, torch.UntypedStorage in new, torch.cuda.Event in new)\n"
        "print(was == [bytes(r.ForkingPickler.dumps(o)) for o in objs])\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=TIMEOUT)
    assert out.stdout.split() == ["True"] * 6, (out.stdout, out.stderr)
    # a plain object pickles to the same bytes as with pickle itself
    obj = {"a": [1, 2.0, "x"]}
    assert _dumps(obj) == pickle.dumps(obj)


@pytest.mark.claim("C25.106")
def test_torch_multiprocessing_reexports_names_not_submodules():
    import multiprocessing

    assert all(getattr(tmp, n) is getattr(multiprocessing, n) for n in multiprocessing.__all__)
    for extra in ("spawn", "start_processes", "ProcessContext", "ProcessRaisedException",
                  "ProcessExitedException"):
        assert getattr(tmp, extra) is not getattr(multiprocessing, extra, None)
    for sub in ("shared_memory", "managers", "connection"):
        with pytest.raises(ModuleNotFoundError):
            importlib.import_module(f"torch.multiprocessing.{sub}")


@pytest.mark.slow
@pytest.mark.claim("C25.107", start_methods=("fork", "spawn", "forkserver"))
@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
def test_process_arguments_under_each_start_method(method):
    ctx = tmp.get_context(method)
    private, shared = torch.zeros(4), torch.zeros(4).share_memory_()
    child = ctx.Process(target=_write_args, args=(private, shared))
    child.start()
    child.join(TIMEOUT)
    assert child.exitcode == 0
    assert shared.eq(7).all()
    if method == "fork":  # nothing pickled: inherited copy-on-write, the write stays in the child
        assert private.eq(0).all() and not private.is_shared()
    else:  # pickled by the reducers: moved to shared memory, the write is seen
        assert private.eq(7).all() and private.is_shared()


def _write_args(private, shared):
    private.fill_(7)
    shared.fill_(7)


class _Slow:
    """Pickles only once the test lets it, recording which thread pickled it."""

    def __init__(self, go: threading.Event, seen: list):
        self.go, self.seen = go, seen

    def __reduce__(self):
        self.seen.append(threading.current_thread() is threading.main_thread())
        assert self.go.wait(TIMEOUT)
        return (int, (0,))


@pytest.mark.claim("C25.110")
def test_put_returns_before_the_feeder_thread_pickles():
    q = tmp.get_context("fork").Queue()
    go, seen = threading.Event(), []
    try:
        q.put(_Slow(go, seen))
        t = torch.zeros(100)
        q.put(t)
        assert not t.is_shared()  # put() returned; the feeder has not pickled it yet
        go.set()
        assert q.get(timeout=TIMEOUT) == 0
        got = q.get(timeout=TIMEOUT)
        assert t.is_shared() and got.data_ptr() == t.data_ptr()
        assert seen == [False]  # pickled in the feeder thread, not in the caller
    finally:
        go.set()
        q.close()
        q.join_thread()


@pytest.mark.claim("C25.117", start_methods=("fork",))
@pytest.mark.parametrize("sender", ["file_descriptor", "file_system"])
def test_the_receivers_setting_does_not_matter(sender):
    in_child(_send_to_other_setting, sender)


def _send_to_other_setting(sender):
    receiver = ({"file_descriptor", "file_system"} - {sender}).pop()
    ctx = tmp.get_context("fork")
    inq, outq = ctx.Queue(), ctx.Queue()
    child = ctx.Process(target=_receive_with, args=(receiver, inq, outq))
    child.start()
    try:
        tmp.set_sharing_strategy(sender)
        t = torch.zeros(8)
        inq.put(t)
        assert outq.get(timeout=TIMEOUT) == receiver
    finally:
        child.join(TIMEOUT)
    assert child.exitcode == 0 and t.eq(5).all()


def _receive_with(name, inq, outq):
    tmp.set_sharing_strategy(name)
    t = inq.get(timeout=TIMEOUT)
    t.fill_(5)
    outq.put(tmp.get_sharing_strategy())


@pytest.mark.slow
@pytest.mark.claim("C25.118", start_methods=("fork", "spawn", "forkserver"))
@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
def test_the_strategy_is_a_per_process_global(strategy, method):
    strategy("file_system")  # inside a function, as under a __main__ guard
    ctx = tmp.get_context(method)
    q = ctx.Queue()
    child = ctx.Process(target=_report_strategy, args=(q,))
    child.start()
    got = q.get(timeout=TIMEOUT)
    child.join(TIMEOUT)
    assert got == ("file_system" if method == "fork" else "file_descriptor")


def _report_strategy(q):
    q.put(tmp.get_sharing_strategy())


@pytest.mark.claim("C25.119")
def test_torchs_strategy_set_is_its_own_and_mutable(strategy):
    names = tmp.get_all_sharing_strategies()
    assert names is tmp.get_all_sharing_strategies() and isinstance(names, set)
    names.add("x")
    try:
        strategy("x")
        assert tmp.get_sharing_strategy() == "x"
        rebuild, _ = reductions.reduce_storage(torch.zeros(4).untyped_storage())
        assert rebuild is reductions.rebuild_storage_fd  # anything but file_system: fds
    finally:
        names.discard("x")
    copy = shm_mp.get_all_sharing_strategies()
    copy.add("y")
    assert "y" not in shm_mp.get_all_sharing_strategies()  # shmlab returns a copy


@pytest.mark.slow
@pytest.mark.claim("C25.120")
def test_a_bad_name_raises_assertionerror_even_under_python_O():
    code = ("import torch.multiprocessing as mp\n"
            "try:\n    mp.set_sharing_strategy('bogus')\n"
            "except AssertionError as e:\n    print('AssertionError', e)\n")
    out = subprocess.run([sys.executable, "-O", "-c", code], capture_output=True, text=True,
                         timeout=TIMEOUT)
    assert out.stdout.startswith("AssertionError invalid sharing strategy 'bogus'"), out.stderr
    import inspect

    assert "raise AssertionError" in inspect.getsource(tmp.set_sharing_strategy)


@pytest.mark.claim("C25.121")
@pytest.mark.parametrize("name", ["file_descriptor", "file_system"])
def test_torch_save_and_pickle_write_the_bytes(name):
    in_child(_save_and_pickle, name)


def _save_and_pickle(name):
    tmp.set_sharing_strategy(name)
    t = torch.zeros(250_000).share_memory_()  # 1 MB, already shared
    buf = io.BytesIO()
    torch.save(t, buf)
    assert buf.tell() > 1_000_000 and len(pickle.dumps(t)) > 1_000_000
    assert len(_sent(t)) < 1000
    loaded = torch.load(io.BytesIO(buf.getvalue()))
    assert not loaded.is_shared()


@pytest.mark.slow
@pytest.mark.claim("C25.122")
def test_the_strategies_on_linux_and_elsewhere():
    assert sys.platform == "linux"
    assert tmp.get_all_sharing_strategies() == {"file_descriptor", "file_system"}
    code = ("import torch.multiprocessing as mp\n"
            "print(mp.get_sharing_strategy())\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=TIMEOUT)
    assert out.stdout.strip() == "file_descriptor", out.stderr
    import inspect

    src = inspect.getsource(tmp)
    assert 'sys.platform == "darwin" or sys.platform == "win32"' in src
    after = src.split('sys.platform == "darwin" or sys.platform == "win32"', 1)[1][:200]
    assert '_sharing_strategy = "file_system"' in after
    assert '_all_sharing_strategies = {"file_system"}' in after
