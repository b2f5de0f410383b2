"""Where the time goes in ``share_memory_()`` of a large tensor: its parts, timed and counted
(C12.30, C12.31).

Mirrors: THPStorage_shareFd in torch/csrc/StorageSharing.cpp, whose three steps are

    new_storage = at::new_shm_fd_storage(nbytes)   # shm_open, ftruncate, posix_fallocate, mmap,
                                                   # shm_unlink: every tmpfs page allocated now
    at::storage_copy(new_storage, storage)         # memcpy through the mapping: a page fault
                                                   # for each page it writes (GIL released)
    storage.set_data_ptr(new_storage's pointer)    # the old DataPtr dies: free() -> munmap

torch runs them in C++, so from Python they are timed *by hand*, one public call each
(``UntypedStorage._new_shared``, ``copy_``, ``del``), beside the real ``share_memory_()``; the
page faults show the two do the same work. shmlab's ``share_memory_`` is Python, so its own
parts are timed in place (``parts_of``: the functions it calls are wrapped for the length of one
call, and nothing else changes). What is timed is shown, never asserted: timings are noise on a
busy machine. What is asserted is counted: page faults, bytes allocated, bytes resident.

Every measurement runs on a fresh, fully touched tensor in this process and leaves nothing.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import time

import numpy as np

from ..harness.libs import load
from .memprobe import Clock, allocated, faults, memory, reset_peak


# --- torch: the whole call, and its three steps by hand ------------------------------------------
def _torch_tensor(nbytes: int):
    import torch

    return torch.ones(nbytes // 4)  # every page touched: a private copy really in memory


def torch_whole(nbytes: int) -> dict:
    """One ``share_memory_()``: its time and faults, and memory before, at the peak, after."""
    base = memory()
    t = _torch_tensor(nbytes)
    before, peaked = memory(), reset_peak()
    clock = Clock()
    t.share_memory_()
    clock.lap("share_memory_()")
    after = memory()
    fd = t.untyped_storage()._share_fd_cpu_()[0]  # already shared: just its fd
    return {"parts": clock.parts, "base": base, "before": before, "after": after,
            "peak": after["VmHWM"] if peaked else None, "segment": allocated(fd)}


def torch_by_hand(nbytes: int) -> dict:
    """What ``share_memory_()`` does, one public call per step, timed apart."""
    import torch

    old = [_torch_tensor(nbytes).untyped_storage()]
    clock = Clock()
    new = torch.UntypedStorage._new_shared(nbytes)  # shm_open + posix_fallocate + mmap + unlink
    clock.lap("allocate", segment=allocated(new._share_fd_cpu_()[0]))
    new.copy_(old[0])  # memcpy through the fresh mapping
    clock.lap("copy")
    old.pop()  # the last reference: free() of the private buffer
    clock.lap("free old")
    return {"parts": clock.parts}


# --- shmlab: its own share_memory_(), timed in place -------------------------------------------
# (module, attribute, part): what shmlab.storage -> _shm.unlinked -> _shm.segment call, in order.
def _shmlab_steps():
    from shmlab import storage
    from shmlab._shm import segment, unlinked

    return [(segment, "open_segment", "shm_open"), (segment, "fill", "allocate + copy"),
            (unlinked, "Mapping", "mmap"), (unlinked, "shm_unlink", "shm_unlink"),
            (storage.UntypedStorage, "_adopt", "swap, free old")]


@contextlib.contextmanager
def parts_of(steps, on_fill=None):
    """Time each (module, name, part) call while the block runs; yields {part: {s, faults}}.
    ``on_fill(fd)`` runs right after ``fill`` returns: the peak, both copies alive."""
    timed, saved = {}, [(mod, name, getattr(mod, name)) for mod, name, _ in steps]

    def wrap(real, part, name):
        def call(*args, **kwargs):
            t0, f0 = time.perf_counter(), faults()
            try:
                return real(*args, **kwargs)
            finally:
                timed[part] = {"s": time.perf_counter() - t0, "faults": faults() - f0}
                if name == "fill" and on_fill is not None:
                    timed[part].update(on_fill(args[0]))
        return call

    try:
        for (mod, name, part), (_, _, real) in zip(steps, saved, strict=True):
            setattr(mod, name, wrap(real, part, name))
        yield timed
    finally:
        for mod, name, real in saved:
            setattr(mod, name, real)


def _shmlab_tensor(nbytes: int):
    import shmlab

    return shmlab.empty(nbytes // 4).fill_(1.0)  # its own buffer, every page touched


def shmlab_parts(nbytes: int) -> dict:
    """shmlab's ``share_memory_()`` with its parts timed, and memory at the peak and after."""
    base = memory()
    t = _shmlab_tensor(nbytes)
    before, peaked = memory(), reset_peak()
    at_fill = lambda fd: {"segment": allocated(fd), "anon": memory(huge=False)["RssAnon"]}  # noqa: E731
    t0 = time.perf_counter()
    with parts_of(_shmlab_steps(), at_fill) as parts:
        t.share_memory_()
    total = time.perf_counter() - t0
    after = memory()
    fd = t.untyped_storage()._fd
    parts["rest"] = {"s": max(0.0, total - sum(p["s"] for p in parts.values())), "faults": 0}
    return {"parts": parts, "total": total, "base": base, "before": before, "after": after,
            "peak": after["VmHWM"] if peaked else None, "segment": allocated(fd)}


def shmlab_torch_way(nbytes: int) -> dict:
    """shmlab's OS layer driven torch's way: fallocate the segment, then copy through the map."""
    from shmlab import _shm

    old = [_shmlab_tensor(nbytes).numpy()]
    clock = Clock()
    fd, mapping = _shm.create_unlinked(nbytes)  # no data: posix_fallocate, as torch does
    clock.lap("allocate", segment=allocated(fd))
    np.copyto(np.frombuffer(mapping.buffer(), np.float32), old[0])
    clock.lap("copy")
    old.pop()
    clock.lap("free old")
    os.close(fd)
    return {"parts": clock.parts}


RUNS = {"torch share_memory_()": torch_whole, "torch by hand": torch_by_hand,
        "shmlab share_memory_()": shmlab_parts, "shmlab, torch's way": shmlab_torch_way}


@contextlib.contextmanager
def _file_descriptor():
    """Both libraries on the default strategy for the block (a notebook may have changed it)."""
    mps = [load(lib)[1] for lib in ("torch", "shmlab")]
    was = [mp.get_sharing_strategy() for mp in mps]
    try:
        for mp in mps:
            mp.set_sharing_strategy("file_descriptor")
        yield
    finally:
        for mp, strategy in zip(mps, was, strict=True):
            mp.set_sharing_strategy(strategy)


def measure(nbytes: int, repeats: int = 3, budget_s: float = 12.0) -> dict:
    """Every run of RUNS, interleaved, ``repeats`` times at most: no new round starts once
    ``budget_s`` seconds are spent (a busy machine gets fewer rounds, never fewer than one).
    {run: [result, ...]}; torch is imported first, so its pages are in no baseline."""
    results, start = {name: [] for name in RUNS}, time.monotonic()
    with _file_descriptor():
        for _ in range(repeats):
            for name, run in RUNS.items():
                results[name].append(run(nbytes))
            if time.monotonic() - start > budget_s:
                break
    return results


def medians(results: dict) -> dict:
    """{run: {part: (median seconds, median faults)}} over the repeats (faults: a real count,
    the lower middle one of an even number)."""
    out = {}
    for name, runs in results.items():
        parts = runs[0]["parts"]
        out[name] = {p: (statistics.median(r["parts"][p]["s"] for r in runs),
                         statistics.median_low(r["parts"][p]["faults"] for r in runs))
                     for p in parts}
    return out


def copies(results: dict, nbytes: int) -> dict:
    """Memory in copies of the tensor (median over the repeats), for both whole calls:
    "peak": both copies at once (torch: VmHWM, the segment's pages are in its RSS once copied;
    shmlab: RssAnon + the segment's pages when ``fill`` returns: pwrite maps nothing), "peak
    RSS", and after the call "private" (RssAnon), "segment" (st_blocks), "mapped" (RssShmem);
    and how much of the old private buffer was in transparent huge pages."""
    out = {}
    for lib in ("torch", "shmlab"):
        rows = []
        for r in results[f"{lib} share_memory_()"]:
            base, after = r["base"], r["after"]
            fill = r["parts"].get("allocate + copy", {})
            peak = (fill["anon"] - base["RssAnon"] + fill["segment"] if fill
                    else None if r["peak"] is None else r["peak"] - base["VmRSS"])
            rows.append({"peak": peak, "peak RSS": None if r["peak"] is None
                         else r["peak"] - base["VmRSS"],
                         "private": after["RssAnon"] - base["RssAnon"],
                         "segment": r["segment"], "mapped": after["RssShmem"] - base["RssShmem"],
                         "old in huge pages": r["before"].get("AnonHugePages", 0)
                         - base.get("AnonHugePages", 0)})
        out[lib] = {k: None if any(row[k] is None for row in rows)
                    else round(statistics.median(row[k] for row in rows) / nbytes, 2)
                    for k in rows[0]}
    return out


# What each part is drawn as: one colour per kind of work, the same in every bar.
KIND = {"allocate": "allocate", "copy": "copy", "allocate + copy": "allocate + copy",
        "free old": "free old", "swap, free old": "free old", "share_memory_()": "the whole call"}
COLORS = {"the whole call": "#937860", "allocate": "#4c72b0", "copy": "#dd8452",
          "allocate + copy": "#8172b3", "free old": "#55a868", "the rest": "#bbbbbb"}


def plot(med: dict, nbytes: int):
    """Stacked horizontal bars of the median parts, one bar per run; returns the figure.
    Parts of well under a millisecond (shm_open, mmap, shm_unlink, Python) are "the rest"."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 2.8))
    for y, parts in enumerate(med.values()):
        left = 0.0
        for part, (sec, _) in parts.items():
            kind = KIND.get(part, "the rest")
            ax.barh(y, sec * 1e3, left=left, color=COLORS[kind], edgecolor="white", label=kind)
            left += sec * 1e3
    ax.set_yticks(range(len(med)), list(med))
    ax.invert_yaxis()
    ax.set_xlabel(f"milliseconds (median of the repeats), one {nbytes // 2**20} MiB tensor")
    handles = dict(zip(*reversed(ax.get_legend_handles_labels()), strict=True))
    kinds = [k for k in COLORS if k in handles]  # the legend in COLORS' order
    ax.legend([handles[k] for k in kinds], kinds, loc="upper left", bbox_to_anchor=(1.01, 1),
              fontsize="small")
    fig.tight_layout()
    return fig
