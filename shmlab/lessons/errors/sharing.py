"""Sharing errors, reproduced: a tensor received after its producer died, under each strategy,
and the /dev/shm file torch leaves behind when a process and its manager are SIGKILLed.
"""

from __future__ import annotations

import os
import signal
import time

import torch
import torch.multiprocessing as torch_mp

from ... import introspect


def _produce(queue, received, keep_alive: bool) -> None:
    queue.put(torch.ones(256))
    queue.close()
    queue.join_thread()  # the pickled tensor (an fd handle or a file name) is in the pipe now
    if keep_alive:
        received.wait(30)  # the fix: the producer lives until the consumer has its copy


def late_receive(strategy: str, keep_alive: bool, remove: bool = False,
                 wait_s: float | None = None) -> str:
    """A producer puts a shared tensor on a queue; the consumer takes it ``wait_s`` s later
    (default 3 s for file_system: torch_shm_manager waits ~2 s after its last client; else 1 s).

    ``keep_alive=False``: the producer exits first. With file_descriptor the fd waited in its
    resource_sharer thread, which died with it; with file_system its torch_shm_manager, left
    without clients, unlinked the file and exited. ``remove=True``: the producer lives, but
    something else deletes its /dev/shm file meanwhile (an `rm /dev/shm/torch_*` cleaner, or
    systemd-logind's RemoveIPC): torch finds the manager but not the file.
    """
    torch_mp.set_sharing_strategy(strategy)
    ctx = torch_mp.get_context("fork")
    queue, received = ctx.Queue(), ctx.Event()
    producer = ctx.Process(target=_produce, args=(queue, received, keep_alive or remove))
    producer.start()
    if not keep_alive and not remove:
        producer.join()  # gone before anybody received: the bug
    time.sleep((3.0 if strategy == "file_system" else 1.0) if wait_s is None else wait_s)
    if remove:  # a careless cleaner; the doctor's --clean would skip a live creator's file
        for name in os.listdir(introspect.SHM_DIR):
            if name.startswith(f"torch_{producer.pid}_"):
                os.unlink(os.path.join(introspect.SHM_DIR, name))
    try:
        tensor = queue.get(timeout=30)  # rebuilding the tensor opens the producer's memory
        return f"received {tensor.sum().item():.0f} with {strategy}, producer alive: {keep_alive}"
    finally:
        received.set()
        producer.join()


def _share_and_hold(conn) -> None:
    os.setpgid(0, 0)  # our own process group, like a training job started from a shell
    torch_mp.set_sharing_strategy("file_system")
    tensor = torch.ones(1 << 18).share_memory_()  # a named /dev/shm file, 1 MiB
    name = tensor.untyped_storage()._share_filename_cpu_()[1].decode().lstrip("/")
    table = introspect.process_table()
    managers = [m.pid for m in introspect.managers(table=table) if m.ppid == os.getpid()]
    conn.send((name, managers))
    time.sleep(60)  # until SIGKILLed


def leak_by_sigkill() -> list[str]:
    """A file_system producer and its torch_shm_manager are both SIGKILLed (the OOM killer, or
    ``kill -9`` of the job): nobody is left to unlink its file. Returns the leaked names."""
    ctx = torch_mp.get_context("fork")
    recv, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_share_and_hold, args=(send,))
    proc.start()
    send.close()
    name, managers = recv.recv()
    for pid in [*managers, proc.pid]:  # the manager first: it must not get to clean up
        os.kill(pid, signal.SIGKILL)
    proc.join()
    return [name]
