"""What a pickled CPU tensor is, where the sharing strategy is read, and what torch's manager
frees: facts the mock interview and the glossary cite (claims in shmlab/facts/claims.json).

Mirrors: torch/multiprocessing/__init__.py and reductions.py (the strategy API, the reducers);
torch_shm_manager (its clean-up).
"""

from __future__ import annotations

import importlib
import multiprocessing
import os
import pickletools
import subprocess
import sys
import time
import uuid

import pytest
import torch.multiprocessing as tmp


@pytest.fixture
def strategy():
    """Restore the process's sharing strategy after the test."""
    before = tmp.get_sharing_strategy()
    yield tmp.set_sharing_strategy
    tmp.set_sharing_strategy(before)


def strings_and_ints(message: bytes) -> tuple[list, list]:
    args = [arg for _, arg, _ in pickletools.genops(message)]
    text = [a.decode() if isinstance(a, bytes) else a for a in args if isinstance(a, (str, bytes))]
    return text, [a for a in args if isinstance(a, int) and not isinstance(a, bool)]


PICKLE = """
import json, sys, torch, torch.multiprocessing as mp
from multiprocessing.reduction import ForkingPickler
mp.set_sharing_strategy(sys.argv[1])
base = torch.zeros(1000, 1000)
view = base[1:, ::2]  # offset 1000, shape (999, 500), strides (1000, 2)
message = bytes(ForkingPickler.dumps(view))
ForkingPickler.loads(message)  # received: under file_system its in-flight count goes back
print(message.hex())
"""


def run(code: str, *args: str) -> str:
    """Run code in a fresh interpreter (a file_system manager goes with its last client)."""
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout


@pytest.mark.timeout(150)
@pytest.mark.claim("C25.100")
@pytest.mark.parametrize("name, rebuild, handle", [
    ("file_descriptor", "rebuild_storage_fd", "DupFd"),
    ("file_system", "rebuild_storage_filename", "manager.sock")])
def test_a_pickled_tensor_is_how_to_rebuild_it(name, rebuild, handle):
    message = bytes.fromhex(run(PICKLE, name).strip())
    text, ints = strings_and_ints(message)
    assert len(message) < 1000  # 4 MB of data, a few hundred bytes of message
    for word in ("rebuild_tensor", "rebuild_typed_storage", rebuild, "float32", "Size"):
        assert word in text, (word, text)
    assert any(handle in s for s in text), text
    if name == "file_system":
        assert any(s.startswith("/torch_") for s in text), text  # the segment's name
    for number in (4_000_000, 1000, 999, 500, 2):  # bytes, offset, shape, strides
        assert number in ints, (number, ints)
    assert b"\x89" in message  # NEWFALSE: requires_grad


FIRST_PICKLE = """
import sys, torch, torch.multiprocessing as mp
from multiprocessing.reduction import ForkingPickler
mp.set_sharing_strategy(sys.argv[1])
t = torch.zeros(1_000_000)
before, shared_before = t.data_ptr(), t.is_shared()
first = bytes(ForkingPickler.dumps(t))
moved = t.data_ptr()
second = bytes(ForkingPickler.dumps(t))
for message in (first, second):  # received, so nothing stays in flight
    ForkingPickler.loads(message)
print(shared_before, t.is_shared(), moved != before, t.data_ptr() == moved)
"""


@pytest.mark.timeout(150)
@pytest.mark.claim("C25.101")
@pytest.mark.parametrize("name", ["file_descriptor", "file_system"])
def test_the_first_pickle_moves_the_storage_to_shared_memory_once(name):
    # not shared, then shared; the first pickle moved it; the second copied nothing
    assert run(FIRST_PICKLE, name).split() == ["False", "True", "True", "True"]


@pytest.mark.claim("C25.301")
def test_import_torch_alone_registers_the_reducers():
    code = ("import sys\nfrom multiprocessing.reduction import ForkingPickler as P\n"
            "before = dict(P._extra_reducers)\nimport torch\n"
            "print(any(c.__module__.startswith('torch') for c in before), "
            "torch.Tensor in P._extra_reducers, torch.UntypedStorage in P._extra_reducers, "
            "'torch.multiprocessing' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.stdout.split() == ["False", "True", "True", "True"], out.stderr


@pytest.mark.claim("C25.106")
def test_torch_multiprocessing_has_the_names_but_not_the_submodules():
    assert tmp.Process is multiprocessing.Process and tmp.Queue is multiprocessing.Queue
    for sub in ("shared_memory", "managers", "connection", "util"):
        importlib.import_module(f"multiprocessing.{sub}")
        with pytest.raises(ImportError):
            importlib.import_module(f"torch.multiprocessing.{sub}")
    for sub in ("pool", "queue"):
        assert importlib.import_module(f"torch.multiprocessing.{sub}").__file__.startswith(
            os.path.dirname(tmp.__file__))


RECEIVER = """
import multiprocessing, sys, torch, torch.multiprocessing as mp
def receive(name, q, done):
    mp.set_sharing_strategy(name)
    t = q.get(timeout=30)
    t.fill_(7.0)
    done.put((mp.get_sharing_strategy(), t.is_shared()))
if __name__ == "__main__":
    sender, receiver = sys.argv[1:]
    mp.set_sharing_strategy(sender)
    ctx = multiprocessing.get_context("fork")
    q, done = ctx.Queue(), ctx.Queue()
    child = ctx.Process(target=receive, args=(receiver, q, done))
    child.start()
    t = torch.zeros(1000)
    q.put(t)
    seen = done.get(timeout=60)
    child.join(60)
    print(seen[0], seen[1], bool((t == 7.0).all()), child.exitcode)
"""


@pytest.mark.timeout(150)
@pytest.mark.claim("C25.117")
@pytest.mark.parametrize("sender, receiver", [("file_system", "file_descriptor"),
                                              ("file_descriptor", "file_system")])
def test_the_receivers_strategy_does_not_matter(sender, receiver):
    # the receiver rebuilds with its own strategy set to the other one, and its write is seen
    assert run(RECEIVER, sender, receiver).split() == [receiver, "True", "True", "0"]


@pytest.mark.timeout(120)
@pytest.mark.claim("C25.120", "C25.119")
def test_a_bad_name_raises_assertionerror_and_the_set_is_torchs_own(strategy):
    with pytest.raises(AssertionError, match="file_descriptor|file_system"):
        tmp.set_sharing_strategy("shared_memory")
    code = ("import torch.multiprocessing as m\ntry:\n    m.set_sharing_strategy('bogus')\n"
            "except AssertionError as e:\n    print('refused', e)\n")
    out = subprocess.run([sys.executable, "-O", "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.stdout.startswith("refused invalid sharing strategy 'bogus'"), out.stderr
    everything = tmp.get_all_sharing_strategies()
    assert everything is tmp.get_all_sharing_strategies()  # not a copy
    everything.add("mine")
    try:
        tmp.set_sharing_strategy("mine")
        assert tmp.get_sharing_strategy() == "mine"
    finally:
        everything.discard("mine")
        tmp.set_sharing_strategy("file_descriptor")


COUNTS = """
import struct, torch, torch.multiprocessing as mp
from multiprocessing.reduction import ForkingPickler
mp.set_sharing_strategy("file_system")
t = torch.zeros(1000).share_memory_()
path = "/dev/shm" + t.untyped_storage()._share_filename_cpu_()[1].decode()
def count():
    with open(path, "rb") as f:
        return struct.unpack("<i", f.read(4))[0]
seen = [count()]
first, second = bytes(ForkingPickler.dumps(t)), bytes(ForkingPickler.dumps(t))
seen.append(count())
back = ForkingPickler.loads(first)
seen.append(count())
again = ForkingPickler.loads(second)
seen.append(count())
print(*seen)
"""


@pytest.mark.timeout(150)
@pytest.mark.claim("C25.208")
def test_file_system_counts_each_message_in_flight():
    # created: 1; two messages in flight: 3; each receive gives its message's 1 back
    assert run(COUNTS).split() == ["1", "3", "2", "1"]


LEAKER = """
import os, sys, torch, torch.multiprocessing as mp
mp.set_sharing_strategy("file_system")
t = torch.zeros(1000).share_memory_()
print(t.untyped_storage()._share_filename_cpu_()[1].decode(), flush=True)
os._exit(0)  # no destructor runs: the refcount is never given back
"""


@pytest.mark.timeout(120)
@pytest.mark.claim("C25.410")
def test_the_manager_frees_what_was_registered_and_nothing_else():
    stranger = f"/dev/shm/torch_{os.getpid()}_{uuid.uuid4().int % 10**9}_0"
    with open(stranger, "wb") as f:
        f.write(b"\0" * 64)
    try:
        out = subprocess.run([sys.executable, "-c", LEAKER], capture_output=True, text=True,
                             timeout=60)
        leaked = "/dev/shm" + out.stdout.strip()
        assert out.stdout.startswith("/torch_"), out.stderr
        deadline = time.monotonic() + 30
        while os.path.exists(leaked) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not os.path.exists(leaked), "the manager did not free the registered segment"
        assert os.path.exists(stranger)  # never registered: never touched
    finally:
        os.unlink(stranger)
