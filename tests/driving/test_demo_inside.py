"""Notebook 13's demo modules: shmlab.lessons.memprobe, share_parts, empty and sharedcache.

Small sizes, real processes, real shared memory; what is asserted is counted (page faults,
bytes, objects), never timed, as in the notebook's hidden cells.
"""

from __future__ import annotations

import multiprocessing

import pytest

from shmlab.harness import holder
from shmlab.harness.actor import Actor
from shmlab.harness.libs import LIBS
from shmlab.lessons import empty, memprobe, share_parts, sharedcache

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


@pytest.mark.parametrize("lib", LIBS)
def test_shared_cache_purges_follow_the_live_count(lib):
    r = sharedcache.fill(lib, 600)
    assert r["purged at"] == [129, 259, 519] and r["limit"] == 1038
    fixed = sharedcache.fill(lib, 300, fixed=True)
    assert fixed["purged at"] == list(range(129, 301)) and fixed["limit"] == 128


def test_shared_cache_lock_after_fork():
    r = sharedcache.lock_after_fork("shmlab")
    assert r["multiprocessing child"] == {"same object": False, "acquired": True}
    assert r["os.fork() child"] == {"same object": True, "acquired": False}


@pytest.mark.parametrize("lib", LIBS)
def test_an_empty_tensor_under_each_strategy(lib):
    ctx = multiprocessing.get_context("fork")
    dataq = ctx.Queue()
    send = Actor(empty.sender, lib, dataq, ctx=ctx)
    receive = Actor(holder.commands, lib, dataq, ctx=ctx)
    try:
        fd = empty.send_empty("file_descriptor", send, receive, share_first=True)
        assert fd["pickle names"] == "rebuild_storage_empty" and fd["receiver"] == (False, 0)
        assert fd["sender after"] is True and not fd["new files"]
        fs = empty.send_empty("file_system", send, receive)
        assert fs["receiver"] == (True, 0) and list(fs["new files"].values()) == [(64, 2)]
        assert fs["receiver maps it"] == [True] and fs["files left"] == []
    finally:
        send.exit()
        receive.exit()
        dataq.close()
        dataq.join_thread()
