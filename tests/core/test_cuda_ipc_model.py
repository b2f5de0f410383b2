"""shmlab.models.cuda_ipc: the CPU model of torch's CUDA IPC protocol, with real processes.

A consumer child (an ``Actor`` serving ``shmlab.lessons.cuda.model_commands``) receives blocks
in its commands; this test process is the producer. Every test ends with the model shut down,
and the leak checker verifies that no shmlab_* file is left in /dev/shm.
"""

from __future__ import annotations

import multiprocessing
import subprocess
import sys
import threading
import time
import warnings
from multiprocessing.reduction import ForkingPickler

import numpy as np
import pytest

from shmlab import _shm
from shmlab.harness.actor import Actor
from shmlab.lessons.cuda import model_commands
from shmlab.models import cuda_ipc as model

pytestmark = pytest.mark.timeout(120)
F32 = np.float32


@pytest.fixture(autouse=True)
def fresh_model():
    model._state.clear()
    yield
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # tests that leave limbo on purpose
        model.shutdown()
    model._state.clear()


@pytest.fixture(params=["fork", "spawn"])
def consumer(request):
    c = Actor(model_commands, ctx=request.param)
    yield c
    c.exit()


@pytest.fixture
def fork_consumer():
    c = Actor(model_commands, ctx="fork")
    yield c
    c.exit()


def test_handle_is_the_whole_allocation_plus_an_offset_and_writes_are_shared(consumer):
    a, b = model.alloc(16), model.alloc(16)
    a.numpy(F32)[:] = 1.0
    b.numpy(F32)[:] = 2.0
    assert a.handle == b.handle and (a.offset, b.offset) == (0, 16)  # one "cudaMalloc"
    handle, offset, first = consumer("recv", "b", b)  # pickled by Block.__reduce__
    assert (handle, offset, first) == (b.handle, 16, [2.0] * 4)
    assert b.counters() == [1]  # one send, one slot, held by the consumer
    consumer("write", "b", 7.0)
    assert b.numpy(F32).tolist() == [7.0] * 4 and a.numpy(F32).tolist() == [1.0] * 4
    assert consumer("free", "b") == "released"
    assert b.counters() == [0]


def test_an_explicit_ipc_handle_works_too(fork_consumer):
    b = model.alloc(8)
    h = model.share(b)
    assert isinstance(h, model.IpcHandle) and h.counter_offset % 8 == 0
    assert _shm.read_refcount(h.counter_handle) == 1
    fork_consumer("recv", "b", tuple(h))
    assert _shm.read_refcount(h.counter_handle) == 2  # the consumer mapped the counters file
    fork_consumer("free", "b")
    assert _shm.read_refcount(h.counter_handle) == 1


def test_producer_blocks_until_the_consumer_releases(fork_consumer):
    b = model.alloc(16)
    fork_consumer("recv", "b", b)
    assert model.wait_released(b, timeout=0.3) is False  # still held
    asked_at = []

    def release_later():
        time.sleep(0.5)
        asked_at.append(time.monotonic())  # before the command: the reply may come after
        fork_consumer("free", "b")  # the producer has already seen the release

    t0 = time.monotonic()
    releaser = threading.Thread(target=release_later)
    releaser.start()
    assert model.wait_released(b, timeout=30)
    waited = time.monotonic()
    releaser.join(30)
    assert asked_at and waited >= asked_at[0] and waited - t0 >= 0.5


def test_free_while_shared_goes_to_limbo_and_ipc_collect_frees_it_after_release(fork_consumer):
    b = model.alloc(16)
    b.numpy(F32)[:] = 3.0
    fork_consumer("recv", "b", b)
    assert b.free() == "limbo" and model.limbo() == [b]
    assert model.ipc_collect() == 0
    c = model.alloc(16)  # the allocator must not hand out the consumer's bytes
    assert (c.handle, c.offset) != (b.handle, b.offset)
    c.numpy(F32)[:] = -1.0
    assert fork_consumer("read", "b") == [3.0] * 4  # still valid for the consumer
    fork_consumer("free", "b")
    assert model.ipc_collect() == 1 and model.limbo() == []
    d = model.alloc(16)  # now the block is back in the cache and reused
    assert (d.handle, d.offset) == (b.handle, b.offset)


def test_without_the_limbo_the_consumer_would_read_someone_elses_data(fork_consumer):
    b = model.alloc(16)
    b.numpy(F32)[:] = 3.0
    fork_consumer("recv", "b", b)
    assert b.free(limbo=False) == "freed"  # what the keep-alive rule protects against
    c = model.alloc(16)
    assert (c.handle, c.offset) == (b.handle, b.offset)
    c.numpy(F32)[:] = 42.0  # a new tensor of the producer's
    assert fork_consumer("read", "b") == [42.0] * 4  # "garbage" for the consumer
    fork_consumer("free", "b")


def test_a_second_arrival_hits_the_cache_and_releases_its_own_slot(fork_consumer):
    b = model.alloc(16)
    first = fork_consumer("recv", "x", b)
    again = fork_consumer("recv", "y", b)
    assert first[:2] == again[:2]
    assert b.counters() == [1, 0]  # the cache hit released the second slot at once
    fork_consumer("free", "x")
    assert b.counters() == [0, 0]


def test_a_received_block_cannot_be_sent_on(fork_consumer):
    b = model.alloc(16)
    fork_consumer("recv", "b", b)
    with pytest.raises(RuntimeError, match="Attempted to send CUDA tensor received from another"):
        fork_consumer("resend", "b")
    fork_consumer("free", "b")
    local = model.rebuild_block(*model.share(model.alloc(8)))  # received in this process
    with pytest.raises(RuntimeError, match="Consider cloning before sending"):
        ForkingPickler.dumps(local)
    local.free()


def test_a_full_counters_file_opens_a_new_one(monkeypatch):
    monkeypatch.setattr(model, "SLOTS", 2)
    b = model.alloc(8)
    handles = [model.share(b) for _ in range(3)]
    assert len({h.counter_handle for h in handles}) == 2
    assert [h.counter_offset for h in handles] == [0, 8, 0]
    got = [model.rebuild_block(*h) for h in handles]  # received here, in this process
    assert got[0] is got[1] is got[2] and b.counters() == [1, 0, 0]  # cache hits released
    got[0].free()
    assert b.counters() == [0, 0, 0]


def test_bad_sizes_and_freed_blocks_are_refused():
    with pytest.raises(ValueError, match="size must be"):
        model.alloc(0)
    b = model.alloc(8)
    assert b.free() == "freed" and b.free() == "already freed"
    with pytest.raises(ValueError, match="freed block"):
        model.share(b)


def test_producer_exit_with_unreleased_blocks_warns_and_leaves_nothing(tmp_path):
    code = (
        "from shmlab.models import cuda_ipc as m\n"
        "b = m.alloc(64); h = m.share(b)\n"       # sent, never released by anybody
        "print(b.free(), h.handle, h.counter_handle, flush=True)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    state, segment, counters = out.stdout.split()
    assert state == "limbo"
    assert model.EXIT_WARNING in out.stderr
    assert _shm.read_refcount(segment) is None and _shm.read_refcount(counters) is None


def test_a_forked_child_does_not_release_its_parents_blocks():
    b = model.alloc(8)
    got = model.rebuild_block(*model.share(b))  # received in this process
    child = multiprocessing.get_context("fork").Process(target=model.shutdown)
    child.start()
    child.join(30)
    assert child.exitcode == 0 and b.counters() == [1]  # the child had nothing of its own
    got.free()
    assert b.counters() == [0]


# torch's constants and slot rules, read from the installed header (CudaIPCTypes.h ships with
# every wheel, CPU builds included); the behaviour each test checks is in CudaIPCTypes.cpp.
def _torch_ipc_header() -> str:
    import pathlib

    import torch

    return (pathlib.Path(torch.__file__).parent / "include/torch/csrc/CudaIPCTypes.h").read_text()


def test_the_models_constants_are_torchs():
    header = _torch_ipc_header()
    assert f"CUDA_IPC_REF_COUNTER_FILE_SIZE = {model.SLOTS};" in header
    assert f"CUDA_IPC_WARN_AFTER_X_BLOCKS_IN_LIMBO = {model.WARN_AFTER_BLOCKS_IN_LIMBO};" in header


def test_freeing_a_sent_block_collects_the_limbo_and_a_send_does_not():
    b = model.alloc(16)
    got_b = model.rebuild_block(*model.share(b))  # received in this process
    assert b.free() == "limbo"
    got_b.free()  # the consumer lets go: nothing is collected by that
    assert model.limbo() == [b]
    c = model.alloc(16)
    got_c = model.rebuild_block(*model.share(c))  # a send collects nothing either
    assert model.limbo() == [b]
    private = model.alloc(16)
    assert private.free() == "freed" and model.limbo() == [b]  # never sent: no collection
    got_c.free()
    assert c.free() == "freed" and model.limbo() == []  # CudaIPCSentDataDelete collected b


def test_the_limbo_warns_once_when_a_block_joins_more_than_1000():
    held = []
    for _ in range(model.WARN_AFTER_BLOCKS_IN_LIMBO + 3):
        b = model.alloc(16)
        held.append((b, model.rebuild_block(*model.share(b))))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        states = [b.free() for b, _ in held]
    assert set(states) == {"limbo"}
    limbo_warnings = [w for w in caught if "tried to deallocate over 1000" in str(w.message)]
    assert len(limbo_warnings) == 1, caught  # given when the 1002nd joined 1001, then never
    for _, got in held:
        got.free()
    assert model.ipc_collect() == len(held) and model.limbo() == []


def test_a_full_counters_file_retires_when_every_slot_is_back(monkeypatch):
    monkeypatch.setattr(model, "SLOTS", 3)
    header = _torch_ipc_header()
    assert "return next_offset_ < size_;" in header  # have_offsets(): slots are never reused
    assert "used_slots_--;" in header.split("void return_offset")[1].split("}")[0]
    b = model.alloc(8)
    handles = [model.share(b) for _ in range(4)]
    first, second = handles[0].counter_handle, handles[3].counter_handle
    assert first != second and handles[3].counter_offset == 0
    got = [model.rebuild_block(*h) for h in handles]  # the cache hits release 3 of 4 at once
    got[0].free()
    assert _shm.read_refcount(first) is not None  # a slot is back when its block is freed
    assert b.free() == "freed"
    assert _shm.read_refcount(first) is None  # full, every slot handed back: closed and gone
    assert _shm.read_refcount(second) is not None  # the current file stays ...
    assert model.ipc_collect() == 0
    assert _shm.read_refcount(second) is None  # ... until ipc_collect finds no slot out
