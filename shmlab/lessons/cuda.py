"""CUDA in child processes: real-GPU workers, and the consumer table of the CPU model.

Mirrors: torch/multiprocessing/reductions.py ``reduce_tensor``/``rebuild_cuda_tensor`` on a
real GPU, and, without one, ``shmlab.models.cuda_ipc`` (a labelled model of CudaIPCTypes.cpp)
driven through ``model_commands``.
"""

from __future__ import annotations


def cuda_consumer(inq, outq, release):
    """Real CUDA (tests/core/test_cuda.py, notebook 03 on a GPU): receive a CUDA tensor, report
    its device and the IPC fields it arrived with, add 1 in place (the producer sees it),
    then hold it until ``release`` is set, report its sum again and drop it.
    """
    import torch

    t = inq.get(timeout=120)
    t += 1
    torch.cuda.synchronize()
    outq.put({"device": str(t.device), "sum": float(t.sum()), "ptr": t.data_ptr()})
    release.wait(120)
    outq.put({"sum": float(t.sum())})  # still ours even if the producer dropped its tensor
    del t
    torch.cuda.synchronize()
    outq.put("released")


def cuda_resend(inq, outq):
    """Real CUDA: try to send a received CUDA tensor on; report the error message."""
    from multiprocessing.reduction import ForkingPickler

    t = inq.get(timeout=120)
    try:
        ForkingPickler.dumps(t)
        outq.put("sent")
    except RuntimeError as exc:
        outq.put(str(exc))
    del t


def cuda_event_consumer(inq, outq):
    """Real CUDA (tests/core/test_cuda.py, notebook 18's C18.1): receive a ``torch.cuda.Event``
    (``rebuild_event`` opens its IPC handle here), make this process's current stream wait on
    it, wait for it, and report what arrived.
    """
    import torch

    event = inq.get(timeout=120)
    event.wait()  # cudaStreamWaitEvent on this process's current stream
    event.synchronize()
    outq.put({"is a torch.cuda.Event": isinstance(event, torch.cuda.Event),
              "device": str(event.device), "done": event.query()})
    del event


def pinned_receiver(inq, outq):
    """Real CUDA (tests/core/test_cuda.py, notebook 18's C18.13): receive a CPU tensor that was
    pinned in the sender; report whether it is pinned and shared here, and its values."""
    t = inq.get(timeout=120)
    outq.put({"pinned": t.is_pinned(), "shared": t.is_shared(), "values": t.tolist()})
    del t


def cuda_in_fork_child(results):
    """Real CUDA, fork start method: touch CUDA in a child forked after the parent did."""
    import torch

    try:
        torch.zeros(1, device="cuda")
        results.put("ok")
    except RuntimeError as exc:
        results.put(str(exc))


def fork_child_cuda_state(results):
    """In a child forked from a parent that may or may not have initialised CUDA: does torch
    mark this child a bad fork, and (with a GPU) does CUDA work here?"""
    import torch

    state = {"bad fork": torch.cuda._is_in_bad_fork(), "cuda": None}
    if torch.cuda.is_available():
        try:
            torch.zeros(1, device="cuda")
            state["cuda"] = "ok"
        except RuntimeError as exc:
            state["cuda"] = str(exc)
    results.put(state)


def model_commands() -> dict:
    """The command table of a ``shmlab.models.cuda_ipc`` consumer, for ``Actor`` (the
    producer is the parent). Blocks arrive pickled in the command itself (``Block.__reduce__``
    shares them) or as an ``IpcHandle`` tuple.

    ======  =================  =======================================================
    name    arguments          reply
    ======  =================  =======================================================
    recv    KEY, BLOCK|HANDLE  keep it as KEY; (handle, offset, its first 4 float32)
    write   KEY, VALUE         None; fills it with VALUE (the producer sees it)
    read    KEY                its first 4 float32
    free    KEY                what ``Block.free()`` says (the producer's counter drops)
    resend  KEY                pickle it again, as if sending it on (raises, as torch does)
    exit    -                  None; everything held is released, the model shut down
    ======  =================  =======================================================
    """
    from multiprocessing.reduction import ForkingPickler

    import numpy as np

    from shmlab.models import cuda_ipc as model

    held = {}

    def recv(key, got):
        b = got if isinstance(got, model.Block) else model.rebuild_block(*got)
        held[key] = b
        return (b.handle, b.offset, b.numpy(np.float32)[:4].tolist())

    def write(key, value):
        held[key].numpy(np.float32)[:] = value

    def exit_():
        held.clear()
        model.shutdown()  # fork/forkserver children leave with os._exit: no atexit

    return {
        "recv": recv, "write": write,
        "read": lambda key: held[key].numpy(np.float32)[:4].tolist(),
        "free": lambda key: held.pop(key).free(),
        "resend": lambda key: bytes(ForkingPickler.dumps(held[key])),
        "exit": exit_,
    }
