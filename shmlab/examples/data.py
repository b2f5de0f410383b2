"""Load scikit-learn's bundled handwritten digits as standardized float32 tensors.

The digits set (1797 8x8 images, 10 classes) ships inside scikit-learn, so the examples run
offline: nothing is downloaded. The train/test split is fixed by a seed so that Hogwild,
single-process and DDP runs are all measured on the same test images.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch


class Digits(NamedTuple):
    """Train and test tensors: x is (n, 64) float32, y is (n,) int64 class labels 0..9."""

    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor


def _read_bundled_digits() -> tuple[np.ndarray, np.ndarray]:
    """The raw digits: x (1797, 64) float32 pixel intensities 0..16, y (1797,) int64 labels."""
    # scikit-learn's load_digits() reads this CSV file. Importing sklearn costs seconds (it pulls
    # in scipy), and every worker process that loads the data would pay that again, so read the
    # file directly; find_spec() locates the package without importing it.
    spec = importlib.util.find_spec("sklearn")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("the digits ship with scikit-learn: pip install scikit-learn")
    path = Path(spec.submodule_search_locations[0], "datasets", "data", "digits.csv.gz")
    if path.exists():
        raw = np.loadtxt(path, delimiter=",", dtype=np.float32)  # 64 pixels, then the label
        return raw[:, :-1], raw[:, -1].astype(np.int64)
    from sklearn.datasets import load_digits as sklearn_load_digits  # if the file ever moves

    bunch = sklearn_load_digits()
    return bunch.data.astype(np.float32), bunch.target.astype(np.int64)


def load_digits(test_fraction: float = 0.25, seed: int = 0) -> Digits:
    """Return the digits set split into train/test, standardized with the train statistics."""
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be between 0 and 1, got {test_fraction!r}")
    x, y = _read_bundled_digits()
    order = np.random.RandomState(seed).permutation(len(x))
    n_test = int(round(len(x) * test_fraction))
    test, train = order[:n_test], order[n_test:]
    # Standardize with the *train* mean/std only, so no test information leaks into training.
    # Border pixels are always 0 in the training images: their std is 0, so divide by 1 there.
    mean = x[train].mean(axis=0)
    std = x[train].std(axis=0)
    std[std == 0] = 1.0
    x = (x - mean) / std
    return Digits(
        x_train=torch.from_numpy(x[train]),
        y_train=torch.from_numpy(y[train]),
        x_test=torch.from_numpy(x[test]),
        y_test=torch.from_numpy(y[test]),
    )


def shard(n: int, rank: int, world: int) -> torch.Tensor:
    """Indices of the rank-th of `world` disjoint, interleaved shards of range(n)."""
    if world < 1 or not 0 <= rank < world:
        raise ValueError(f"need 0 <= rank < world, got rank={rank}, world={world}")
    return torch.arange(rank, n, world)
