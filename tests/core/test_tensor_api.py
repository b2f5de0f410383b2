"""Bad shapes and awkward numpy arrays: shmlab answers as torch 2.13 does, side by side.

Each test runs the same call through torch and shmlab. Where torch raises, shmlab raises the
same exception type, with a message that also says what to do; where torch warns, shmlab warns
with the same opening words.
"""

from __future__ import annotations

import sys
import warnings

import numpy as np
import pytest
import torch

import shmlab


@pytest.mark.timeout(60)
@pytest.mark.parametrize("shape", [(-1,), (-1, -1), (3, -2)])
def test_negative_dimension_is_refused_like_torch(shape):
    with pytest.raises(RuntimeError, match="non-negative"):
        torch.zeros(*shape)
    with pytest.raises(RuntimeError, match=r"negative dimension -\d.*>= 0"):
        shmlab.zeros(*shape)
    with pytest.raises(RuntimeError, match="negative dimension"):
        shmlab.empty(shape)  # the tuple form too


@pytest.mark.timeout(60)
def test_size_overflow_is_refused_like_torch_not_shared_as_zero_bytes():
    big = (1 << 32, 1 << 32)  # 2**64 bytes: int64 arithmetic wraps this to 0
    with pytest.raises(RuntimeError, match="overflowed"):
        torch.zeros(*big, dtype=torch.uint8)
    with pytest.raises(RuntimeError, match=r"overflowed with sizes=\[4294967296, 4294967296\]"):
        shmlab.zeros(*big, dtype=np.uint8)
    # One past what a process can address at all, and a product that wraps to a small number.
    with pytest.raises(RuntimeError, match="overflowed"):
        shmlab.zeros(sys.maxsize // 4 + 1, dtype=np.float64)
    with pytest.raises(RuntimeError, match="overflowed"):
        shmlab.zeros(1 << 62, 8, dtype=np.uint8)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("bad", [2.5, 2.0, True, "3", None])
def test_non_integer_size_is_refused_like_torch(bad):
    with pytest.raises(TypeError):
        torch.zeros(bad)
    with pytest.raises(TypeError, match="must be a tuple of ints"):
        shmlab.zeros(bad)
    with pytest.raises(TypeError, match="must be a tuple of ints"):
        shmlab.zeros(2, bad)


@pytest.mark.timeout(60)
def test_integer_like_sizes_still_work():
    t = shmlab.zeros(np.int64(2), 3)  # numpy integers are ints (operator.index), as in torch
    assert t.shape == (2, 3) and t.numel() == 6 and torch.zeros(np.int64(2), 3).shape == (2, 3)
    assert shmlab.zeros(0, 5).numel() == 0 and shmlab.zeros([]).shape == ()
    assert shmlab.zeros((2, 2)).shape == (2, 2)


@pytest.mark.timeout(60)
def test_from_numpy_of_a_read_only_array_warns_like_torch_and_refuses_writes():
    arr = np.arange(4.0)
    arr.flags.writeable = False
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.from_numpy(arr)
        t = shmlab.from_numpy(arr)
    opening = "The given NumPy array is not writable"
    torch_msgs = [str(w.message) for w in caught if w.category is UserWarning
                  and "PyTorch" in str(w.message)]
    ours = [str(w.message) for w in caught if w.category is UserWarning
            and "shmlab" in str(w.message)]
    # torch warns once per program: an earlier test in this process may have used it up.
    assert all(m.startswith(opening) for m in torch_msgs)
    assert len(ours) == 1 and ours[0].startswith(opening), ours
    assert "copy the array" in ours[0]
    # Better than torch's "undefined behavior": the tensor is read-only, so a write raises
    # instead of scribbling over memory numpy promised would not change.
    with pytest.raises(ValueError, match="read-only"):
        t[0] = 9.0
    with pytest.raises(ValueError, match="read-only"):
        t.fill_(1.0)
    assert arr.tolist() == [0.0, 1.0, 2.0, 3.0] and t.tolist() == arr.tolist()
    copy = t.clone()  # a copy is writable again
    copy[0] = 9.0
    assert copy.tolist()[0] == 9.0 and arr[0] == 0.0


@pytest.mark.timeout(60)
def test_a_read_only_buffer_torch_writes_into_shmlab_refuses():
    # np.frombuffer over bytes is read-only for a reason: bytes are immutable in Python.
    torch_bytes, our_bytes = bytes(range(8)), bytes(range(8))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        torch.from_numpy(np.frombuffer(torch_bytes, np.uint8))[0] = 99
        ours = shmlab.from_numpy(np.frombuffer(our_bytes, np.uint8))
    assert torch_bytes[0] == 99  # torch wrote into an immutable bytes object
    with pytest.raises(ValueError, match="read-only"):
        ours[0] = 99
    assert our_bytes[0] == 0


@pytest.mark.timeout(60)
def test_from_numpy_of_a_writable_array_does_not_warn():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        t = shmlab.from_numpy(np.arange(3.0))
    t[0] = 5.0
    assert t.tolist() == [5.0, 1.0, 2.0]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("dtype", [np.uint16, np.uint32, np.uint64])
def test_unsigned_dtypes_are_accepted_like_torch_2_13(dtype):
    arr = np.array([0, 1, np.iinfo(dtype).max], dtype=dtype)
    assert torch.from_numpy(arr).tolist() == arr.tolist()
    t = shmlab.from_numpy(arr)
    assert t.dtype == np.dtype(dtype) and t.tolist() == arr.tolist()
    z = shmlab.zeros(3, dtype=dtype)
    assert z.dtype == np.dtype(dtype) and z.tolist() == [0, 0, 0]


@pytest.mark.timeout(60)
def test_non_native_byte_order_is_named_as_such_like_torch():
    arr = np.arange(3, dtype=">f4")  # big-endian float32 on this little-endian machine
    with pytest.raises(ValueError, match="byte order different from the native"):
        torch.from_numpy(arr)
    with pytest.raises(ValueError, match="byte order") as info:
        shmlab.from_numpy(arr)
    message = str(info.value)
    assert "'>f4'" in message and "big-endian" in message  # not a bare "float32"
    assert "newbyteorder" in message or "astype" in message  # what to do instead
    with pytest.raises(ValueError, match="byte order"):
        shmlab.zeros(2, dtype=">f4")
    # The suggested fix works.
    fixed = shmlab.from_numpy(arr.astype(arr.dtype.newbyteorder("=")))
    assert fixed.tolist() == [0.0, 1.0, 2.0] and fixed.dtype == np.float32


@pytest.mark.timeout(60)
def test_the_dtype_error_lists_the_unsigned_dtypes():
    with pytest.raises(TypeError, match="uint16") as info:
        shmlab.from_numpy(np.array(["a"]))
    assert "uint64" in str(info.value) and "'<U1'" in str(info.value)


# --- the low-level constructor: a view must fit its storage (issue 26) ----------------------
# Each row goes to torch.as_strided (and Tensor.set_) and to shmlab.Tensor with the same
# numbers, over a 16-byte storage of float32 (4 elements): both must refuse.
_BAD_VIEWS = {
    "negative offset": (-1, (1,), (1,), "invalid storage offset -1.*>= 0"),
    "past the end": (0, (5,), (1,), "requiring a storage size of 20 are out of bounds for "
                     r"storage of size 16.*UntypedStorage\(20\)"),
    "offset past the end": (4, (1,), (1,), "storage offset 4.*out of bounds.*smaller offset"),
    "stride past the end": (0, (2,), (4,), "requiring a storage size of 20"),
    "negative stride": (3, (2,), (-1,), "Negative strides are not supported.*copy"),
    "negative size": (0, (-1,), (1,), "negative dimension"),
    "overflowing shape": (0, (2**62, 2**62), (1, 1), "overflowed"),
    "overflowing offset": (2**62, (1,), (1,), "overflowed"),
    "strides of another rank": (0, (2,), (1, 1), "length of strides and shape"),
}


@pytest.mark.parametrize("case", sorted(_BAD_VIEWS))
def test_a_view_outside_its_storage_is_refused_like_torch(case):
    offset, shape, strides, message = _BAD_VIEWS[case]
    with pytest.raises(RuntimeError):
        torch.as_strided(torch.empty(4), shape, strides, offset)
    storage = shmlab.UntypedStorage(16)
    with pytest.raises(RuntimeError, match=message):
        shmlab.Tensor(storage, offset, shape, strides, np.float32)


def test_a_negative_offset_is_refused_by_set_too_with_torchs_words():
    with pytest.raises(RuntimeError, match="invalid storage offset -1"):
        torch.empty(0).set_(torch.UntypedStorage(16), -1, (1,), (1,))
    with pytest.raises(RuntimeError, match="Tensor: invalid storage offset -1"):
        shmlab.Tensor(shmlab.UntypedStorage(16), -1, (1,), (1,), np.float32)


@pytest.mark.parametrize("offset, shape, strides", [
    (0, (4,), (1,)),  # exactly the storage
    (3, (1,), (1,)),  # the last element
    (0, (2, 2), (2, 1)),
    (0, (100,), (0,)),  # stride 0: every element is the first one
    (100, (0,), (1,)),  # no element: any offset, as torch allows
    (0, (0, 2**20), (1, 1)),  # no element, whatever the other dimensions
])
def test_views_inside_their_storage_and_empty_ones_work_like_torch(offset, shape, strides):
    expected = torch.as_strided(torch.arange(4.0), shape, strides, offset)
    storage = shmlab.tensor([0.0, 1.0, 2.0, 3.0]).untyped_storage()
    t = shmlab.Tensor(storage, offset, shape, strides, np.float32)
    assert t.shape == tuple(expected.shape) and t.numel() == expected.numel()
    assert t.numpy().tolist() == expected.tolist()


@pytest.mark.parametrize("bad", [1.5, "2"])
def test_a_non_integer_offset_is_refused_like_torch(bad):
    with pytest.raises(TypeError):
        torch.as_strided(torch.empty(4), (1,), (1,), bad)
    with pytest.raises(TypeError, match="storage offset must be an int"):
        shmlab.Tensor(shmlab.UntypedStorage(16), bad, (1,), (1,), np.float32)


def test_a_view_of_something_that_is_not_a_storage_is_refused():
    with pytest.raises(TypeError, match="UntypedStorage.*from_numpy"):
        shmlab.Tensor(np.zeros(16, np.uint8), 0, (4,), (1,), np.float32)


def test_a_forged_pickle_reaching_past_its_storage_fails_on_receipt():
    from multiprocessing.reduction import ForkingPickler

    from shmlab.multiprocessing import reductions

    class Forged:  # what a crafted message carries: a real storage, metadata that lies
        def __init__(self, storage, metadata):
            self.storage, self.metadata = storage, metadata

        def __reduce__(self):
            return (reductions.rebuild_tensor, (shmlab.Tensor, self.storage, self.metadata))

    storage = shmlab.tensor([1.0, 2.0, 3.0, 4.0]).untyped_storage()
    for metadata, message in [
        ((0, (1 << 20,), (1,), np.dtype("float32")), "out of bounds.*forged or corrupted"),
        ((-1, (1,), (1,), np.dtype("float32")), "invalid storage offset"),
        ((0, (2,), (-1,), np.dtype("float32")), "Negative strides"),
        ((0, (1,)), "forged or corrupted"),  # not even four fields
    ]:
        data = ForkingPickler.dumps(Forged(storage, metadata))  # shares the storage (fd)
        with pytest.raises((RuntimeError, ValueError), match=message):
            ForkingPickler.loads(data)
    with pytest.raises(TypeError, match="not a shmlab.Tensor class"):
        reductions.rebuild_tensor(dict, storage, (0, (1,), (1,), np.dtype("float32")))


def test_an_empty_view_numpy_cannot_hold_is_refused_where_torch_allows_it():
    # torch keeps sizes as int64 and lets an empty tensor have any others; numpy refuses a
    # shape whose non-zero dimensions overflow, even with a 0 among them, so shmlab says so
    # when the view is made, not at its first numpy().
    assert torch.as_strided(torch.empty(4), (0, 2**62), (1, 1), 0).numel() == 0
    with pytest.raises(RuntimeError, match="overflowed.*more bytes than a process can address"):
        shmlab.Tensor(shmlab.UntypedStorage(16), 0, (0, 2**62), (1, 1), np.float32)


def test_a_negative_step_is_refused_like_torch_instead_of_a_negative_stride_view():
    with pytest.raises(ValueError, match="step must be greater than zero"):
        torch.tensor([1.0, 2.0, 3.0])[::-1]
    with pytest.raises(ValueError, match="step must be greater than zero.*copy"):
        shmlab.tensor([1.0, 2.0, 3.0])[::-1]
    assert shmlab.tensor([1.0, 2.0, 3.0])[::2].tolist() == [1.0, 3.0]
    for lib in (torch, shmlab):
        with pytest.raises(ValueError, match="slice step cannot be zero"):
            lib.tensor([1.0, 2.0, 3.0])[::0]
