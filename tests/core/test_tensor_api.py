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
