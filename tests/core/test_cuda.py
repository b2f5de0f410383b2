"""Real CUDA tensor sharing between processes: the behaviour shmlab.models.cuda_ipc models.

Runs only where ``torch.cuda.is_available()``; elsewhere every test is skipped with the reason.
The consumer is a ``spawn`` child (shmlab.lessons.cuda.cuda_consumer): CUDA cannot be used in a
child forked after the parent initialised it.
"""

from __future__ import annotations

import multiprocessing

import pytest
import torch
import torch.multiprocessing as mp

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.timeout(300),
    pytest.mark.skipif(
        not torch.cuda.is_available(),
        reason=f"no CUDA device (torch {torch.__version__}, CUDA build: "
        f"{torch.version.cuda or 'no'}); the CPU model is tested in test_cuda_ipc_model.py",
    ),
]

from shmlab.lessons import cuda as demo_cuda  # noqa: E402


def _stop(*procs):
    for p in procs:
        p.join(60)
        if p.is_alive():
            p.kill()
            p.join(10)


@pytest.mark.claim("C25.200")
def test_share_cuda_returns_a_handle_of_the_whole_allocation_plus_offset():
    base = torch.zeros(1024, device="cuda")
    view = base[256:]
    fields = view.untyped_storage()._share_cuda_()
    assert len(fields) == 8, fields
    device, handle, size_bytes, offset_bytes, ref_handle, ref_offset, _event, _sync = fields
    assert device == base.device.index and isinstance(handle, bytes) and handle
    assert size_bytes == base.untyped_storage().nbytes() == 4096  # the view sends its storage
    assert offset_bytes >= 0 and isinstance(ref_handle, bytes) and ref_offset >= 0
    # Nobody will receive this export: release its counter as a receiver would, so the
    # block is not left in the limbo at exit.
    torch.UntypedStorage._release_ipc_counter(ref_handle, ref_offset, device=device)
    del view, base
    torch.cuda.ipc_collect()


def test_producer_consumer_with_spawn_shared_write_and_keep_alive():
    ctx = mp.get_context("spawn")
    inq, outq, release = ctx.Queue(), ctx.Queue(), ctx.Event()
    child = ctx.Process(target=demo_cuda.cuda_consumer, args=(inq, outq, release))
    child.start()
    try:
        t = torch.zeros(4, device="cuda")
        inq.put(t)
        got = outq.get(timeout=120)
        assert got["device"].startswith("cuda") and got["sum"] == 4.0
        torch.cuda.synchronize()
        assert float(t.sum()) == 4.0  # the consumer's in-place add is in our memory
        # Drop our tensor while the consumer still holds it: the block goes to the limbo,
        # so a new allocation of the same size must not land on the consumer's bytes.
        del t
        other = torch.full((4,), 9.0, device="cuda")
        torch.cuda.synchronize()
        release.set()
        assert outq.get(timeout=120) == {"sum": 4.0}
        assert outq.get(timeout=120) == "released"
        torch.cuda.ipc_collect()
        del other
    finally:
        release.set()
        _stop(child)
    assert child.exitcode == 0


@pytest.mark.claim("C25.201")
def test_a_received_cuda_tensor_cannot_be_sent_on():
    ctx = mp.get_context("spawn")
    inq, outq = ctx.Queue(), ctx.Queue()
    child = ctx.Process(target=demo_cuda.cuda_resend, args=(inq, outq))
    child.start()
    try:
        t = torch.ones(8, device="cuda")
        inq.put(t)
        msg = outq.get(timeout=120)
        assert msg.startswith("Attempted to send CUDA tensor received from another process"), msg
    finally:
        _stop(child)
    del t
    torch.cuda.ipc_collect()


def test_a_forked_child_cannot_reinitialise_cuda():
    torch.zeros(1, device="cuda")  # initialise CUDA in this process first
    ctx = multiprocessing.get_context("fork")
    results = ctx.Queue()
    child = ctx.Process(target=demo_cuda.cuda_in_fork_child, args=(results,))
    child.start()
    try:
        msg = results.get(timeout=120)
    finally:
        _stop(child)
    assert "Cannot re-initialize CUDA in forked subprocess" in msg, msg


# Notebook 18's GPU side (its cells skip without a GPU; these check the same claims here).
@pytest.mark.claim("C18.1", "C18.2")
def test_only_an_interprocess_event_has_an_ipc_handle_and_it_pickles_as_one():
    from torch.multiprocessing import reductions

    with pytest.raises(RuntimeError):
        torch.cuda.Event().ipc_handle()  # interprocess=False: CUDA refuses
    event = torch.cuda.Event(interprocess=True)
    event.record()
    handle = event.ipc_handle()
    assert isinstance(handle, bytes) and len(handle) == 64
    rebuild, (device, sent) = reductions.reduce_event(event)
    assert rebuild is reductions.rebuild_event and device == event.device and sent == handle


@pytest.mark.claim("C18.3")
def test_each_send_carries_an_event_handle_to_wait_on():
    t = torch.ones(1024, device="cuda")
    fields = t.untyped_storage()._share_cuda_()
    event_handle, event_sync_required = fields[6], fields[7]
    assert isinstance(event_handle, bytes) and len(event_handle) == 64
    assert event_sync_required is True  # far below the 1000 live events of the header
    torch.UntypedStorage._release_ipc_counter(fields[4], fields[5], device=fields[0])
    del t
    torch.cuda.ipc_collect()


@pytest.mark.claim("C18.1")
def test_an_interprocess_event_is_opened_and_waited_on_in_a_spawn_child():
    ctx = mp.get_context("spawn")
    inq, outq = ctx.Queue(), ctx.Queue()
    child = ctx.Process(target=demo_cuda.cuda_event_consumer, args=(inq, outq))
    child.start()
    try:
        work = torch.ones(1 << 20, device="cuda")
        work.mul_(2)  # queued on this process's current stream before the event
        event = torch.cuda.Event(interprocess=True)
        event.record()
        inq.put(event)  # reduce_event: (rebuild_event, (device, ipc_handle()))
        got = outq.get(timeout=120)
    finally:
        _stop(child)
    assert child.exitcode == 0
    assert got == {"is a torch.cuda.Event": True, "device": str(event.device), "done": True}
    del work, event


@pytest.mark.claim("C18.13")
def test_a_pinned_tensor_arrives_in_a_spawn_child_shared_and_unpinned():
    ctx = mp.get_context("spawn")
    inq, outq = ctx.Queue(), ctx.Queue()
    child = ctx.Process(target=demo_cuda.pinned_receiver, args=(inq, outq))
    child.start()
    try:
        pinned = torch.ones(4).pin_memory()
        assert pinned.is_pinned() and not pinned.is_shared()
        inq.put(pinned)  # the feeder thread pickles it (_share_fd_cpu_/_share_filename_cpu_)
        got = outq.get(timeout=120)  # so it has been pickled by now
    finally:
        _stop(child)
    assert child.exitcode == 0
    assert pinned.is_shared() and not pinned.is_pinned()  # moved into /dev/shm under the sender
    assert got == {"pinned": False, "shared": True, "values": [1.0] * 4}
