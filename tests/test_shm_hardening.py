"""Forged, truncated and foreign segments: the OS layer refuses them clearly and leaks nothing.

Every case uses real files in /dev/shm, and a child process wherever the failure is a signal
or torch's behaviour is shown beside ours. torch's RefcountedMapAllocator maps first and then
counts itself in through the mapping; it grows a file that is too small; it trusts any file it
can open. shmlab counts itself in only after mapping, refuses what it cannot trust, and says
why, so nothing here can leave a count or a file behind.
"""

from __future__ import annotations

import errno
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
    path = make_file(name, struct.pack("<i", count) + bytes(HEADER_SIZE - 4 + 16))
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


# -- decref in a finalizer: never "Exception ignored" ---------------------------------------------
SYMLINKED_SEGMENT = r'''
    import gc, json, os
    import shmlab, shmlab.multiprocessing as mp
    mp.set_sharing_strategy("file_system")
    t = shmlab.zeros(4).share_memory_()
    name = t.untyped_storage()._name
    path, moved = "/dev/shm" + name, "/dev/shm" + name + "_moved"
    os.rename(path, moved)  # somebody swaps the segment for a symlink to it
    os.symlink(moved, path)
    del t
    gc.collect()
    print(json.dumps({"path": path, "moved": moved}))
'''


@pytest.mark.timeout(120)
def test_a_finalizer_that_cannot_release_warns_instead_of_exception_ignored():
    rc, out, err = run_child(SYMLINKED_SEGMENT)
    try:
        assert rc == 0, err[-2000:]
        assert "Exception ignored" not in err, err
        assert "RuntimeWarning" in err and "could not release" in err, err
        assert "symbolic link" in err, err  # says what it found there
    finally:
        unlink_quietly(out.get("path", "/nonexistent"), out.get("moved", "/nonexistent"))


@pytest.mark.timeout(60)
def test_decref_of_a_symlink_says_so():
    name = _shm.new_name()
    keep = _shm.create_refcounted(name, 16)
    path, moved = SHM_DIR + name, SHM_DIR + name + "_moved"
    os.rename(path, moved)
    os.symlink(moved, path)
    try:
        with pytest.raises(OSError, match="is a symbolic link, not a shmlab segment") as info:
            _shm.decref(name)
        assert info.value.errno == errno.ELOOP and name in str(info.value)
    finally:
        del keep
        unlink_quietly(path, moved)


# -- segments of another user ---------------------------------------------------------------------
TORCH_OTHER_UID = r'''
    import json, os, struct, torch, torch.multiprocessing as mp
    mp.set_sharing_strategy("file_system")
    storage = torch.zeros(4).share_memory_().untyped_storage()
    manager, name, size = storage._share_filename_cpu_()
    path = "/dev/shm" + name.decode()
    os.chown(path, 4242, 4242)
    other = torch.UntypedStorage._new_shared_filename_cpu(manager, name, size)
    count = struct.unpack("<i", open(path, "rb").read(4))[0]
    print(json.dumps({"attached": True, "count": count}))
'''


@pytest.mark.timeout(120)
def test_a_segment_of_another_uid_is_refused_torch_attaches():
    if os.geteuid() != 0:
        pytest.skip("needs root to chown a segment to another uid")
    name = _shm.new_name()
    keep = _shm.create_refcounted(name, 16)
    path = SHM_DIR + name
    os.chown(path, 4242, 4242)
    try:
        with pytest.raises(PermissionError, match="uid 4242") as info:
            _shm.attach_refcounted(name, 16)
        assert "file_descriptor" in str(info.value) or "own" in str(info.value)
        with pytest.raises(PermissionError, match="uid 4242"):
            _shm.incref(name)
        assert read_refcount(name) == 1  # nobody counted in
    finally:
        del keep
        unlink_quietly(path)
    rc, out, err = run_child(TORCH_OTHER_UID)
    assert rc == 0 and out == {"attached": True, "count": 2}, (rc, out, err[-2000:])


# -- ENOSPC: no inode left ------------------------------------------------------------------------
NO_INODES = r'''
    import gc, json, os, subprocess, sys
    mount = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m,nr_inodes=16", "tmpfs",
                            "/dev/shm"], capture_output=True, text=True)
    if mount.returncode:
        print(json.dumps({"skip": "mount -t tmpfs failed: " + mount.stderr.strip()}))
        sys.exit(0)
    filler = 0
    while True:  # use up every inode; the space is left almost all free
        try:
            open(f"/dev/shm/filler_{filler}", "w").close()
        except OSError:
            break
        filler += 1
    import torch, torch.multiprocessing as tmp
    import shmlab, shmlab.multiprocessing as smp
    out = {"fillers": filler}
    for lib, mp, zeros in (("torch", tmp, torch.zeros), ("shmlab", smp, shmlab.zeros)):
        for strategy in ("file_descriptor", "file_system"):
            mp.set_sharing_strategy(strategy)
            try:
                zeros(4).share_memory_()
                error = None
            except Exception as exc:
                error = [type(exc).__name__, getattr(exc, "errno", None), str(exc)]
            out[f"{lib} {strategy}"] = error
            gc.collect()
    out["left"] = sorted(n for n in os.listdir("/dev/shm") if not n.startswith("filler_"))
    print(json.dumps(out))
'''


@pytest.mark.timeout(180)
def test_no_inode_left_gets_the_helpful_enospc_message_torch_gets_the_bare_one(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root: a private mount namespace with a tiny tmpfs on /dev/shm")
    log = tmp_path / "out"
    with open(log, "w") as out, open(tmp_path / "err", "w") as err:  # no pipes: the managers
        rc = subprocess.run(["unshare", "--mount", sys.executable, "-c",  # outlive the child
                             textwrap.dedent(NO_INODES)], stdout=out, stderr=err, timeout=120,
                            env=dict(os.environ, PYTHONPATH=ROOT)).returncode
    text = log.read_text()
    if rc != 0 and not text:
        pytest.skip(f"unshare --mount failed here: {(tmp_path / 'err').read_text()[-300:]}")
    res = json.loads(text)
    if "skip" in res:
        pytest.skip(res["skip"])
    print(json.dumps(res, indent=1))
    assert rc == 0 and res["fillers"] > 0
    for strategy in ("file_descriptor", "file_system"):
        kind, code, message = res[f"shmlab {strategy}"]
        assert kind == "OSError" and code == errno.ENOSPC, res
        assert "inode" in message and "nr_inodes" in message, message  # why, and what to do
        assert "leaked" in message, message
        t_kind, _, t_message = res[f"torch {strategy}"]
        assert t_kind == "RuntimeError" and "No space left on device (28)" in t_message
        assert "inode" not in t_message
    assert res["left"] == []  # nothing half-made
