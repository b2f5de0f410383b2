"""shmlab's Tensor/UntypedStorage API, the strategy API, bad input and the fd limit."""

import gc
import multiprocessing
import multiprocessing.resource_sharer
import os
import queue
import resource
import subprocess
import sys

import numpy as np
import pytest
from waiting import stop

import shmlab
import shmlab.multiprocessing as mp
from shmlab.demo import channels
from shmlab.demo.libs import load, new_tensor, shm_fd_count
from shmlab.multiprocessing import reductions


# --- the public API of DESIGN.md -----------------------------------------------------------
def test_tensor_api_and_views():
    t = shmlab.tensor([[1.0, 2.0], [3.0, 4.0]])
    assert t.shape == (2, 2) and t.dtype == np.float32 and t.stride() == (2, 1)
    assert t.storage_offset() == 0 and not t.is_shared()
    col = t[1:, 0]
    assert col.untyped_storage() is t.untyped_storage()
    assert (col.storage_offset(), col.shape, col.stride()) == (2, (1,), (2,))
    col[0] = 30.0
    assert t.numpy()[1, 0] == 30.0  # a view: the write lands in t
    assert t[1, 1].shape == () and t[1, 1].item() == 4.0  # 0-d view, as torch
    fancy = t[[0, 1]]
    assert fancy.untyped_storage() is not t.untyped_storage()  # advanced indexing copies


def test_from_numpy_shares_memory_and_numpy_is_zero_copy():
    arr = np.arange(6, dtype=np.int64).reshape(2, 3)
    t = shmlab.from_numpy(arr)
    arr[0, 0] = 42
    assert t[0, 0].item() == 42
    t.numpy()[1, 2] = -1
    assert arr[1, 2] == -1
    strided = shmlab.from_numpy(arr[:, 1])  # a strided column keeps its strides
    assert strided.stride() == (3,) and strided.tolist() == [1, 4]


def test_share_memory_in_place_keeps_views_and_data():
    t = shmlab.zeros(4, 4)
    view = t[2:]
    t.numpy()[3, 3] = 7.0
    assert t.share_memory_() is t
    assert t.is_shared() and view.is_shared()
    assert view.numpy()[1, 3] == 7.0  # the data moved along
    view.numpy()[0, 0] = 5.0
    assert t.numpy()[2, 0] == 5.0  # and views follow the storage into shared memory
    s = t.untyped_storage()
    assert s.nbytes() == 64 and s.is_shared() and s.share_memory_() is s


def test_empty_and_zeros():
    e = shmlab.empty(2, 3, dtype=np.float64)
    assert e.shape == (2, 3) and e.untyped_storage().nbytes() == 48
    z = shmlab.zeros((0,))
    assert z.numel() == 0 and z.share_memory_().is_shared()


def test_plain_pickle_copies_like_torch_save():
    import pickle

    t = shmlab.zeros(1000)
    data = pickle.dumps(t)
    assert len(data) > 4000 and not t.is_shared()  # a copy, and no side effect
    assert pickle.loads(data).tolist() == t.tolist()


# --- bad input: a clear exception that says what to do ---------------------------------------
def test_object_dtype_is_refused_with_a_hint():
    with pytest.raises(TypeError, match="only fixed-size numbers.*astype"):
        shmlab.from_numpy(np.array([object(), 1], dtype=object))
    with pytest.raises(TypeError, match="object"):
        shmlab.tensor([{"a": 1}])


def test_negative_strides_are_refused_like_torch():
    import torch

    arr = np.arange(4.0)[::-1]
    with pytest.raises(ValueError, match="negative"):
        torch.from_numpy(arr)
    with pytest.raises(ValueError, match="negative.*copy"):
        shmlab.from_numpy(arr)


def test_strategy_api():
    assert mp.get_all_sharing_strategies() == {"file_descriptor", "file_system"}
    assert mp.get_sharing_strategy() == "file_descriptor"
    with pytest.raises(ValueError, match="file_descriptor.*file_system"):
        mp.set_sharing_strategy("shared_memory")
    assert mp.get_sharing_strategy() == "file_descriptor"  # nothing changed
    mp.set_sharing_strategy("file_descriptor")


def test_strategy_check_survives_python_O():
    # A real check, not an assert: `python -O` must not turn bad input into silent acceptance.
    code = ("import shmlab.multiprocessing as mp\n"
            "try:\n    mp.set_sharing_strategy('bogus')\nexcept ValueError as e:\n"
            "    print('refused', e)\n")
    out = subprocess.run([sys.executable, "-O", "-c", code], capture_output=True, text=True,
                         timeout=60)
    assert out.stdout.startswith("refused invalid sharing strategy 'bogus'"), out.stderr


def test_drop_in_reexports_all_of_multiprocessing():
    import torch.multiprocessing as tmp

    missing = [n for n in multiprocessing.__all__ if not hasattr(mp, n)]
    assert missing == []
    # torch adds spawn/start_processes helpers to its __all__; shmlab does not have them.
    assert set(mp.__all__) == set(tmp.__all__) - {"spawn", "start_processes"}
    assert mp.get_context("spawn").Process is multiprocessing.get_context("spawn").Process


def test_init_reductions_is_idempotent():
    from multiprocessing.reduction import ForkingPickler

    mp.init_reductions()  # already ran at import: a second and third call change nothing
    reductions.init_reductions()
    assert ForkingPickler._extra_reducers[shmlab.Tensor] is reductions.reduce_tensor


def test_shared_cache_purges_dead_entries_with_a_scaling_limit():
    cache = reductions.SharedCache()
    live = [shmlab.zeros(1).untyped_storage() for _ in range(518)]
    for i in range(300):
        cache[i] = reductions.StorageWeakRef(live[i])
    # Purges at 129 entries (limit -> 2 x 129 = 258) and at 259 (-> 518): torch's numbers.
    assert cache.limit == 518 and len(cache) == 300
    dead = shmlab.zeros(1).untyped_storage()
    cache["dead"] = reductions.StorageWeakRef(dead)
    del dead
    gc.collect()
    for i in range(300, 518):  # the 519th entry triggers the next purge
        cache[i] = reductions.StorageWeakRef(live[i])
    assert "dead" not in cache and len(cache) == 518
    assert cache.limit == 2 * 518


@pytest.mark.timeout(30)
def test_shared_cache_lock_is_recreated_after_fork():
    # A fork while another thread holds the lock must not hand the child a locked lock.
    # (register_after_fork runs in multiprocessing's children, not after a bare os.fork.)
    cache = reductions.SharedCache()
    cache.lock.acquire()
    child = multiprocessing.get_context("fork").Process(
        target=lambda: os._exit(0 if cache.lock.acquire(timeout=5) else 1))
    child.start()
    child.join(20)
    cache.lock.release()
    assert child.exitcode == 0


# --- the fd limit: a clear error, no hang, nothing leaked ---------------------------------
def fd_limit(lib, n, nofile=64):
    _, mpl = load(lib)
    ctx = mpl.get_context("spawn")
    tensors = [new_tensor(lib, [i]).share_memory_() for i in range(n)]
    inq, results = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=channels.receive_until_failure, args=(lib, nofile, inq, results, n))
    p.start()
    try:
        for t in tensors:
            inq.put(t)
        report = results.get(timeout=120)
    finally:
        stop(p, timeout=60)
    # Drain what the child never took, so each pending DupFd is handed over and closed.
    while True:
        try:
            inq.get(timeout=2)
        except queue.Empty:
            break
    multiprocessing.resource_sharer.stop()
    return report


@pytest.mark.timeout(240)
def test_fd_limit_gives_a_clear_error_like_torch_fails():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 4096:
        pytest.skip(f"the sender needs ~2,100 fds for 1,000 tensors; hard limit is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 4096), hard))
    try:
        before = shm_fd_count()
        obs = {lib: fd_limit(lib, 1000) for lib in ("torch", "shmlab")}
        gc.collect()
        assert shm_fd_count() == before
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    for lib, o in obs.items():
        assert o["error"] is not None, f"{lib} received all 1,000 tensors under RLIMIT 64"
        assert 30 < o["received"] < 64, o
    # torch's error is one of the two cryptic faces of the problem...
    assert any(s in obs["torch"]["error"][1] for s in ("ancdata", "Too many open files"))
    # ...shmlab's names the limit and both fixes.
    kind, message = obs["shmlab"]["error"]
    assert kind == "OSError"
    for needle in ("RLIMIT_NOFILE soft=64", "ulimit -n", "set_sharing_strategy('file_system')"):
        assert needle in message, message
    # Nothing leaked in the receiver: releasing what it held gave its fds back.
    assert obs["shmlab"]["fds_after_release"] < 20
