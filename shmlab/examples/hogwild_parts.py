"""Hogwild's parts, one worker each: a shared step all see, a lost update, sparse SGD.

Mirrors: the handout's Hogwild claims (notebook 06), taken apart. ``hogwild_step_and_watch``
shows one ``optimizer.step()`` landing in every process's parameters; ``count_up`` shows the
lost-update race Hogwild accepts (and a lock fixing it); ``sparse_lstsq_sgd`` runs lock-free
SGD on a shared numpy-backed tensor, the sparse setting in which those races rarely collide.
(``hogwild.py`` is the full training example; these sit beside it to keep it short.)
"""

from __future__ import annotations

import os


def hogwild_step_and_watch(rank: int, model, x, y, lr: float, stepped, results):
    """Rank 0 takes one ``optimizer.step()`` on the batch (x, y) of the *shared* model and
    sets ``stepped``; every other rank waits for ``stepped``. Each then reports its pid, what
    identifies the memory behind each parameter (``parameter_report``) and the parameter
    values it sees: if the parameters are shared, all of them report rank 0's update.
    """
    import torch
    import torch.nn.functional as F

    from shmlab.examples.evidence import parameter_report

    torch.set_num_threads(1)
    if rank == 0:
        optimizer = torch.optim.SGD(model.parameters(), lr=lr)  # private to this process
        optimizer.zero_grad()
        F.cross_entropy(model(x), y).backward()  # the gradient is private to this process ...
        optimizer.step()  # ... the update goes into shared memory
        stepped.set()
    elif not stepped.wait(120):
        raise TimeoutError("rank 0 never stepped")
    results.put({
        "rank": rank, "pid": os.getpid(), "report": parameter_report(model),
        "values": {n: p.detach().numpy().copy() for n, p in model.named_parameters()},
    })


def count_up(counter, n: int, lock, barrier, results):
    """The lost-update race. ``counter`` is a shared tensor (torch or shmlab) of 2 integers.
    Phase 1: ``n`` times ``c[0] += 1`` with no lock. Phase 2: ``n`` times ``c[1] += 1``
    holding ``lock``. The barrier starts both phases in every process at once, so they overlap.
    """
    import time

    c = counter.numpy().reshape(-1)  # a zero-copy view of the shared memory
    barrier.wait(120)
    t0 = time.perf_counter()
    for _ in range(n):
        c[0] += 1  # read, add, write back: another process may write in between
    t1 = time.perf_counter()
    barrier.wait(120)
    t2 = time.perf_counter()
    for _ in range(n):
        with lock:  # the same three steps, now one process at a time
            c[1] += 1
    results.put({"pid": os.getpid(), "unlocked_s": t1 - t0,
                 "locked_s": time.perf_counter() - t2})


def sparse_lstsq_sgd(rank: int, w, cols, vals, y, lr: float, steps: int, seed: int,
                     go, results, record_every: int = 50):
    """Hogwild SGD with numpy on a shared ``shmlab.Tensor`` (or torch tensor) ``w``.

    The problem: minimise mean_i (x_i . w - y_i)^2 / 2, where row i of X is sparse: its
    nonzeros are ``cols[i]`` with values ``vals[i]`` (both (n, k) arrays, shared too). Each
    step takes one random row and updates only its k coordinates of ``w``, in place, with no
    lock: the sparse-update setting in which Hogwild's races rarely collide. ``go`` is an
    Event or a Barrier that starts every process at once. Reports the
    squared error seen every ``record_every`` steps (on a fixed probe of rows).
    """
    import time

    import numpy as np

    wv = w.numpy()  # the shared weight vector: every process writes into it
    C, V, Y = cols.numpy(), vals.numpy(), y.numpy()
    n = len(Y)
    rng = np.random.default_rng(seed + rank)
    probe = np.random.default_rng(seed).integers(0, n, 256)
    if go.wait(120) is False:  # an Event (False on timeout) or a Barrier (raises)
        raise TimeoutError("no go signal")
    curve, t0 = [], time.monotonic()
    for step in range(steps):
        i = rng.integers(n)
        c, v = C[i], V[i]
        r = v @ wv[c] - Y[i]  # residual of this row, reading the shared weights
        wv[c] -= lr * r * v  # write back only k coordinates: a sparse update
        if step % record_every == 0:
            err = (np.einsum("ij,ij->i", V[probe], wv[C[probe]]) - Y[probe]) ** 2
            curve.append((time.monotonic() - t0, step, float(err.mean() / 2)))
    results.put({"rank": rank, "pid": os.getpid(), "steps": steps, "curve": curve,
                 "time": time.monotonic() - t0})
