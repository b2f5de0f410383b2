"""Forged sizes, failed mmaps and damaged headers: the OS layer refuses them and leaks nothing.

Every case uses real files in /dev/shm, and a child process wherever the failure is a signal
or torch's behaviour is shown beside ours. torch's RefcountedMapAllocator maps first and then
counts itself in through the mapping, and it grows a file that is too small. shmlab also
counts itself in only after mapping, but refuses a file that does not hold what the message
claims, and says why, so nothing here can leave a count or a file behind. (Files that are not
ours at all, symlinks and other users' files, and a tmpfs out of inodes: test_shm_trust.py.)
"""

from __future__ import annotations

import json
import os
import signal
import struct
import subprocess
import sys
import textwrap

import pytest

import shmlab
from shmlab import _shm
from shmlab._shm import HEADER_SIZE, SHM_DIR, read_refcount

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(shmlab.__file__)))


def run_child(code: str, *args: str, timeout: float = 60) -> tuple[int, dict, str]:
    """Run `code` in a fresh interpreter; it prints one JSON line. (rc, that dict, stderr)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get(
        "PYTHONPATH")])))
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args],
                          capture_output=True, text=True, timeout=timeout, env=env)
    lines = proc.stdout.strip().splitlines()
    return proc.returncode, (json.loads(lines[-1]) if lines else {}), proc.stderr


def our_name(tag: str = "t") -> str:
    """A fresh segment name of this process (the leak checker watches it)."""
    return _shm.new_name() + tag


def make_file(name: str, data: bytes) -> str:
    """A raw /dev/shm file with exactly `data` in it (a forged or damaged segment)."""
    path = SHM_DIR + name
    with open(path, "wb") as f:
        f.write(data)
    os.chmod(path, 0o600)
    return path


def unlink_quietly(*paths: str) -> None:
    for path in paths:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


# -- attach: count in only after mapping; refuse bad sizes and bad headers ------------------------
ATTACH_UNDER_RLIMIT_AS = r'''
    import json, resource, struct, sys
    lib, size = sys.argv[1], 32 << 20
    if lib == "torch":
        import torch, torch.multiprocessing as mp
        mp.set_sharing_strategy("file_system")
        storage = torch.zeros(size // 4).share_memory_().untyped_storage()
        manager, handle, _ = storage._share_filename_cpu_()
        attach = lambda: torch.UntypedStorage._new_shared_filename_cpu(manager, handle, size)
        name = handle.decode()
    else:
        from shmlab import _shm
        name = _shm.new_name()
        keep = _shm.create_refcounted(name, size)
        attach = lambda: _shm.attach_refcounted(name, size)
    count = lambda: struct.unpack("<i", open("/dev/shm" + name, "rb").read(4))[0]
    before = count()
    vm = int(next(l for l in open("/proc/self/status") if l.startswith("VmSize")).split()[1])
    limit = vm * 1024 + (16 << 20)  # room for Python, not for another 32 MiB mapping
    resource.setrlimit(resource.RLIMIT_AS, (limit, resource.RLIM_INFINITY))
    try:
        attach()
        error = None
    except Exception as exc:
        error = [type(exc).__name__, str(exc)[:200]]
    resource.setrlimit(resource.RLIMIT_AS, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    print(json.dumps({"before": before, "after": count(), "error": error}))
    if lib == "shmlab":
        _shm.decref(name)  # our one real count: the file goes (torch's goes with its storage)
'''


@pytest.mark.timeout(120)
@pytest.mark.parametrize("lib", ["torch", "shmlab"])
def test_a_failed_mmap_leaves_the_refcount_alone_like_torch(lib):
    rc, out, err = run_child(ATTACH_UNDER_RLIMIT_AS, lib)
    assert rc == 0, err[-2000:]
    print(lib, out)
    assert out["error"] is not None, out  # mmap of 32 MiB failed under RLIMIT_AS...
    assert "Cannot allocate memory" in out["error"][1] or "ENOMEM" in out["error"][1], out
    assert out["after"] == out["before"] == 1, out  # ...and nobody counted itself in


@pytest.mark.timeout(60)
@pytest.mark.parametrize("size", [-5, -100, -(1 << 40), 1.5, True, None])
def test_a_forged_size_is_refused_before_counting(size):
    name = _shm.new_name()
    keep = _shm.create_refcounted(name, 16)
    try:
        for _ in range(3):  # each try used to leak one count
            with pytest.raises((ValueError, TypeError), match="size"):
                _shm.attach_refcounted(name, size)
        assert read_refcount(name) == 1
    finally:
        del keep
        assert _shm.decref(name) == 0  # the one real holder lets go: the file goes


TORCH_NEGATIVE_SIZE = r'''
    import json, struct, torch, torch.multiprocessing as mp
    mp.set_sharing_strategy("file_system")
    storage = torch.zeros(4).share_memory_().untyped_storage()
    manager, name, _ = storage._share_filename_cpu_()
    errors = []
    for size in (-5, -100):
        try:
            torch.UntypedStorage._new_shared_filename_cpu(manager, name, size)
        except Exception as exc:
            errors.append(type(exc).__name__)
    count = struct.unpack("<i", open("/dev/shm" + name.decode(), "rb").read(4))[0]
    print(json.dumps({"errors": errors, "count": count}))
'''


@pytest.mark.timeout(120)
def test_torch_refuses_a_negative_size_too():
    rc, out, err = run_child(TORCH_NEGATIVE_SIZE)
    assert rc == 0, err[-2000:]
    assert out == {"errors": ["OverflowError", "OverflowError"], "count": 1}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("data", [b"", b"\x01\x00", b"\x01\x00\x00\x00"])
def test_a_truncated_header_is_refused_clearly(data):
    name = our_name()
    path = make_file(name, data)
    try:
        for call in (lambda: _shm.attach_refcounted(name, 0), lambda: _shm.incref(name),
                     lambda: _shm.decref(name)):
            with pytest.raises(ValueError, match=rf"{HEADER_SIZE}-byte header") as info:
                call()
            assert not isinstance(info.value, struct.error)
            assert "not a shmlab segment" in str(info.value)
        with open(path, "rb") as f:
            assert f.read() == data  # refused without touching it
    finally:
        unlink_quietly(path)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("count", [2**31 - 1, -(2**31)])
def test_an_out_of_range_refcount_is_refused_clearly(count):
    name = our_name()
    made = _shm.create_refcounted(name, 16)  # a real segment, with its lock...
    made.count = count  # ...whose count is then damaged
    path = SHM_DIR + name
    try:
        calls = [lambda: _shm.incref(name)]  # one past the top, or still below zero
        if count > 0:
            calls.append(lambda: _shm.attach_refcounted(name, 16))
        else:
            calls.append(lambda: _shm.decref(name))
        for call in calls:
            with pytest.raises(ValueError, match="refcount") as info:
                call()
            assert not isinstance(info.value, struct.error)
        assert read_refcount(name) == count
    finally:
        del made
        unlink_quietly(path)


@pytest.mark.timeout(60)
def test_a_header_without_our_lock_is_refused_before_anything_waits_on_it():
    # headerlock.py: bytes [8:64) are a lock only if create_refcounted put one there; a file
    # made by hand (count 1, then garbage where the lock would be) must not be waited on.
    name = our_name()
    path = make_file(name, struct.pack("<i", 1) + b"\xff" * (HEADER_SIZE - 4 + 16))
    try:
        for call in (lambda: _shm.attach_refcounted(name, 16), lambda: _shm.incref(name),
                     lambda: _shm.decref(name)):
            with pytest.raises(ValueError, match="no lock in its 64-byte header") as info:
                call()
            assert "not a shmlab segment" in str(info.value)
        with open(path, "rb") as f:
            assert f.read()[:4] == struct.pack("<i", 1)  # refused without touching it
    finally:
        unlink_quietly(path)


TORCH_TRUNCATED = r'''
    import json, os, struct, sys, torch, torch.multiprocessing as mp
    mp.set_sharing_strategy("file_system")
    manager = torch.zeros(4).share_memory_().untyped_storage()._share_filename_cpu_()[0]
    name = sys.argv[1]
    with open("/dev/shm" + name, "wb") as f:
        f.write(b"\x01\x00")
    storage = torch.UntypedStorage._new_shared_filename_cpu(manager, name.encode(), 16)
    size = os.stat("/dev/shm" + name).st_size
    count = struct.unpack("<i", open("/dev/shm" + name, "rb").read(4))[0]
    print(json.dumps({"size": size, "count": count}))
'''


@pytest.mark.timeout(120)
def test_torch_grows_a_truncated_segment_and_counts_from_garbage(tmp_path):
    name = f"/torch_{os.getpid()}_truncated_0"
    try:
        rc, out, err = run_child(TORCH_TRUNCATED, name)
        assert rc == 0, err[-2000:]
        # torch ftruncates the 2-byte file up to 64 + 16 bytes (its one-byte write(fd, "")
        # lands at offset 0 and zeroes the 1) and counts itself in: a damaged file is
        # silently taken for a segment.
        assert out == {"size": HEADER_SIZE + 16, "count": 1}, out
    finally:
        unlink_quietly(SHM_DIR + name)


# -- map_fd: the received file must hold the bytes the message claims -----------------------------
MAP_FD_SHORT = r'''
    import json, os, signal, sys
    lib = sys.argv[1]
    from shmlab import _shm
    fd, mapping = _shm.create_unlinked(4096)  # the sender's real segment: one page
    claimed = 8192  # a forged (or corrupted) message says two
    if lib == "torch":
        import torch
        storage = torch.UntypedStorage._new_shared_fd_cpu(fd, claimed)
        print(json.dumps({"grown_to": os.fstat(fd).st_size}))
        sys.exit(0)
    try:
        own, received = _shm.map_fd(fd, claimed)
    except Exception as exc:
        print(json.dumps({"error": [type(exc).__name__, str(exc)]}))
        sys.exit(0)
    buf = received.buffer()
    print(json.dumps({"mapped": True}), flush=True)
    buf[6000] = 1  # past the end of the file: SIGBUS
    print(json.dumps({"wrote": True}))
'''


@pytest.mark.timeout(120)
def test_map_fd_refuses_a_size_the_file_does_not_have_instead_of_sigbus():
    rc, out, err = run_child(MAP_FD_SHORT, "shmlab")
    assert rc != -signal.SIGBUS, "touching the claimed bytes killed the receiver"
    assert rc == 0, err[-2000:]
    kind, message = out["error"]
    assert kind == "ValueError" and "4,096 bytes" in message and "8,192" in message, message
    # torch instead grows the sender's file to the claimed size (no SIGBUS, but a forged
    # message can make a receiver allocate memory in somebody else's segment).
    rc, out, err = run_child(MAP_FD_SHORT, "torch")
    assert rc == 0 and out == {"grown_to": 8192}, (rc, out, err[-2000:])


@pytest.mark.timeout(60)
@pytest.mark.parametrize("size", [0, -1, 1.0])
def test_map_fd_refuses_a_size_that_cannot_be_mapped(size):
    fd, mapping = _shm.create_unlinked(4096)
    try:
        with pytest.raises((ValueError, TypeError), match="size"):
            _shm.map_fd(fd, size)
    finally:
        os.close(fd)
