"""Checks for lab 1: reducers, tensors as (storage, offset, shape, strides), pickle size."""

from __future__ import annotations

import contextlib
from multiprocessing.reduction import ForkingPickler

import numpy as np

import shmlab

from .report import Cases, run_in_child


def check_point_reducer(point_cls, reduce_point, rebuild_point, points=((3, -4.5),)):
    """``points``: the coordinates tried (the grader tries more, by the same rules)."""
    for xy in points:
        _check_point(point_cls, reduce_point, rebuild_point, *xy)


def _check_point(point_cls, reduce_point, rebuild_point, x, y):
    with Cases(f"Exercise 1: a reducer/rebuilder pair for Point({x}, {y})") as c:
        p = point_cls(x, y)
        reduced = reduce_point(p)
        c.check(isinstance(reduced, tuple) and len(reduced) == 2 and callable(reduced[0])
                and isinstance(reduced[1], tuple),
                "reduce_point returns (callable, args-tuple)",
                "a reducer returns (rebuild_function, (arguments, ...)), like __reduce__")
        c.check(ForkingPickler._extra_reducers.get(point_cls) is reduce_point,
                "reduce_point is registered with ForkingPickler",
                "a reducer is used only once ForkingPickler knows it is the one for Point")
        data = bytes(ForkingPickler.dumps(p))
        c.check(b"rebuild_point" in data, "the pickle names rebuild_point: your reducer is "
                "the one used", "a reducer that is not registered is never called")
        back = ForkingPickler.loads(data)
        c.check(type(back) is point_cls and (back.x, back.y) == (x, y),
                "a Point survives ForkingPickler.dumps/loads",
                "rebuild_point(*args) must return a Point with the same x and y")
        got = run_in_child(_roundtrip_in_child, data)
        c.check(got == (x, y), "a child process rebuilds the same Point from the bytes",
                "only the rebuild function and its arguments travel")


def _roundtrip_in_child(data: bytes):
    p = ForkingPickler.loads(data)
    return (p.x, p.y)


class _LearnerPickler(ForkingPickler):
    """ForkingPickler with the learner's tensor reducer instead of shmlab's."""


def check_tensor_reducer(my_reduce_tensor, my_rebuild_tensor):
    _LearnerPickler._extra_reducers = {**ForkingPickler._extra_reducers,
                                       shmlab.Tensor: my_reduce_tensor}
    with Cases("Exercise 2: a tensor travels as (storage, offset, shape, strides)") as c:
        base = shmlab.from_numpy(np.arange(12, dtype=np.float32).reshape(3, 4))
        column = base[:, 2]
        reduced = my_reduce_tensor(column)
        c.check(callable(reduced[0]) and any(a is base.untyped_storage() for a in reduced[1]),
                "the reduced arguments carry the tensor's storage itself",
                "pass t.untyped_storage(): its own reducer shares it (don't send t.numpy())")
        data = bytes(_LearnerPickler.dumps(column))
        c.check(len(data) < 1000, f"the pickle is small ({len(data)} bytes)",
                "only metadata and a handle should travel, never the data")
        seen = run_in_child(_rebuild_and_write, data)
        c.check(seen["meta"] == (2, (3,), (4,)),
                f"the child gets offset 2, shape (3,), strides (4,): got {seen['meta']}",
                "the receiver needs all that places a view in its storage: where it starts, "
                "its shape, and its step along each dimension")
        c.check(seen["values"] == [2.0, 6.0, 10.0], "the child reads the column's values")
        c.check(base.numpy()[0, 2] == 100.0, "the child's write is seen by the parent",
                "the rebuilt tensor must be a view of the received storage, not a copy")
        rows = shmlab.zeros(2, 3)[1:]
        fn, args = my_reduce_tensor(rows)
        offset = fn(*args).storage_offset()
        c.check(offset == 3, f"a row slice keeps its offset (3, got {offset})",
                "a view may start anywhere in its storage: does the receiver know where?")


def _rebuild_and_write(data: bytes):
    t = _LearnerPickler.loads(data)
    meta = (t.storage_offset(), tuple(t.shape), tuple(t.stride()))
    values = t.numpy().tolist()
    t.numpy()[0] = 100.0
    return {"meta": meta, "values": values}


def check_pickle_size(pickle_size):
    with Cases("Exercise 3: the pickle stays the same size, whatever the tensor's size") as c:
        for n in (10, 1_000_000, 777):
            with _watching_dumps() as seen:
                got = pickle_size(n)
            measured = [size for numel, size in seen if numel == n]
            c.check(got in measured, f"pickle_size({n:,}) = {got}: the length of a "
                    f"ForkingPickler.dumps of a {n:,}-element tensor (measured: {measured})",
                    "build a tensor of n elements inside pickle_size, dump it, return "
                    "len() of the bytes: a number you did not measure proves nothing")
            c.check(got is not None and got < 1000, f"{n:,} floats pickle to {got} bytes "
                    "(< 1,000)", "use ForkingPickler.dumps, not pickle.dumps: only it has "
                    "the sharing reducers")


@contextlib.contextmanager
def _watching_dumps():
    """Record (numel, len(result)) of every ForkingPickler.dumps of a tensor while inside."""
    seen, real = [], ForkingPickler.__dict__["dumps"]

    def dumps(cls, obj, protocol=None):
        data = real.__func__(cls, obj, protocol)
        if isinstance(obj, shmlab.Tensor):
            seen.append((obj.numel(), len(data)))
        return data

    ForkingPickler.dumps = classmethod(dumps)
    try:
        yield seen
    finally:
        ForkingPickler.dumps = real
