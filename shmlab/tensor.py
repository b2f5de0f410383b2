"""A tensor is a view: (storage, offset, shape, strides, dtype) over an UntypedStorage.

Mirrors: torch.Tensor's metadata (storage_offset, size, stride, dtype) and torch.from_numpy.

shmlab has no kernels of its own: ``t.numpy()`` is a zero-copy numpy view over the storage's
current bytes, and numpy does the arithmetic. Because the view is rebuilt from the storage on
every call, a tensor keeps pointing at the right memory after its storage moves to shared
memory.
"""

from __future__ import annotations

import math
import operator
import sys
import warnings

import numpy as np

from .storage import UntypedStorage

# The dtypes torch.from_numpy accepts (torch 2.13 takes the unsigned ones too), as numpy dtypes.
_SUPPORTED = {np.dtype(t) for t in (
    np.float64, np.float32, np.float16, np.complex64, np.complex128,
    np.int64, np.int32, np.int16, np.int8, np.uint64, np.uint32, np.uint16, np.uint8, np.bool_,
)}


def _check_dtype(dtype) -> np.dtype:
    dt = np.dtype(dtype)
    if dt.byteorder not in ("=", "|") and dt.newbyteorder("=") in _SUPPORTED:
        # torch refuses these with "byte order different from the native byte order". Name the
        # byte order: np.dtype(">f4").name is plain "float32", which would hide the problem.
        endian = "big" if dt.byteorder == ">" else "little"
        raise ValueError(
            f"given numpy array has byte order different from the native byte order "
            f"({dt.str!r}, {endian}-endian {dt.name}); shmlab, like torch, keeps numbers in "
            f"the machine's own order. Convert first: arr.astype(arr.dtype.newbyteorder('='))"
        )
    if dt not in _SUPPORTED:
        names = ", ".join(sorted(d.name for d in _SUPPORTED))
        raise TypeError(
            f"can't put numpy dtype {dt.name!r} ({dt.str!r}) in a shmlab tensor: only "
            f"fixed-size numbers can live in shared memory ({names}). Object arrays hold "
            "pointers into one process's heap; convert first, e.g. arr.astype(np.float64)."
        )
    return dt


def _ints(values, what: str) -> tuple[int, ...]:
    """Whole numbers, as torch takes them: anything with __index__ (numpy's too), not bool."""
    values = tuple(values)
    if all(type(n) is int for n in values):  # the usual case, and every received tensor's
        return values
    out = []
    for pos, n in enumerate(values):
        if isinstance(n, bool) or not hasattr(type(n), "__index__"):
            raise TypeError(
                f"{what} must be a tuple of ints, but element {pos} is {type(n).__name__} {n!r}; "
                "pass whole numbers, e.g. zeros(int(n)) if you meant to round down"
            )
        out.append(operator.index(n))
    return tuple(out)


def _check_shape(shape, dt: np.dtype) -> tuple[int, ...]:
    """The dimensions of zeros()/empty() as ints, refused the way torch refuses them.

    torch takes only integers (numpy's too: anything with __index__, but not bool), refuses
    a negative dimension, and refuses a byte count that overflows. Multiplying in numpy's
    int64 would wrap 2**32 * 2**32 to 0, so the product is taken in Python's unbounded ints.
    """
    dims = list(_ints(shape, "size"))
    for n in dims:
        if n < 0:
            raise RuntimeError(f"Trying to create tensor with negative dimension {n}: {dims}; "
                               "every dimension must be >= 0")
    if math.prod(dims) * dt.itemsize > sys.maxsize:
        raise RuntimeError(
            f"Storage size calculation overflowed with sizes={dims} and dtype={dt.name}: "
            f"{math.prod(dims) * dt.itemsize:,} bytes is more than a process can address"
        )
    return tuple(dims)


def _check_view(storage, offset, shape, strides, dt: np.dtype):
    """(offset, shape, strides) of a view, refused unless every element lies in ``storage``.

    torch.as_strided refuses the same inputs (the messages are as_strided's, the negative
    size's is torch.empty's, then what to do): a negative offset, one stride per dimension, no
    negative size or stride, no sum that overflows, and the last reachable byte inside the
    storage. (Tensor.set_ refuses some of them in other words, and on a resizable storage it
    grows the storage instead of refusing a view past its end.) The bytes a view needs are
    at::native::checkInBoundsForStorage's: itemsize * (offset + 1 + sum((size-1) * stride)).
    A view with no element reaches nothing, so any offset is fine for it, as in torch.
    Checked here, once, so that numpy() can never be asked to map past the storage, whether
    the numbers came from a learner or from a received pickle.
    """
    if not isinstance(storage, UntypedStorage):
        raise TypeError(f"a Tensor is a view of a shmlab.UntypedStorage, got "
                        f"{type(storage).__name__}; use shmlab.from_numpy or shmlab.tensor to "
                        "make one from data")
    if type(offset) is not int and (isinstance(offset, bool)
                                    or not hasattr(type(offset), "__index__")):
        raise TypeError(f"storage offset must be an int (elements from the start of the "
                        f"storage), got {type(offset).__name__} {offset!r}")
    offset = operator.index(offset)
    shape, strides = _ints(shape, "size"), _ints(strides, "stride")
    if offset < 0:
        raise RuntimeError(f"Tensor: invalid storage offset {offset}: the offset counts "
                           "elements from the start of the storage, so it must be >= 0")
    if len(strides) != len(shape):
        raise RuntimeError(f"mismatch in length of strides and shape: {len(strides)} strides "
                           f"{list(strides)} for {len(shape)} sizes {list(shape)}; give one "
                           "stride per dimension")
    if shape and min(shape) < 0:
        raise RuntimeError(f"Trying to create tensor with negative dimension: {list(shape)}; "
                           "every dimension must be >= 0")
    if strides and min(strides) < 0:
        raise RuntimeError(f"as_strided: Negative strides are not supported at the moment, got "
                           f"strides: {list(strides)}; shmlab, like torch, walks memory forwards "
                           "only (copy the data reversed instead)")
    size = dt.itemsize
    # numpy refuses these even for an empty view (its dimensions but the zeros, or a stride,
    # past what a process can address), so shmlab must too, where torch lets an empty one be.
    if (math.prod(n for n in shape if n) * size > sys.maxsize
            or max(strides, default=0) * size > sys.maxsize):
        raise RuntimeError(f"Storage size calculation overflowed with sizes={list(shape)} and "
                           f"strides={list(strides)}: more bytes than a process can address")
    if 0 in shape:
        return offset, shape, strides
    need = size * (offset + 1 + sum((n - 1) * st for n, st in zip(shape, strides, strict=True)))
    if need > sys.maxsize:
        raise RuntimeError(f"Storage size calculation overflowed with sizes={list(shape)} and "
                           f"strides={list(strides)}: the view would span more bytes than a "
                           "process can address")
    have = storage.nbytes()
    if need > have:
        raise RuntimeError(
            f"setStorage: sizes {list(shape)}, strides {list(strides)}, storage offset "
            f"{offset}, and itemsize {size} requiring a storage size of {need} are out of "
            f"bounds for storage of size {have}. A tensor is a view inside its storage: "
            f"give a storage of at least {need} bytes (UntypedStorage({need})), or a smaller "
            "offset, shape or strides"
        )
    return offset, shape, strides


class Tensor:
    """Metadata over a storage. Slicing returns views that share the storage."""

    def __init__(self, storage: UntypedStorage, offset: int, shape, strides, dtype):
        self._dtype = _check_dtype(dtype)
        self._storage = storage
        # offset and strides in elements, like torch's storage_offset() and stride()
        self._offset, self._shape, self._strides = _check_view(storage, offset, shape, strides,
                                                               self._dtype)

    # --- metadata, named as torch names it ------------------------------------------------
    @property
    def shape(self) -> tuple[int, ...]:
        return self._shape

    def size(self, dim: int | None = None):
        return self._shape if dim is None else self._shape[dim]

    @property
    def dtype(self) -> np.dtype:
        return self._dtype

    def stride(self, dim: int | None = None):
        return self._strides if dim is None else self._strides[dim]

    def storage_offset(self) -> int:
        return self._offset

    def element_size(self) -> int:
        return self._dtype.itemsize

    def numel(self) -> int:
        return math.prod(self._shape)  # Python ints: np.prod's int64 could wrap

    @property
    def ndim(self) -> int:
        return len(self._shape)

    def dim(self) -> int:
        return len(self._shape)

    def untyped_storage(self) -> UntypedStorage:
        return self._storage

    def data_ptr(self) -> int:
        return self._storage.data_ptr() + self._offset * self.element_size()

    # --- sharing ------------------------------------------------------------------------
    def share_memory_(self) -> Tensor:
        """Move the storage to shared memory in place (every view follows); returns self."""
        self._storage.share_memory_()
        return self

    def is_shared(self) -> bool:
        return self._storage.is_shared()

    # --- data -----------------------------------------------------------------------------
    def numpy(self) -> np.ndarray:
        """A zero-copy numpy view: writes through it are writes to the storage."""
        return self._numpy_over(self._storage._data)

    def _numpy_over(self, data: np.ndarray) -> np.ndarray:
        size = self._dtype.itemsize
        # An empty view may start anywhere (as in torch); numpy wants its start in the buffer.
        offset = self._offset * size if 0 not in self._shape else min(self._offset * size,
                                                                      data.size)
        return np.ndarray(self._shape, self._dtype, buffer=data, offset=offset,
                          strides=tuple(s * size for s in self._strides))

    def __array__(self, dtype=None, copy=None):
        arr = self.numpy()
        return arr if dtype is None else arr.astype(dtype)

    def __getitem__(self, index) -> Tensor:
        # One read of the buffer: a Queue's feeder thread may move the storage to shared
        # memory (share_memory_ swaps _data) while this view is worked out.
        data = self._storage._data
        base = self._numpy_over(data)
        if not isinstance(index, tuple):
            index = (index,)
        if any(isinstance(i, slice) and i.step == 0 for i in index):
            raise ValueError("slice step cannot be zero")  # numpy's and torch's words
        if any(isinstance(i, slice) and i.step is not None and i.step < 0 for i in index):
            # numpy would make a view with a negative stride, which no tensor may have
            raise ValueError("step must be greater than zero (as in torch); for the reverse "
                             "order, copy: shmlab.from_numpy(t.numpy()[::-1].copy())")
        if Ellipsis not in index:
            index = index + (Ellipsis,)  # keeps a full integer index a 0-d view, as torch does
        view = base[index]
        if not np.shares_memory(view, data) and view.size:
            # Advanced (fancy) indexing copies, in torch as in numpy: a new private storage.
            return from_numpy(np.ascontiguousarray(view))
        return _view_of(self._storage, view, data)

    def __setitem__(self, index, value) -> None:
        self.numpy()[index] = np.asarray(value)

    def __len__(self) -> int:
        if not self._shape:
            raise TypeError("len() of a 0-d tensor")
        return self._shape[0]

    def item(self):
        return self.numpy().item()

    def tolist(self):
        return self.numpy().tolist()

    def clone(self) -> Tensor:
        return from_numpy(np.array(self.numpy(), copy=True))

    def fill_(self, value) -> Tensor:
        self.numpy().fill(value)
        return self

    def __repr__(self) -> str:
        shared = ", shared" if self.is_shared() else ""
        return f"shmlab.tensor({self.numpy()!r}{shared})"

    def __reduce__(self):
        # Plain pickle (not ForkingPickler) copies, like torch.save: only multiprocessing's
        # pickler has the sharing reducers registered.
        return (_rebuild_plain, (self.numpy().copy(),))


def _rebuild_plain(arr: np.ndarray) -> Tensor:
    return from_numpy(arr)


def _view_of(storage: UntypedStorage, view: np.ndarray, data: np.ndarray) -> Tensor:
    """Describe a numpy view of ``data`` (the storage's buffer when the view was taken) as
    (offset, shape, strides) in elements."""
    size = view.dtype.itemsize
    start = view.__array_interface__["data"][0] - data.ctypes.data if data.size else 0
    return Tensor(storage, start // size, view.shape, [s // size for s in view.strides], view.dtype)


def from_numpy(arr: np.ndarray) -> Tensor:
    """A tensor over the ndarray's own memory (no copy), like torch.from_numpy."""
    if not isinstance(arr, np.ndarray):
        raise TypeError(f"from_numpy expects a numpy.ndarray, got {type(arr).__name__}")
    dtype = _check_dtype(arr.dtype)
    size = dtype.itemsize
    if any(s < 0 for s in arr.strides):
        raise ValueError(
            "at least one stride of the numpy array is negative, which shmlab (like torch) "
            "does not support; pass arr.copy() instead"
        )
    if any(s % size for s in arr.strides):
        raise ValueError("the array's strides are not multiples of its element size; copy it")
    # The storage spans every byte the array can reach: [first element, last element].
    reach = sum((n - 1) * s for n, s in zip(arr.shape, arr.strides, strict=True))
    span = size + reach if arr.size else 0
    lo = arr.__array_interface__["data"][0]
    if not arr.flags.writeable:
        _warn_not_writable()
    raw = np.asarray(_Span(arr, lo, span)) if span else np.zeros(0, np.uint8)
    storage = UntypedStorage._wrap(raw)
    return Tensor(storage, 0, arr.shape, [s // size for s in arr.strides], dtype)


def _warn_not_writable() -> None:
    # torch warns (once per program) and then lets writes through: "undefined behavior", and
    # a crash or silent corruption when the memory really is read-only (np.frombuffer over
    # bytes, a read-only mmap). shmlab warns with torch's opening words and keeps the tensor
    # read-only as well, so such a write raises numpy's "assignment destination is read-only".
    warnings.warn(
        "The given NumPy array is not writable, and shmlab does not support writing to "
        "non-writable tensors: this tensor is read-only (in torch, writing to it would be "
        "undefined behavior). You may want to copy the array to protect its data or make it "
        "writable before converting it to a tensor: from_numpy(arr.copy()).",
        UserWarning, stacklevel=3)


class _Span:
    """Exposes [lo, lo+span) of an array's memory as bytes, keeping the array alive."""

    def __init__(self, arr: np.ndarray, lo: int, span: int):
        self._arr = arr
        read_only = not arr.flags.writeable  # numpy views over it stay read-only too
        self.__array_interface__ = {"shape": (span,), "typestr": "|u1", "data": (lo, read_only),
                                    "version": 3}


def tensor(data, dtype=None) -> Tensor:
    """A new tensor with its own private storage, copying ``data`` (like torch.tensor)."""
    arr = np.array(data, dtype=dtype, copy=True, order="C")
    if dtype is None and arr.dtype == np.float64 and not isinstance(data, np.ndarray):
        arr = arr.astype(np.float32)  # torch's default float dtype
    return from_numpy(arr)


def empty(*shape, dtype=np.float32) -> Tensor:
    shape = shape[0] if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape
    dt = _check_dtype(dtype)
    shape = _check_shape(shape, dt)
    storage = UntypedStorage(math.prod(shape) * dt.itemsize)
    return Tensor(storage, 0, shape, _contiguous_strides(shape), dt)


def zeros(*shape, dtype=np.float32) -> Tensor:
    return empty(*shape, dtype=dtype)  # a new storage is zero-filled (np.zeros, lazily)


def _contiguous_strides(shape) -> list[int]:
    strides, acc = [], 1
    for n in reversed(shape):
        strides.append(acc)
        acc *= max(int(n), 1)
    return strides[::-1]
