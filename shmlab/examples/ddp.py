"""Train the same MLP with torch.distributed (gloo, CPU) and DistributedDataParallel.

Where shared memory ends. Hogwild processes write into *one* copy of the parameters; DDP
processes each keep their *own* copy and never share memory. During backward(), DDP all-reduces
(averages) the gradients over the processes through the process group (gloo: TCP sockets),
so every copy takes the same step and stays identical. That works across machines too, at the
price of one collective per step. With a per-process batch of batch_size / world, a DDP step is
the same update as a single-process step on batch_size samples: synchronous, deterministic SGD.

    python -m shmlab.examples.ddp                     # run_ddp(): torch.multiprocessing.spawn
    torchrun --standalone --nproc_per_node=2 -m shmlab.examples.ddp

Mirrors: the DDP tutorial's `demo_basic` (init_process_group, DDP, destroy_process_group).

Note [A gloo rank leaves with os._exit]
Every gloo collective keeps the thread-local state of the thread that issued it. Since torch
2.12 (pytorch/pytorch#173568) `backward()` stashes the caller's `contextvars.Context` there
(autograd/graph.py, `_engine_run_backward`), so each all-reduce DDP issues during backward holds
a Python object. gloo's worker thread frees a finished work (when it holds the last reference) a
moment *after* `wait()` has returned, and that free takes the GIL. If it starts taking the GIL
just as interpreter shutdown begins, CPython up to 3.13 ends the thread with `pthread_exit`
inside a `noexcept` destructor: `std::terminate`, "terminate called without an active
exception", SIGABRT, exit code -6 (the stack of pytorch/pytorch#190489; 3.14 blocks such a
thread instead, CPython gh-87135). `destroy_process_group` does not stop gloo's threads (gloo
has no shutdown; they live while DDP's reducer holds the group). So a finished rank leaves with
`os._exit(0)` (`leave_rank`) after destroying the process group and flushing what it put on its
queue: no interpreter shutdown, nothing to race. Fork and forkserver children leave with
`os._exit` anyway; spawn children (`spawn_main` calls `sys.exit`) and torchrun ranks (the script
returns) end in a normal interpreter shutdown. Evidence: a core dump of an aborted torchrun rank
shows the gloo thread in `~AsyncAllreduceWork` freeing a `_contextvars.Context`.
"""

from __future__ import annotations

import argparse
import importlib
import os
import queue as queue_mod
import socket
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from shmlab.examples.data import load_digits
from shmlab.examples.model import (
    MetricCollector,
    TrainConfig,
    TrainResult,
    accuracy,
    make_model,
    time_to_target,
)


def worker(rank, world, cfg: TrainConfig, init_method="env://", queue=None, data=None):
    """One DDP process. Only rank 0 reports metrics; every rank reports when it is done."""
    torch.set_num_threads(1)  # `world` processes on 2 cores: no intra-op threads
    # The rendezvous: every rank connects to rank 0's TCP store, then gloo opens its sockets.
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world)
    try:
        data = data if data is not None else load_digits()  # torchrun: each rank loads its own
        model = DDP(make_model(cfg.seed))  # DDP broadcasts rank 0's weights to every rank here
        optimizer = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum)
        steps = _train(rank, world, model, optimizer, data, cfg, queue)
        msg = {"rank": rank, "done": True, "steps": steps}
        if rank == 0:  # plain numbers, not tensors: this process may exit before they are read
            msg["final_acc"] = accuracy(model.module, data.x_test, data.y_test)
            msg["state"] = {k: v.numpy().copy() for k, v in model.module.state_dict().items()}
        if queue is not None:
            queue.put(msg)
        return msg
    finally:
        dist.destroy_process_group()


def leave_rank(queue=None):
    """End this rank's process now, without interpreter shutdown: Note [A gloo rank leaves with
    os._exit]. Call it last, after `destroy_process_group`; `queue` is flushed first (os._exit
    skips the queue's feeder thread, so what was put could be lost)."""
    if queue is not None:
        queue.close()
        queue.join_thread()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def spawned_worker(rank, world, cfg, init_method, queue, data=None):
    """`mp.spawn`'s target: one rank, then `leave_rank`."""
    worker(rank, world, cfg, init_method, queue, data)
    leave_rank(queue)


def _train(rank, world, model, optimizer, data, cfg, queue):
    per_rank_batch = cfg.batch_size // world
    # Every rank must run the same number of steps: a rank that stops early would leave the
    # others waiting forever in all-reduce. So, like DistributedSampler, give each rank an
    # equal share: drop the few samples that do not divide evenly.
    n = len(data.x_train) // world * world
    gen = torch.Generator().manual_seed(cfg.seed)  # same on every rank: the same permutation
    stop = torch.zeros(1)
    dist.barrier()  # start the clock when every rank is ready
    if rank == 0 and queue is not None:
        queue.put({"rank": 0, "ready": True, "t0": time.monotonic()})
    step = 0
    for epoch in range(cfg.epochs):
        mine = torch.randperm(len(data.x_train), generator=gen)[:n][rank::world]
        for batch in mine.split(per_rank_batch):
            x, y = data.x_train[batch], data.y_train[batch]
            optimizer.zero_grad()
            logits = model(x)
            loss = F.cross_entropy(logits, y)
            loss.backward()  # DDP all-reduces the gradients during backward
            optimizer.step()  # same averaged gradient on every rank: the copies stay identical
            step += 1
            test_acc = None
            if step % cfg.eval_every == 0:
                if rank == 0:
                    test_acc = accuracy(model.module, data.x_test, data.y_test)
                    stop[0] = float(cfg.stop_at_target and test_acc >= cfg.target_accuracy)
                dist.broadcast(stop, src=0)  # all ranks must agree to stop, or they deadlock
            if rank == 0 and queue is not None:
                queue.put({"rank": 0, "step": step, "epoch": epoch, "time": time.monotonic(),
                           "samples": len(batch) * world, "loss": loss.item(),
                           "acc": (logits.argmax(dim=1) == y).float().mean().item(),
                           "test_acc": test_acc})
            if stop[0]:
                return step
    return step


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))  # the OS picks a free port; a small race, fine for a lab
        return s.getsockname()[1]


def _total_steps(n_train, world, cfg):
    per_rank = n_train // world
    return cfg.epochs * -(-per_rank // (cfg.batch_size // world))


def run_ddp(nprocs=2, epochs=10, target_accuracy=0.95, on_metric=None, *, data=None,
            progress=False, timeout=300.0, start_method="spawn", **settings) -> TrainResult:
    """Train with `nprocs` DDP processes on localhost, started by torch.multiprocessing.spawn.

    `start_method="fork"` uses `start_processes`, spawn's general form: much faster start-up
    on Linux (the children inherit the imported torch), but unsafe once CUDA is initialized.
    """
    cfg = TrainConfig(epochs=epochs, target_accuracy=target_accuracy, **settings)
    if nprocs < 1 or cfg.batch_size < nprocs:
        raise ValueError(f"need 1 <= nprocs <= batch_size, got nprocs={nprocs}")
    wall_start = time.monotonic()
    data = data if data is not None else load_digits()
    q = mp.get_context(start_method).Queue()
    init = f"tcp://127.0.0.1:{_free_port()}"
    if start_method == "fork":
        importlib.import_module("torch._dynamo")  # the optimizer needs it: import once, here
    # Under spawn, `data` goes through torch's reducers: its tensors move to shared memory.
    args = (nprocs, cfg, init, q, data)
    if start_method == "spawn":  # what the lesson shows; spawn() = start_processes("spawn")
        pc = mp.spawn(spawned_worker, args=args, nprocs=nprocs, join=False)
    else:
        pc = mp.start_processes(spawned_worker, args, nprocs, join=False,
                                start_method=start_method)
    col = MetricCollector(cfg, on_metric, _total_steps(len(data.x_train), nprocs, cfg), progress)
    done = {}
    try:
        deadline = time.monotonic() + timeout
        while len(done) < nprocs:
            try:
                msg = q.get(timeout=0.2)
            except queue_mod.Empty:
                pc.join(timeout=0)  # raises ProcessRaisedException if a worker failed
                if time.monotonic() > deadline:
                    raise TimeoutError("DDP workers did not finish in time") from None
                continue
            if msg.get("done"):
                done[msg["rank"]] = msg
            col.put(msg)
        train_end = time.monotonic()
        pc.join(timeout=max(1.0, deadline - train_end))  # they exit after destroy_process_group
    finally:
        for p in pc.processes:
            if p.is_alive():
                p.terminate()
            p.join()
        q.close()
        col.close()
    model = make_model(cfg.seed)
    model.load_state_dict({k: torch.from_numpy(v) for k, v in done[0]["state"].items()})
    return TrainResult(
        mode="ddp", processes=nprocs, target_accuracy=cfg.target_accuracy,
        time_to_target=time_to_target(col.metrics, cfg.target_accuracy),
        final_accuracy=done[0]["final_acc"], train_time=train_end - col.t0,
        wall_time=time.monotonic() - wall_start,
        samples=sum(m["samples"] for m in col.metrics), metrics=col.metrics, model=model)


def _torchrun_main(cfg):
    """Under torchrun: this process is one rank; torchrun set RANK, WORLD_SIZE, MASTER_ADDR..."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    wall_start = time.monotonic()
    col = None
    if rank == 0:  # rank 0 measures and shows the progress bar; the others just train
        steps = _total_steps(len(load_digits().x_train), world, cfg)
        col = MetricCollector(cfg, None, steps, progress=True)
    msg = worker(rank, world, cfg, "env://", queue=col)
    if col is not None:
        col.close()
        result = TrainResult(
            mode="ddp", processes=world, target_accuracy=cfg.target_accuracy,
            time_to_target=time_to_target(col.metrics, cfg.target_accuracy),
            final_accuracy=msg["final_acc"], train_time=time.monotonic() - col.t0,
            wall_time=time.monotonic() - wall_start,
            samples=sum(m["samples"] for m in col.metrics), metrics=col.metrics)
        print(result.summary(), flush=True)
    leave_rank()


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nprocs", type=int, default=2, help="processes (ignored under torchrun)")
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--target", type=float, default=0.95, help="target test accuracy")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--batch-size", type=int, default=32, help="global batch, all processes")
    p.add_argument("--stop-at-target", action="store_true")
    p.add_argument("--start-method", choices=mp.get_all_start_methods(), default="spawn",
                   help="how run_ddp starts its processes (ignored under torchrun)")
    a = p.parse_args(argv)
    cfg = TrainConfig(epochs=a.epochs, target_accuracy=a.target, lr=a.lr,
                      batch_size=a.batch_size, stop_at_target=a.stop_at_target)
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # started by torchrun
        _torchrun_main(cfg)
    else:
        result = run_ddp(a.nprocs, progress=True, start_method=a.start_method, **vars(cfg))
        print(result.summary())


if __name__ == "__main__":
    main()
