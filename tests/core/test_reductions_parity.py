"""shmlab behaves as torch does: each scenario runs on both, in one test, and is compared.

These are the learner-visible behaviours: pickling moves storage to shared memory,
writes cross process boundaries on every channel and start method, views travel as views,
empty tensors need no segment, fd accounting, and an empty /dev/shm under file_descriptor.
"""

import gc
import os
from multiprocessing.reduction import ForkingPickler

import numpy as np
import pytest
from support.families import LIBS, both
from support.waiting import stop

from shmlab.harness.libs import fd_count, load, new_tensor, shm_fd_count
from shmlab.lessons.channels import describe_views, hold_and_count, pool_write, write_then_watch

METHODS = ("fork", "spawn", "forkserver")


# --- 1. pickling moves the storage into shared memory; the pickle stays tiny ----------------
@pytest.mark.timeout(60)
def test_pickling_shares_as_a_side_effect_and_pickle_is_tiny():
    sizes = {}
    for lib in LIBS:
        for n in (1_000, 1_000_000):
            t = new_tensor(lib, np.zeros(n))
            assert t.is_shared() is False
            data = ForkingPickler.dumps(t)
            assert t.is_shared() is True, f"{lib}: pickling did not move the storage to shm"
            sizes[lib, n] = len(data)
            # Unpickle in this process so the DupFd is consumed and nothing stays pending.
            ForkingPickler.loads(data)
    for lib in LIBS:
        assert sizes[lib, 1_000_000] < 1_000, f"{lib}: the pickle carries the data"
        assert abs(sizes[lib, 1_000_000] - sizes[lib, 1_000]) < 8, "size must not grow with n"
    # Both are a few hundred bytes for 4 MB of floats (torch: ~342 B).
    assert abs(sizes["torch", 1_000_000] - sizes["shmlab", 1_000_000]) < 200


# --- 2. a write on one side is seen on the other: Queue, Pipe, args, Pool; every method ------
def channels(lib, method, share_args_first):
    _, mp = load(lib)
    ctx = mp.get_context(method)
    arg_t, q_t, p_t = (new_tensor(lib, [0, 0, 0, 0]) for _ in range(3))
    if share_args_first:
        arg_t.share_memory_()
    inq, results = ctx.Queue(), ctx.Queue()
    parent_end, child_end = ctx.Pipe()
    done, go = ctx.Event(), ctx.Event()
    p = ctx.Process(target=write_then_watch,
                    args=(arg_t, inq, child_end, done, go, results, 7.0))
    p.start()
    try:
        inq.put(q_t)
        parent_end.send(p_t)
        assert done.wait(60), "child did not receive the tensors"
        seen_by_parent = {k: float(t.numpy()[0]) for k, t in
                          {"args": arg_t, "queue": q_t, "pipe": p_t}.items()}
        for t in (arg_t, q_t, p_t):
            t.numpy()[1] = 9.0
        go.set()
        seen_by_child = results.get(timeout=60)
    finally:
        stop(p)
    return {"parent_sees": seen_by_parent, "child_sees": seen_by_child,
            "queue_tensor_shared": q_t.is_shared(), "exitcode": p.exitcode}


@pytest.mark.timeout(180)
@pytest.mark.parametrize("method", METHODS)
def test_writes_cross_processes_like_torch(method):
    obs = both(channels, method, True)
    assert obs["torch"] == obs["shmlab"]
    o = obs["shmlab"]
    assert o["exitcode"] == 0
    assert o["queue_tensor_shared"] is True
    assert o["parent_sees"] == {"args": 7.0, "queue": 7.0, "pipe": 7.0}
    assert o["child_sees"] == {"args": 9.0, "queue": 9.0, "pipe": 9.0}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_unshared_process_argument_like_torch(method):
    # Under fork, Process arguments are not pickled: an unshared tensor is copied-on-write
    # and the two sides stop seeing each other. Under spawn they are pickled, hence shared.
    obs = both(channels, method, False)
    assert obs["torch"] == obs["shmlab"]
    expected = 0.0 if method == "fork" else 7.0
    assert obs["shmlab"]["parent_sees"]["args"] == expected


def pool_scenario(lib, method):
    _, mp = load(lib)
    t = new_tensor(lib, [0, 5, 0, 0])
    with mp.get_context(method).Pool(1) as pool:
        seen_by_child = pool.apply(pool_write, (t, 3.0))
        pool.close()
        pool.join()
    return {"child_sees": seen_by_child, "parent_sees": float(t.numpy()[0]),
            "shared": t.is_shared()}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("method", METHODS)
def test_pool_shares_like_torch(method):
    obs = both(pool_scenario, method)
    assert obs["torch"] == obs["shmlab"] == {"child_sees": 5.0, "parent_sees": 3.0,
                                              "shared": True}


# --- 3. views travel as (storage, offset, shape, strides) -----------------------------------
def views(lib, method):
    _, mp = load(lib)
    ctx = mp.get_context(method)
    base = new_tensor(lib, np.arange(12).reshape(3, 4))
    sliced, column = base[1:], base[:, 2]
    inq, results = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=describe_views, args=(inq, results))
    p.start()
    try:
        inq.put((sliced, column))
        got = results.get(timeout=60)
    finally:
        stop(p)
    return got


@pytest.mark.timeout(120)
@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_views_travel_as_views_like_torch(method):
    obs = both(views, method)
    assert obs["torch"] == obs["shmlab"]
    sliced, column = obs["shmlab"]
    assert (sliced["offset"], sliced["shape"], sliced["stride"]) == (4, (2, 4), (4, 1))
    assert (column["offset"], column["shape"], column["stride"]) == (2, (3,), (4,))
    assert sliced["storage_nbytes"] == column["storage_nbytes"] == 48  # the whole storage
    assert column["same_storage_as_first"] is True
    assert column["values"] == [2.0, 6.0, 10.0]


# --- 4. empty tensors travel without a segment ---------------------------------------------
@pytest.mark.timeout(30)
def test_empty_tensor_needs_no_segment_like_torch():
    obs = {}
    for lib in LIBS:
        t = new_tensor(lib, [])
        fds = fd_count()
        data = ForkingPickler.dumps(t)
        back = ForkingPickler.loads(data)
        obs[lib] = {"shared": t.is_shared(), "fds_added": fd_count() - fds,
                    "rebuilt_numel": back.numpy().size, "uses_empty_rebuild":
                    b"rebuild_storage_empty" in bytes(data)}
    assert obs["torch"] == obs["shmlab"] == {"shared": False, "fds_added": 0,
                                              "rebuilt_numel": 0, "uses_empty_rebuild": True}


# --- 5. fd accounting ----------------------------------------------------------------------
def fd_accounting(lib, n):
    _, mp = load(lib)
    ctx = mp.get_context("spawn")
    tensors = [new_tensor(lib, [i]) for i in range(n)]
    sender_before = shm_fd_count()
    for t in tensors:
        t.share_memory_()
    sender_holding = shm_fd_count()
    inq, results = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=hold_and_count, args=(lib, inq, results, n))
    p.start()
    try:
        for t in tensors:
            inq.put(t)
        counts = results.get(timeout=120)
    finally:
        stop(p)
    del tensors, t
    gc.collect()
    return {"receiver_added": counts["holding"] - counts["before"],
            "receiver_released": counts["holding"] - counts["after"],
            "sender_added": sender_holding - sender_before,
            "sender_released": sender_holding - shm_fd_count()}


@pytest.mark.timeout(180)
def test_fd_accounting_matches_torch_for_100_tensors():
    obs = both(fd_accounting, 100)
    assert obs["torch"] == obs["shmlab"]
    assert obs["shmlab"] == {"receiver_added": 100, "receiver_released": 100,
                             "sender_added": 100, "sender_released": 100}


# --- 6. /dev/shm stays empty; the fd link says (deleted) ------------------------------------
@pytest.mark.timeout(30)
def test_fd_strategy_leaves_dev_shm_empty_like_torch():
    for lib, prefix in (("torch", "/dev/shm/torch_"), ("shmlab", "/dev/shm/shmlab_")):
        t = new_tensor(lib, np.ones(1000)).share_memory_()
        fd, _ = t.untyped_storage()._share_fd_cpu_()
        link = os.readlink(f"/proc/self/fd/{fd}")
        assert link.startswith(prefix) and link.endswith(" (deleted)"), link
        name = link.split("/")[-1].split(" ")[0]
        assert not os.path.exists(f"/dev/shm/{name}")
        assert os.fstat(fd).st_size == 4000
        assert oct(os.fstat(fd).st_mode & 0o777) == "0o600"
