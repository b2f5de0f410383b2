"""Notebook 13's probes: shmlab.lessons.memprobe and share_parts.

Small sizes, real processes, real shared memory; what is asserted is counted (page faults,
bytes, objects), never timed, as in the notebook's hidden cells.
"""

from __future__ import annotations

import pytest

from shmlab.lessons import memprobe, share_parts

pytestmark = pytest.mark.timeout(180)
SIZE = memprobe.SMALLEST  # 32 MiB: big enough that a few stray pages are noise


def test_pick_size_halves_then_gives_the_reason():
    size, why = memprobe.pick_size(wanted=64 * 2**20)
    assert size in (64 * 2**20, 32 * 2**20) and "MiB" in why
    size, why = memprobe.pick_size(wanted=2**60, smallest=2**59)
    assert size is None and why.startswith("not enough room")


def test_parts_of_puts_back_what_it_wrapped_even_when_the_call_fails():
    steps = share_parts._shmlab_steps()
    before = [getattr(mod, name) for mod, name, _ in steps]
    with pytest.raises(ZeroDivisionError), share_parts.parts_of(steps):
        assert [getattr(mod, name) for mod, name, _ in steps] != before
        raise ZeroDivisionError("the call failed")
    assert [getattr(mod, name) for mod, name, _ in steps] == before


def test_share_memory_parts_are_counted():
    results = share_parts.measure(SIZE, repeats=1)
    pages, few = SIZE // memprobe.PAGE, SIZE // memprobe.PAGE / 20 + 256
    hand = results["torch by hand"][0]["parts"]
    assert hand["allocate"]["segment"] >= SIZE and hand["allocate"]["faults"] < few
    assert hand["copy"]["faults"] >= SIZE // memprobe.shmem_page() / 2
    assert results["shmlab share_memory_()"][0]["parts"]["allocate + copy"]["faults"] < few
    mem = share_parts.copies(results, SIZE)
    for lib, m in mem.items():
        assert m["peak"] is None or m["peak"] >= 1.75, (lib, m)
        assert m["private"] <= 0.25 and m["segment"] >= 0.99, (lib, m)
    med = share_parts.medians(results)
    assert set(med) == set(share_parts.RUNS) and pages > 0
    share_parts.plot(med, SIZE).clf()
