"""Hogwild: several processes train one model by writing SGD steps into shared parameters.

The handout's example (Q5), completed. The parent calls `model.share_memory()`, which moves
every parameter's storage to shared memory; each worker process gets the *same* storages (a
view, not a copy), builds its own optimizer and runs SGD on its own shard of the data.
`optimizer.step()` in any worker writes straight into shared memory, so every process, the
parent included, sees the update at once. There are no locks: workers may read half-updated
weights and overwrite each other's steps; Hogwild bets that sparse, small updates make these
races harmless (Recht et al., 2011).

Workers report per-step metrics through a torch.multiprocessing Queue, so a notebook can plot
one live curve per process (pass `on_metric`).

    python -m shmlab.examples.hogwild --processes 4
"""

from __future__ import annotations

import argparse
import importlib
import os
import queue as queue_mod
import time

import torch
import torch.multiprocessing as mp
import torch.nn.functional as F

from shmlab.examples.data import Digits, load_digits, shard
from shmlab.examples.evidence import mapped_file
from shmlab.examples.model import (
    MetricCollector,
    TrainConfig,
    TrainResult,
    accuracy,
    make_model,
    time_to_target,
)


def train(rank, model, data: Digits, cfg: TrainConfig, world=1, queue=None, start=None,
          stop=None, threads=1):
    """One worker: SGD with its own optimizer on shard `rank` of `world`, on the shared model."""
    # Why one thread: N workers on a 2-core machine; intra-op threads would only oversubscribe.
    torch.set_num_threads(threads)
    gen = torch.Generator().manual_seed(cfg.seed + rank)  # each process its own batch order
    # Each process has its own optimizer, so momentum buffers are private; only the
    # parameters themselves are shared.
    optimizer = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum)
    mine = shard(len(data.x_train), rank, world)
    # Evidence of sharing: the file that backs each parameter in *this* process's memory map.
    files = [mapped_file(p) for p in model.parameters()]
    queue.put({"rank": rank, "ready": True, "pid": os.getpid(), "mapped_files": files})
    # Start the clock when every worker is ready, not while some still import torch. The
    # timeout only matters if the parent died before saying "go" (see notebook 08).
    if start is not None and not start.wait(timeout=600):
        return
    step = 0
    for epoch, batch in _batches(mine, cfg, gen):
        if stop is not None and stop.is_set():
            break
        x, y = data.x_train[batch], data.y_train[batch]
        optimizer.zero_grad()
        logits = model(x)
        loss = F.cross_entropy(logits, y)
        loss.backward()  # gradients are private to this process ...
        optimizer.step()  # ... but this writes into the shared parameters
        step += 1
        queue.put({
            "rank": rank, "step": step, "epoch": epoch, "samples": len(batch),
            # CLOCK_MONOTONIC is system-wide on Linux, so the parent can compare these times.
            "time": time.monotonic(), "loss": loss.item(),
            "acc": (logits.argmax(dim=1) == y).float().mean().item(),
            "test_acc": accuracy(model, data.x_test, data.y_test)
            if step % cfg.eval_every == 0 else None,
        })
    queue.put({"rank": rank, "done": True, "steps": step})


def _batches(indices, cfg, gen):
    """(epoch, batch indices) pairs: `cfg.epochs` shuffled passes over `indices`."""
    for epoch in range(cfg.epochs):
        for batch in indices[torch.randperm(len(indices), generator=gen)].split(cfg.batch_size):
            yield epoch, batch


def _total_steps(n, world, cfg):
    return cfg.epochs * sum(-(-len(shard(n, r, world)) // cfg.batch_size) for r in range(world))


def _result(mode, processes, cfg, col, model, data, wall_start, train_end):
    return TrainResult(
        mode=mode, processes=processes, target_accuracy=cfg.target_accuracy,
        time_to_target=time_to_target(col.metrics, cfg.target_accuracy),
        final_accuracy=accuracy(model, data.x_test, data.y_test),
        train_time=train_end - col.t0, wall_time=time.monotonic() - wall_start,
        samples=sum(m["samples"] for m in col.metrics), metrics=col.metrics, model=model)


def _worker(rank, model, data, cfg, world, queue, start, stop):
    """Process entry point: run train(), and send the traceback to the parent if it fails."""
    try:
        train(rank, model, data, cfg, world, queue, start, stop)
    except BaseException:
        import traceback

        queue.put({"rank": rank, "error": traceback.format_exc()})
        raise SystemExit(1) from None  # the parent shows the traceback; don't print it twice


def run_hogwild(processes=4, epochs=10, target_accuracy=0.95, start_method=None,
                on_metric=None, *, model=None, data=None, progress=False, timeout=300.0,
                **settings) -> TrainResult:
    """Train `model` (default: a fresh MLP) with `processes` Hogwild workers; see TrainConfig."""
    if processes < 1:
        raise ValueError(f"processes must be at least 1, got {processes!r}")
    cfg = TrainConfig(epochs=epochs, target_accuracy=target_accuracy, **settings)
    wall_start = time.monotonic()
    data = data if data is not None else load_digits()
    model = model if model is not None else make_model(cfg.seed)
    model.share_memory()  # the one line that makes Hogwild work: parameters -> shared memory
    ctx = mp.get_context(start_method)  # None: torch's default (fork on Linux before 3.14)
    # Creating an optimizer imports torch._dynamo (~3 s). Import it once here: forked workers
    # inherit it instead of each importing it again, on a machine with maybe 2 cores.
    importlib.import_module("torch._dynamo")
    q, start, stop = ctx.Queue(), ctx.Event(), ctx.Event()
    procs = [ctx.Process(target=_worker, args=(r, model, data, cfg, processes, q, start, stop),
                         daemon=True, name=f"hogwild-{r}") for r in range(processes)]
    col = None
    try:
        for p in procs:
            p.start()
        deadline = time.monotonic() + timeout
        workers = {}
        while len(workers) < processes:  # wait for every worker to import torch and get its data
            msg = _get(q, procs, deadline)
            workers[msg["rank"]] = {k: msg[k] for k in ("pid", "mapped_files")}
        steps = _total_steps(len(data.x_train), processes, cfg)
        col = MetricCollector(cfg, on_metric, steps, progress, stop)
        start.set()
        while len(col.done) < processes:
            col.put(_get(q, procs, deadline))
        train_end = time.monotonic()
    finally:
        stop.set()
        _shutdown(procs, q)
        if col is not None:
            col.close()
    result = _result("hogwild", processes, cfg, col, model, data, wall_start, train_end)
    result.workers = workers
    return result


def _get(q, procs, deadline):
    """Next message from the workers; raise instead of waiting forever on a dead or slow worker."""
    while True:
        try:
            msg = q.get(timeout=0.2)
        except queue_mod.Empty:
            dead = [p for p in procs if p.exitcode not in (None, 0)]
            if dead:  # its traceback may still be in the pipe: look once more before giving up
                try:
                    msg = q.get(timeout=1.0)
                except queue_mod.Empty:
                    name, code = dead[0].name, dead[0].exitcode
                    raise RuntimeError(f"{name} exited with code {code}") from None
            elif time.monotonic() > deadline:
                raise TimeoutError("Hogwild workers did not finish in time") from None
            else:
                continue
        if msg.get("error"):
            raise RuntimeError(f"worker {msg['rank']} failed:\n{msg['error']}")
        return msg


def _shutdown(procs, q, grace=10.0):
    """Join the workers, reading what they still send: a worker blocks at exit until its queue
    data is in the pipe, so an unread, full pipe would hang it. Terminate any that hang."""
    deadline = time.monotonic() + grace
    started = [p for p in procs if p.pid is not None]  # start() of an earlier one may have raised
    while time.monotonic() < deadline:
        alive = [p for p in started if p.is_alive()]
        if not alive:
            break
        try:
            while True:
                q.get_nowait()  # discard: the run is over
        except queue_mod.Empty:
            alive[0].join(timeout=0.05)
    for p in started:
        if p.is_alive():
            p.terminate()
        p.join()
    q.close()


def run_single(epochs=10, target_accuracy=0.95, on_metric=None, *, model=None, data=None,
               progress=False, threads=1, **settings) -> TrainResult:
    """The baseline: the same train() in this process, no sharing, `threads` intra-op threads."""
    cfg = TrainConfig(epochs=epochs, target_accuracy=target_accuracy, **settings)
    wall_start = time.monotonic()
    data = data if data is not None else load_digits()
    model = model if model is not None else make_model(cfg.seed)
    col = MetricCollector(cfg, on_metric, _total_steps(len(data.x_train), 1, cfg), progress)
    saved_threads = torch.get_num_threads()
    try:
        train(0, model, data, cfg, 1, col, None, _StopAtTarget(col), threads)
    finally:
        torch.set_num_threads(saved_threads)  # train() changed it for this whole process
        col.close()
    return _result("single", 1, cfg, col, model, data, wall_start, time.monotonic())


class _StopAtTarget:
    """Event-like stop flag for the single-process run (no other process to signal)."""

    def __init__(self, col):
        self.col = col

    def is_set(self):
        m = self.col.metrics[-1] if self.col.metrics else {}
        return (self.col.cfg.stop_at_target and m.get("test_acc") is not None
                and m["test_acc"] >= self.col.cfg.target_accuracy)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--processes", type=int, default=4)
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--target", type=float, default=0.95, help="target test accuracy")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--start-method", choices=mp.get_all_start_methods(), default=None)
    p.add_argument("--no-baseline", action="store_true", help="skip the single-process run")
    a = p.parse_args(argv)
    kw = dict(epochs=a.epochs, target_accuracy=a.target, lr=a.lr, batch_size=a.batch_size)
    results = [run_hogwild(a.processes, start_method=a.start_method, progress=True, **kw)]
    if not a.no_baseline:
        results.append(run_single(progress=True, **kw))
    for r in results:
        print(r.summary())


if __name__ == "__main__":
    main()
