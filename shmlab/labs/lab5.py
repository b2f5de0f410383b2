"""Checks for lab 5: Hogwild training on shared parameters, and what it costs."""

from __future__ import annotations

import contextlib
import time

from .report import Cases, answer, start_child


def _setup():
    import torch

    from ..examples.data import load_digits
    from ..examples.model import accuracy, make_model

    torch.set_num_threads(1)
    return torch, load_digits(), make_model, accuracy


def _run(worker, model, data, processes: int, epochs: int, timeout: float = 120.0):
    """Start ``processes`` fork children running ``worker(rank, world, model, data, epochs)``."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("fork")  # the learner's worker lives in the notebook's __main__
    procs = [ctx.Process(target=worker, args=(r, processes, model, data, epochs), daemon=True)
             for r in range(processes)]
    start = time.perf_counter()
    for p in procs:
        p.start()
    deadline = time.monotonic() + timeout
    for p in procs:
        p.join(max(0.1, deadline - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join()
    return time.perf_counter() - start, [p.exitcode for p in procs]


def check_hogwild(train_worker):
    with Cases("Exercise 1: several processes train one shared model") as c:
        torch, data, make_model, accuracy = _setup()
        train_worker(0, 1, make_model(seed=0), data, 0)  # 0 epochs: a stub still raises here
        shard = len(data.x_train[1::2])
        seen = _rows_seen(train_worker, make_model(seed=0), data)
        c.check(seen == shard, f"one epoch of worker 1 of 2 passes once over its shard "
                f"({shard} rows; it fed the model {seen})", "each worker trains on its own "
                "share of the data, `epochs` times: the rows rank, rank + world, ...")
        model = make_model(seed=0)
        model.share_memory()
        before = [p.detach().clone() for p in model.parameters()]
        seconds, codes = _run(train_worker, model, data, processes=2, epochs=5)
        c.check(codes == [0, 0], f"both workers exited cleanly (exit codes {codes})",
                "read the child's traceback above; the worker gets (rank, world, model, data, "
                "epochs)")
        moved = any(not torch.equal(a, b) for a, b in zip(before, model.parameters(),
                                                          strict=True))
        c.check(moved, "the parent sees the parameters the children trained",
                "optimizer.step() must update the shared model's own parameters: build the "
                "optimizer from model.parameters() inside the worker, don't copy the model")
        acc = accuracy(model, data.x_test, data.y_test)
        c.check(acc >= 0.85, f"test accuracy {acc:.3f} (>= 0.85) after {seconds:.1f} s",
                "each worker should run `epochs` passes over its shard data.x_train[rank::world]")



def _rows_seen(train_worker, model, data) -> int:
    """How many rows ``train_worker(1, 2, model, data, 1)`` feeds the model, in this process."""
    import torch

    class Counting(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner, self.rows = inner, 0

        def forward(self, x):
            self.rows += x.shape[0]
            return self.inner(x)

    counting = Counting(model)
    train_worker(1, 2, counting, data, 1)
    return counting.rows


def check_baseline(baseline):
    with Cases("Exercise 2: a fresh single-process baseline") as c:
        _, data, _, accuracy = _setup()
        with _counting_models(baseline) as made:
            start = time.perf_counter()
            result = baseline()
            wall = time.perf_counter() - start
        print(f"  baseline() returned {result} in {wall:.2f} s")
        if not c.check(isinstance(result, dict) and {"seconds", "accuracy"} <= set(result),
                       "baseline() returns a dict with 'accuracy' and 'seconds'",
                       "return a dict with those two keys"):
            return
        c.check(len(made) >= 1, f"baseline() trains a fresh model (make_model called "
                f"{len(made)} time(s) inside it)", "a model built or trained before "
                "baseline() ran measures nothing: build it inside")
        accs = [accuracy(m, data.x_test, data.y_test) for m in made]
        c.check(any(abs(a - result["accuracy"]) < 1e-6 for a in accs),
                "the accuracy reported is that of the model baseline() built",
                "report accuracy(model, data.x_test, data.y_test) of the model you trained")
        c.check(result["accuracy"] >= 0.85, f"it reaches >= 0.85 test accuracy "
                f"({result['accuracy']:.3f})", "train it for 5 epochs with train_worker")
        c.check(0.5 * wall <= result["seconds"] <= wall + 0.05, f"the time reported "
                f"({result['seconds']:.2f} s) is most of what baseline() took ({wall:.2f} s), "
                "and not more", "time.perf_counter() just before and just after the training")


def check_measurement(measure):
    with Cases("Exercise 3: measure Hogwild against the baseline") as c:
        _, data, _, accuracy = _setup()
        with _counting_models(measure) as made:
            start = time.perf_counter()
            result = measure()
            wall = time.perf_counter() - start
        print(f"  measure() returned {result} in {wall:.2f} s")
        keys = {"single_seconds", "single_accuracy", "hogwild_seconds", "hogwild_accuracy"}
        if not c.check(isinstance(result, dict) and keys <= set(result),
                       f"measure() returns a dict with {sorted(keys)}",
                       "return a dict with those four keys"):
            return
        c.check(len(made) >= 2, f"measure() trains two fresh models (make_model called "
                f"{len(made)} time(s) inside it)", "a model trained before measure() ran "
                "measures nothing: run the baseline and build the shared model inside it")
        accs = [accuracy(m, data.x_test, data.y_test) for m in made]
        single = [i for i, a in enumerate(accs) if abs(a - result["single_accuracy"]) < 1e-6]
        hog = [i for i, a in enumerate(accs) if abs(a - result["hogwild_accuracy"]) < 1e-6]
        c.check(any(i != j for i in single for j in hog), "the accuracies reported are those "
                "of two different models measure() built", "report accuracy(model, "
                "data.x_test, data.y_test) of each model you trained, not numbers you wrote")
        c.check(result["single_accuracy"] >= 0.85 and result["hogwild_accuracy"] >= 0.85,
                "both reach >= 0.85 test accuracy", "both train 5 epochs; the shared one "
                "learns only if share_memory() ran before the workers started")
        spent = result["single_seconds"] + result["hogwild_seconds"]
        c.check(0.5 * wall <= spent <= wall + 0.05, f"the two times ({spent:.2f} s) are most "
                f"of what measure() took ({wall:.2f} s), and not more",
                "time each run from just before it starts to just after it ends (the "
                "processes joined)")
        if all(isinstance(result[k], (int, float)) for k in keys):
            ratio = result["single_seconds"] / max(result["hogwild_seconds"], 1e-9)
            print(f"  Hogwild took {result['hogwild_seconds']:.2f} s against "
                  f"{result['single_seconds']:.2f} s: {ratio:.2f}x; accuracy "
                  f"{result['hogwild_accuracy']:.3f} against {result['single_accuracy']:.3f}")

@contextlib.contextmanager
def _counting_models(measure):
    """Count the models built while inside: make_model as ``measure`` sees it, and the module's."""
    from ..examples import model as models

    made, real, names = [], models.make_model, measure.__globals__
    mine = names.get("make_model")

    def make_model(*args, **kwargs):
        made.append((mine or real)(*args, **kwargs))
        return made[-1]

    models.make_model = make_model
    if mine is not None:
        names["make_model"] = make_model
    try:
        yield made
    finally:
        models.make_model = real
        if mine is not None:
            names["make_model"] = mine


def check_identity(storage_identity):
    with Cases("Exercise 4: the same segment behind the parameters in every process") as c:
        torch, _, make_model, _ = _setup()
        import torch.multiprocessing as mp

        model = make_model(seed=0)
        model.share_memory()
        mine = [storage_identity(p) for p in model.parameters()]
        c.check(all(isinstance(i, tuple) and len(i) == 2 for i in mine),
                "storage_identity returns a (st_ino, st_dev) pair per parameter",
                "a shared parameter's storage has an fd (its sharing handle); what names the "
                "object behind an fd?")
        ctx = mp.get_context("fork")
        inq = ctx.Queue()
        child = start_child(_identities_from, storage_identity, inq)
        inq.put(model)  # after the fork: the child receives it, pickled, through the Queue
        try:
            theirs = answer(child, timeout=60)
        finally:
            inq.close()
            inq.join_thread()
        c.check(theirs == mine, "a child that received the model over a Queue maps the very "
                "same segments", "two fds, one object: compare inode and device, not fd numbers")
        c.check(len(set(mine)) == len(mine), "each parameter has a segment of its own")


def _identities_from(storage_identity, inq):
    """In the child: the identity of each parameter of the model that arrives on ``inq``."""
    model = inq.get(timeout=60)
    return [storage_identity(p) for p in model.parameters()]
