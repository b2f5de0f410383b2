"""shmlab.harness.holder: the keyed commands notebooks 04 and 05 drive, on torch and on shmlab.

(The stress family's commands are exercised by test_file_system.py and test_faults.py.)
"""

from __future__ import annotations

import multiprocessing

import pytest

from shmlab.harness import holder
from shmlab.harness.actor import Actor, ActorError
from shmlab.harness.libs import LIBS

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(params=LIBS)
def pair(request):
    """A sender and a receiver holder of one library, sharing one Queue (fork children)."""
    ctx = multiprocessing.get_context("fork")
    dataq = ctx.Queue()
    both = [Actor(holder.commands, request.param, dataq, ctx=ctx) for _ in range(2)]
    yield both
    for a in both:
        a.exit()
    dataq.close()
    dataq.join_thread()


def test_tensors_sent_by_fd_arrive_as_views_of_the_senders_memory(pair):
    s, r = pair
    made = s("make", "a", 2, 4)
    assert made["first"] == 0.0 and made["nbytes"] == 16 and made["name"] is None
    assert s("send", "a") == 2
    before = r("fds")
    assert r("recv", "a", 2) == {"received": 2, "error": None}
    after = r("fds")
    assert after["recvfds_calls"] - before["recvfds_calls"] == 2  # one fd per storage
    assert after["shm"] - before["shm"] in (0, 2)  # (torch closes its fd once it has mapped)
    assert len(set(r("ptrs", "a"))) == 2
    assert r("write", "a", 5.0) == 5.0
    assert s("handle", "a")["first"] == 5.0  # the receiver wrote into the sender's memory
    assert r("drop", "a") == [] and s("drop", "a") == []


def test_a_file_system_segment_can_be_attached_by_name_alone(pair):
    s, r = pair
    assert s("strategy", "file_system") == "file_system"
    h = s("make", "b", 1, 8)
    assert h["size"] == 32 and h["name"]
    got = r("attach", "x", h["manager"], ("/" + h["name"]).encode(), h["size"])
    assert got["nbytes"] == 32
    r("write", "x", 3.0)
    assert s("handle", "b")["first"] == 3.0
    r("drop", "x")
    s("drop", "b")


def test_a_lower_fd_limit_stops_recv_and_it_says_why(pair):
    s, r = pair
    s("make", "many", 40, 4)
    low = r("fds")["total"] + 10
    assert r("nofile", low)[0] == low
    s("send", "many")
    got = r("recv", "low", 40)
    assert got["received"] < 40 and got["error"] is not None
    r("drop", "low")
    r("nofile", None)
    r("recv", "rest", 40 - got["received"] - 1)  # the one that failed is gone
    r("drop", "rest")
    with pytest.raises(ActorError, match="KeyError"):
        r("ptrs", "nothing here")
