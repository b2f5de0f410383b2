"""Checks for lab 1: reducers, tensors as (storage, offset, shape, strides), pickle size.

Mirrors: nothing in torch; the checks of torch's reducers are its own tests
(``test/test_multiprocessing.py``). Each check runs in the notebook on the learner's objects,
and in the grader's check process on proxies of them (``remote.place``): whatever must touch
the learner's objects (pickling them, loading the bytes) is a routine of this module run next
to them, and the comparisons run where the check runs (Note [The verdict outside the
learner's process]).
"""

from __future__ import annotations

import contextlib
import random
from multiprocessing.reduction import ForkingPickler

import numpy as np

import shmlab

from ..messages import tr
from .remote import place
from .report import Cases


def check_point_reducer(point_cls, reduce_point, rebuild_point, points=((3, -4.5),),
                        randomised: int = 0):
    """``points``: the coordinates tried; ``randomised``: how many more, drawn at random
    (ints up to +-2**40, so beyond 32 bits, and floats that need 64 bits, so an answer that
    only fits the examples fails)."""
    rng = random.Random()
    drawn = [(rng.randint(-2**40, 2**40), rng.uniform(-1e6, 1e6) / rng.choice((1, 3, 7e5)))
             for _ in range(randomised)]
    for xy in [*points, *drawn]:
        _check_point(point_cls, reduce_point, rebuild_point, *xy)
    if randomised:
        _check_two_points(point_cls, drawn[0], (rng.uniform(-1, 1), rng.randint(0, 99)))


def _check_point(point_cls, reduce_point, rebuild_point, x, y):
    at = place(point_cls, reduce_point)
    with Cases(tr("Exercise 1: a reducer/rebuilder pair for Point({x}, {y})", x=x, y=y)) as c:
        p = point_cls(x, y)
        reduced = reduce_point(p)
        c.check(isinstance(reduced, tuple) and len(reduced) == 2 and at.callable(reduced[0])
                and isinstance(reduced[1], tuple),
                tr("reduce_point returns (callable, args-tuple)"),
                tr("a reducer returns (rebuild_function, (arguments, ...)), like __reduce__"))
        c.check(at.run(_registered, point_cls, reduce_point) is True,
                tr("reduce_point is registered with ForkingPickler"),
                tr("a reducer is used only once ForkingPickler knows it is the one for Point"))
        data = at.run(_dumps, p)
        c.check(type(data) is bytes and b"rebuild_point" in data,
                tr("the pickle names rebuild_point: your reducer is the one used"),
                tr("a reducer that is not registered is never called"))
        back = at.run(_load_point, data, point_cls)
        c.check(back == (True, x, y), tr("a Point survives ForkingPickler.dumps/loads"),
                tr("rebuild_point(*args) must return a Point with the same x and y"))
        got = at.run_in_child(_roundtrip_in_child, data)
        c.check(got == (x, y), tr("a child process rebuilds the same Point from the bytes"),
                tr("only the rebuild function and its arguments travel"))


def _registered(point_cls, reduce_point) -> bool:
    return ForkingPickler._extra_reducers.get(point_cls) is reduce_point


def _dumps(obj) -> bytes:
    return bytes(ForkingPickler.dumps(obj))


def _load_point(data: bytes, point_cls):
    """(is it a Point, x, y) of the Point in ``data``: x and y as they are, so a value that only
    pretends to be equal (Note [Only plain data crosses], in ``wire``) stays what it is."""
    back = ForkingPickler.loads(data)
    return (type(back) is point_cls, back.x, back.y)


def _check_two_points(point_cls, a, b):
    """Two Points pickled one after the other, then loaded in the other order: each pickle
    carries its own Point (a rebuild that returns the last one reduced fails here)."""
    at = place(point_cls)
    with Cases(tr("Exercise 1: each pickle rebuilds its own Point")) as c:
        first = at.run(_dumps, point_cls(*a))
        second = at.run(_dumps, point_cls(*b))
        got = at.run_in_child(_load_both, first, second)
        c.check(got == [tuple(b), tuple(a)], tr("loaded in the other order, {b} and {a} come "
                                                "back as themselves (got {got})", b=b, a=a,
                                                got=got),
                tr("everything the receiver needs must be in the pickle: the rebuild "
                   "function's arguments, not state kept elsewhere"))


def _load_both(first: bytes, second: bytes):
    return [(p.x, p.y) for p in (ForkingPickler.loads(second), ForkingPickler.loads(first))]


def _roundtrip_in_child(data: bytes):
    p = ForkingPickler.loads(data)
    return (p.x, p.y)


class _LearnerPickler(ForkingPickler):
    """ForkingPickler with the learner's tensor reducer instead of shmlab's."""


def check_tensor_reducer(my_reduce_tensor, my_rebuild_tensor):
    at = place(my_reduce_tensor)
    at.run(_use_reducer, my_reduce_tensor)
    with Cases(tr("Exercise 2: a tensor travels as (storage, offset, shape, strides)")) as c:
        base = at.run(_arange, 3, 4)
        column = at.run(_column, base, 2)
        reduced = my_reduce_tensor(column)
        storage = base.untyped_storage()
        c.check(isinstance(reduced, tuple) and len(reduced) == 2 and at.callable(reduced[0])
                and isinstance(reduced[1], tuple) and any(a is storage for a in reduced[1]),
                tr("the reduced arguments carry the tensor's storage itself"),
                tr("pass t.untyped_storage(): its own reducer shares it (don't send "
                   "t.numpy())"))
        data = at.run(_learner_dumps, column)
        c.check(type(data) is bytes and len(data) < 1000,
                tr("the pickle is small ({n} bytes)", n=len(data)),
                tr("only metadata and a handle should travel, never the data"))
        seen = at.run_in_child(_rebuild_and_write, data)
        c.check(seen["meta"] == (2, (3,), (4,)),
                tr("the child gets offset 2, shape (3,), strides (4,): got {got}",
                   got=seen["meta"]),
                tr("the receiver needs all that places a view in its storage: where it "
                   "starts, its shape, and its step along each dimension"))
        c.check(seen["values"] == [2.0, 6.0, 10.0], tr("the child reads the column's values"))
        c.check(at.run(_element, base, 0, 2) == 100.0,
                tr("the child's write is seen by the parent"),
                tr("the rebuilt tensor must be a view of the received storage, not a copy"))
        rows = at.run(_rows)
        fn, args = my_reduce_tensor(rows)
        offset = fn(*args).storage_offset()
        c.check(offset == 3, tr("a row slice keeps its offset (3, got {got})", got=offset),
                tr("a view may start anywhere in its storage: does the receiver know where?"))
        rng = random.Random()
        shape = (rng.randint(3, 6), rng.randint(4, 7), rng.choice(_DTYPES))
        for n, view in enumerate(_random_views(*shape)):  # made here: what the child must see
            want = (view.storage_offset(), tuple(view.shape), tuple(view.stride()),
                    str(view.dtype), view.numpy().tolist())
            theirs = at.run(_random_views, *shape)[n]  # the same view, next to the reducer
            got = at.run_in_child(_rebuild_and_read, at.run(_learner_dumps, theirs))
            c.check(got == want, tr("a {dtype} view, offset {offset}, shape {shape}, strides "
                                    "{strides}, arrives as itself", dtype=str(view.dtype),
                                    offset=want[0], shape=want[1], strides=want[2])
                    + ("" if got == want else " " + tr(
                        "(got offset {offset}, shape {shape}, strides {strides}, {dtype})",
                        offset=got[0], shape=got[1], strides=got[2], dtype=got[3])),
                    tr("send every dimension's size and stride, and the dtype: a view can have "
                       "any number of dimensions, any steps and any element type"))


_DTYPES = ("float64", "int32", "int16", "uint8")


def _use_reducer(my_reduce_tensor) -> None:
    _LearnerPickler._extra_reducers = {**ForkingPickler._extra_reducers,
                                       shmlab.Tensor: my_reduce_tensor}


def _learner_dumps(tensor) -> bytes:
    return bytes(_LearnerPickler.dumps(tensor))


def _arange(rows: int, cols: int):
    return shmlab.from_numpy(np.arange(rows * cols, dtype=np.float32).reshape(rows, cols))


def _column(base, n: int):
    return base[:, n]


def _rows():
    return shmlab.zeros(2, 3)[1:]


def _element(tensor, *where) -> float:
    return float(tensor.numpy()[where])


def _random_views(rows: int, cols: int, dtype: str):
    """Two views of a rows x cols tensor of ``dtype``: a stepped slice, and its transpose."""
    base = shmlab.from_numpy((np.arange(rows * cols) % 97).astype(dtype).reshape(rows, cols))
    stepped = base[1:, ::2]
    (n, m), (sn, sm) = stepped.shape, stepped.stride()
    return [stepped, shmlab.Tensor(stepped.untyped_storage(), stepped.storage_offset(), (m, n),
                                   (sm, sn), stepped.dtype)]


def _rebuild_and_read(data: bytes):
    try:
        t = _LearnerPickler.loads(data)
        return (t.storage_offset(), tuple(t.shape), tuple(t.stride()), str(t.dtype),
                t.numpy().tolist())
    except Exception as exc:  # the learner's rebuild: a failed case, not a crash of the check
        why = f"{type(exc).__name__}: {str(exc)[:80]}"
        return (why, why, why, why, None)


def _rebuild_and_write(data: bytes):
    t = _LearnerPickler.loads(data)
    meta = (t.storage_offset(), tuple(t.shape), tuple(t.stride()))
    values = t.numpy().tolist()
    t.numpy()[0] = 100.0
    return {"meta": meta, "values": values}


def check_pickle_size(pickle_size):
    at = place(pickle_size)
    sizes = (10, 1_000_000, random.randint(2, 3_000_000))
    with Cases(tr("Exercise 3: the pickle stays the same size, whatever the tensor's size")) \
            as c:
        for n in sizes:
            got, measured = at.run(_measure, pickle_size, n)
            mine = len(ForkingPickler.dumps(shmlab.zeros(n)))  # about the size, measured here
            c.check(got in measured and type(got) is int and abs(got - mine) < 64,
                    tr("pickle_size({n}) = {got}: the length of a "
                       "ForkingPickler pickle of a {n}-element tensor "
                       "(measured: {measured})", n=f"{n:,}", got=got, measured=measured),
                    tr("build a tensor of n elements inside pickle_size, dump it, return "
                       "len() of the bytes: a number you did not measure proves nothing"))
            c.check(type(got) is int and got < 1000, tr("{n} floats pickle to {got} bytes "
                                                        "(< 1,000)", n=f"{n:,}", got=got),
                    tr("use ForkingPickler.dumps, not pickle.dumps: only it has the sharing "
                       "reducers"))


def _measure(pickle_size, n: int):
    """(what ``pickle_size(n)`` returned, the sizes of the n-element pickles it made)."""
    with _watching_pickles() as seen:
        got = pickle_size(n)
    return got, [size for numel, size in seen if numel == n]


class _Counting:
    """The file a watched ForkingPickler writes through: it counts the bytes it passes on."""

    def __init__(self, file):
        self.file, self.written = file, 0

    def write(self, data):
        self.written += len(data)
        return self.file.write(data)


@contextlib.contextmanager
def _watching_pickles():
    """Record (numel, bytes written) of every ForkingPickler dump of a tensor while inside:
    ``ForkingPickler.dumps(t)``, ``ForkingPickler(buf).dump(t)`` and
    ``multiprocessing.reduction.dump(t, buf)`` alike (they all go through ``dump``)."""
    seen = []
    real_init, real_dump = ForkingPickler.__dict__["__init__"], ForkingPickler.dump

    def __init__(self, file, *args, **kwargs):
        self._shmlab_counting = _Counting(file)
        real_init(self, self._shmlab_counting, *args, **kwargs)

    def dump(self, obj):
        counting = getattr(self, "_shmlab_counting", None)
        start = counting.written if counting else 0
        result = real_dump(self, obj)
        if counting and isinstance(obj, shmlab.Tensor):
            seen.append((obj.numel(), counting.written - start))
        return result

    ForkingPickler.__init__, ForkingPickler.dump = __init__, dump
    try:
        yield seen
    finally:
        ForkingPickler.__init__ = real_init
        del ForkingPickler.dump
