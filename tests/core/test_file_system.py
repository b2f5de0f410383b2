"""The file_system strategy beside torch's: segment layout, refcounts, fds, empty tensors, the
lazily started manager. Real processes, real /dev/shm files; `Family`: shmlab.testing.family.

The strategy is process-global, so this test process never changes it: each producer and
consumer sets it in its own process. The autouse fixture still puts both libraries back on
'file_descriptor' afterwards, in case a test is edited to share something here.
"""

from __future__ import annotations

import errno
import os
import re
import stat

import pytest
from support.families import LIBS

from shmlab._shm import read_refcount
from shmlab.testing.family import Family, child_managers, wait_reclaimed

P, C = "producer", "consumer"
FS, FD = "file_system", "file_descriptor"


def refcount(name: str) -> int | None:
    return read_refcount("/" + name)  # a pread of the header's 4 bytes; None once unlinked


def finish_and_reclaim(fams: dict[str, Family]) -> None:
    for fam in fams.values():
        fam.finish(P, C)
    for lib, rec in zip(fams, wait_reclaimed(list(fams.values())), strict=True):
        assert rec["files_left"] == rec["managers_left"] == [], (lib, rec)


# -- layout and refcounts -----------------------------------------------------------------------
@pytest.mark.timeout(240)
def test_segment_layout_refcounts_and_the_last_closer_unlinks_like_torch(families):
    fams = families(FS)
    seen = {}
    for lib, fam in fams.items():
        nbytes = 1000 * 4  # 1,000 float32
        fam.ask(P, "share", 1, 1000)
        segs = fam.ask(P, "share", 1, 0)["segments"]  # and an empty one
        (_, name), (_, empty) = segs
        assert re.fullmatch(rf"{lib}_{fam.pids[P]}_\d+_\d+", name), name  # <lib>_<pid>_<rand>_<n>
        st, st_empty = os.stat(f"/dev/shm/{name}"), os.stat(f"/dev/shm/{empty}")
        obs = {"size": st.st_size - nbytes, "empty_size": st_empty.st_size,
               "mode": stat.S_IMODE(st.st_mode), "counts": [refcount(name)]}
        fam.ask(P, "put")  # both tensors are in the pipe now
        obs["counts"].append(refcount(name))  # the sender holds one more while in flight
        got = fam.ask(C, "get", 2, 10)
        assert got["values"] == [1.0, None] and got["segments"] == segs  # same names
        obs["counts"].append(refcount(name))  # consumer +1, in-flight count handed over -1
        obs["shm_fds"] = [fam.ask(r, "fds")["shm"] for r in (P, C)]  # no fd kept
        fam.ask(C, "release")
        obs["counts"].append(refcount(name))
        fam.ask(P, "release")  # the last closer: unlinks at once, the manager is not needed
        obs["counts"].append(refcount(name))
        obs["empty_left"] = os.path.exists(f"/dev/shm/{empty}")
        seen[lib] = obs
    print(seen)
    assert seen["shmlab"] == seen["torch"] == {
        "size": 64, "empty_size": 64, "mode": 0o600, "counts": [1, 2, 2, 1, None],
        "shm_fds": [0, 0], "empty_left": False}
    finish_and_reclaim(fams)


# -- the manager: lazy, detached, shared by fork children, found through the pickle -------------
@pytest.mark.timeout(240)
def test_manager_is_lazy_in_its_own_session_reused_by_fork_and_spawn_children(families):
    fams = families(FS, consumer_method="spawn")
    for lib, fam in fams.items():
        assert child_managers(fam.pids[P]) == []  # strategy set, nothing shared: no manager
        (handle, _), = fam.ask(P, "share", 1, 8)["segments"]
        managers = child_managers(fam.pids[P])
        assert len(managers) == 1, (lib, managers)  # the first allocation started it
        mgr = managers[0]
        assert os.getsid(mgr) == mgr != os.getsid(0), lib  # setsid(): Ctrl-C misses it
        forked = fam.ask(P, "fork_share")  # a fork grandchild allocates: same manager
        assert forked["segments"][0][0] == handle and forked["managers"] == [], (lib, forked)
        fam.ask(P, "put")
        got = fam.ask(C, "get", 1, 30)  # a spawn child connects to the handle in the pickle
        assert got["segments"][0][0] == handle and got["own_managers"] == [], (lib, got)
        mine = fam.ask(C, "share", 1, 8)  # ...and then allocates through that manager too
        assert mine["segments"][1][0] == handle and mine["managers"] == [], (lib, mine)
        assert child_managers(fam.pids[P]) == [mgr]  # one manager for the whole family
    finish_and_reclaim(fams)


# -- fds: constant under file_system, one per tensor under file_descriptor ----------------------
N = 1000


def receive_counting(fam: Family, n: int, nofile: int | None) -> dict:
    """The consumer (a spawn child: a clean fd table) receives n tensors, holding them all."""
    counts = {"before": fam.ask(C, "limit_fds", nofile)["total"] if nofile else
              fam.ask(C, "fds")["total"]}
    fam.ask(C, "get", 1, 30)
    counts["one"] = fam.ask(C, "fds")["total"]
    fam.ask(C, "get", n - 1, 30, timeout=240)
    counts["all"] = fam.ask(C, "fds")["total"]
    counts["producer"] = fam.ask(P, "fds")["total"]
    fam.ask(C, "release")
    counts["released"] = fam.ask(C, "fds")["total"]
    return counts


@pytest.mark.timeout(240)
def test_fd_counts_for_1000_tensors_under_both_strategies_like_torch(families):
    fs, fd = families(FS, consumer_method="spawn"), families(FD, consumer_method="spawn")
    for fam in [*fs.values(), *fd.values()]:
        fam.send(P, "share", N, 4)
        fam.send(P, "put", False)  # 1,000 messages overflow the pipe: no flush
    for fam in [*fs.values(), *fd.values()]:
        fam.reply(P, 240), fam.reply(P, 240)
    counts = {}
    for lib in LIBS:
        # file_system: a receiver capped at 64 fds holds 1,000 live tensors.
        counts[lib, FS] = receive_counting(fs[lib], N, nofile=64)
        # file_descriptor: one fd per live tensor, so no cap (RLIMIT is far above 1,000 here).
        counts[lib, FD] = receive_counting(fd[lib], N, nofile=None)
    print(counts)
    for lib in LIBS:
        c = counts[lib, FS]
        assert c["all"] == c["one"] <= c["before"] + 1, (lib, c)  # flat: the manager socket
        c = counts[lib, FD]
        assert c["all"] - c["one"] == N - 1 and c["released"] <= c["before"] + 1, (lib, c)
    finish_and_reclaim(fs)
    finish_and_reclaim(fd)


@pytest.mark.timeout(240)
def test_file_descriptor_receiver_capped_at_64_fds_fails_clearly_like_torch_fails(families):
    fams = families(FD, consumer_method="spawn")
    errors = {}
    for fam in fams.values():
        fam.send(P, "share", 100, 4)
        fam.send(P, "put", False)
    for lib, fam in fams.items():
        fam.reply(P, 60), fam.reply(P, 60)
        fam.ask(C, "limit_fds", 64)
        got = fam.ask(C, "get", 100, 30, timeout=120, check=False)
        errors[lib] = got.get("error")
        assert errors[lib] is not None, f"{lib} held 100 fd-shared tensors under a 64-fd cap"
        assert 30 < len(fam.ask(C, "read")["values"]) < 64
    assert any(s in errors["torch"][1] for s in ("ancdata", "Too many open files"))
    kind, message = errors["shmlab"]
    assert kind == "OSError" and f"[Errno {errno.EMFILE}]" in message
    for needle in ("RLIMIT_NOFILE soft=64", "ulimit -n", "set_sharing_strategy('file_system')"):
        assert needle in message, message
    for fam in fams.values():
        fam.ask(C, "release")
        assert fam.ask(C, "fds")["total"] < 20  # what it held was given back
    finish_and_reclaim(fams)
