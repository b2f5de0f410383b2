"""Notebook 13's probes: shmlab.lessons.memprobe and share_parts.

Small sizes, real processes, real shared memory; what is asserted is counted (page faults,
bytes, objects), never timed, as in the notebook's hidden cells. The notebook writes its four
runs itself; here one whole ``share_memory_()`` of each library feeds the module's summaries.
"""

from __future__ import annotations

import time

import pytest
import torch

import shmlab
import shmlab.multiprocessing
from shmlab import storage
from shmlab._shm import segment, unlinked
from shmlab.lessons import memprobe, share_parts

pytestmark = pytest.mark.timeout(180)
SIZE = memprobe.SMALLEST  # 32 MiB: big enough that a few stray pages are noise
# What shmlab's share_memory_() calls, in order: (module, function, the part it is), as in the
# notebook's SHMLAB_STEPS.
STEPS = [(segment, "open_segment", "shm_open"), (segment, "fill", "allocate + copy"),
         (unlinked, "Mapping", "mmap"), (unlinked, "shm_unlink", "shm_unlink"),
         (storage.UntypedStorage, "_adopt", "swap, free old")]


def test_pick_size_halves_then_gives_the_reason():
    size, why = memprobe.pick_size(wanted=64 * 2**20)
    assert size in (64 * 2**20, 32 * 2**20) and "MiB" in why
    size, why = memprobe.pick_size(wanted=2**60, smallest=2**59)
    assert size is None and why.startswith("not enough room")


def test_parts_of_puts_back_what_it_wrapped_even_when_the_call_fails():
    before = [getattr(mod, name) for mod, name, _ in STEPS]
    with pytest.raises(ZeroDivisionError), share_parts.parts_of(STEPS):
        assert [getattr(mod, name) for mod, name, _ in STEPS] != before
        raise ZeroDivisionError("the call failed")
    assert [getattr(mod, name) for mod, name, _ in STEPS] == before


def _whole(lib: str, nbytes: int) -> dict:
    """One share_memory_() of a fully touched tensor of ``lib``: its parts (shmlab's timed in
    place), memory before, after and at the peak, the segment's bytes allocated."""
    base = memprobe.memory()
    t = torch.ones(nbytes // 4) if lib == "torch" else shmlab.empty(nbytes // 4).fill_(1.0)
    before, peaked = memprobe.memory(), memprobe.reset_peak()
    if lib == "torch":
        clock = memprobe.Clock()
        t.share_memory_()
        clock.lap("share_memory_()")
        parts, fd = clock.parts, t.untyped_storage()._share_fd_cpu_()[0]
    else:
        def at_fill(fd):
            return {"segment": memprobe.allocated(fd),
                    "anon": memprobe.memory(huge=False)["RssAnon"]}

        t0 = time.perf_counter()
        with share_parts.parts_of(STEPS, at_fill) as parts:
            t.share_memory_()
        parts["rest"] = {"s": max(0.0, time.perf_counter() - t0
                                  - sum(p["s"] for p in parts.values())), "faults": 0}
        fd = t.untyped_storage()._fd
    after = memprobe.memory()
    return {"parts": parts, "base": base, "before": before, "after": after,
            "peak": after["VmHWM"] if peaked else None, "segment": memprobe.allocated(fd)}


def test_share_memory_parts_are_counted():
    mps = (torch.multiprocessing, shmlab.multiprocessing)
    was = [mp.get_sharing_strategy() for mp in mps]
    try:  # the default strategy, whatever an earlier test set: share_memory_() makes an fd
        for mp in mps:
            mp.set_sharing_strategy("file_descriptor")
        results = {f"{lib} share_memory_()": [_whole(lib, SIZE)] for lib in ("torch", "shmlab")}
    finally:
        for mp, strategy in zip(mps, was, strict=True):
            mp.set_sharing_strategy(strategy)
    few = SIZE // memprobe.PAGE / 20 + 256
    fill = results["shmlab share_memory_()"][0]["parts"]["allocate + copy"]
    assert fill["faults"] < few and fill["segment"] >= SIZE, fill  # pwrite: no page faults
    mem = share_parts.copies(results, SIZE)
    for lib, m in mem.items():
        assert m["peak"] is None or m["peak"] >= 1.75, (lib, m)
        assert m["private"] <= 0.25 and m["segment"] >= 0.99, (lib, m)
    med = share_parts.medians(results)
    assert set(med) == set(results)
    assert set(med["shmlab share_memory_()"]) == {part for _, _, part in STEPS} | {"rest"}
    share_parts.plot(med, SIZE).clf()
