"""shmlab.tensor and shmlab.storage: the Tensor/UntypedStorage API of DESIGN.md and bad input.

Mirrors: torch.Tensor (metadata) and torch.UntypedStorage, as a learner calls them.
"""

import sys
import threading

import numpy as np
import pytest
import torch

import shmlab


# --- the public API of DESIGN.md -----------------------------------------------------------
def test_tensor_api_and_views():
    t = shmlab.tensor([[1.0, 2.0], [3.0, 4.0]])
    assert t.shape == (2, 2) and t.dtype == np.float32 and t.stride() == (2, 1)
    assert t.storage_offset() == 0 and not t.is_shared()
    col = t[1:, 0]
    assert col.untyped_storage() is t.untyped_storage()
    assert (col.storage_offset(), col.shape, col.stride()) == (2, (1,), (2,))
    col[0] = 30.0
    assert t.numpy()[1, 0] == 30.0  # a view: the write lands in t
    assert t[1, 1].shape == () and t[1, 1].item() == 4.0  # 0-d view, as torch
    fancy = t[[0, 1]]
    assert fancy.untyped_storage() is not t.untyped_storage()  # advanced indexing copies


def test_from_numpy_shares_memory_and_numpy_is_zero_copy():
    arr = np.arange(6, dtype=np.int64).reshape(2, 3)
    t = shmlab.from_numpy(arr)
    arr[0, 0] = 42
    assert t[0, 0].item() == 42
    t.numpy()[1, 2] = -1
    assert arr[1, 2] == -1
    strided = shmlab.from_numpy(arr[:, 1])  # a strided column keeps its strides
    assert strided.stride() == (3,) and strided.tolist() == [1, 4]


def test_share_memory_in_place_keeps_views_and_data():
    t = shmlab.zeros(4, 4)
    view = t[2:]
    t.numpy()[3, 3] = 7.0
    assert t.share_memory_() is t
    assert t.is_shared() and view.is_shared()
    assert view.numpy()[1, 3] == 7.0  # the data moved along
    view.numpy()[0, 0] = 5.0
    assert t.numpy()[2, 0] == 5.0  # and views follow the storage into shared memory
    s = t.untyped_storage()
    assert s.nbytes() == 64 and s.is_shared() and s.share_memory_() is s


@pytest.mark.timeout(120)
def test_slicing_while_another_thread_shares_gives_the_right_view_like_torch():
    """A Queue's feeder thread pickles, so share_memory_() can swap the buffer while the
    main thread slices the same tensor (notebook 04 does put(x[:10]); put(x[10:])). The view
    must be worked out from one buffer: a view computed against the old buffer and the new
    data_ptr() once came out with an offset of -11466804002742."""
    old_interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as CPython allows: widens the window
    try:
        for lib, make in (("torch", lambda: torch.arange(20, dtype=torch.float32)),
                          ("shmlab", lambda: shmlab.from_numpy(np.arange(20, dtype=np.float32)))):
            wrong = []
            for _ in range(200):
                x = make()
                sharer = threading.Thread(target=x.share_memory_)
                sharer.start()
                for _ in range(50):
                    v = x[10:]
                    if v.storage_offset() != 10 or float(v[0].item()) != 10.0:
                        wrong.append(v.storage_offset())
                sharer.join()
                assert x.is_shared()
            assert wrong == [], (lib, wrong[:5])
    finally:
        sys.setswitchinterval(old_interval)


def test_empty_and_zeros():
    e = shmlab.empty(2, 3, dtype=np.float64)
    assert e.shape == (2, 3) and e.untyped_storage().nbytes() == 48
    z = shmlab.zeros((0,))
    assert z.numel() == 0 and z.share_memory_().is_shared()


def test_plain_pickle_copies_like_torch_save():
    import pickle

    t = shmlab.zeros(1000)
    data = pickle.dumps(t)
    assert len(data) > 4000 and not t.is_shared()  # a copy, and no side effect
    assert pickle.loads(data).tolist() == t.tolist()


# --- bad input: a clear exception that says what to do ---------------------------------------
def test_object_dtype_is_refused_with_a_hint():
    with pytest.raises(TypeError, match="only fixed-size numbers.*astype"):
        shmlab.from_numpy(np.array([object(), 1], dtype=object))
    with pytest.raises(TypeError, match="object"):
        shmlab.tensor([{"a": 1}])


def test_negative_strides_are_refused_like_torch():
    import torch

    arr = np.arange(4.0)[::-1]
    with pytest.raises(ValueError, match="negative"):
        torch.from_numpy(arr)
    with pytest.raises(ValueError, match="negative.*copy"):
        shmlab.from_numpy(arr)
