"""What lies in /dev/shm under a segment's name cannot be trusted: symlinks, other users, no inodes.

Another process (or user) can replace a segment's file, chown it, or use up the tmpfs's
inodes. shmlab refuses such files with an exception that says what it found, its finalizers
warn instead of printing "Exception ignored", and a full inode table gets the same helpful
ENOSPC as a full disk. torch runs beside shmlab where it has the behaviour.
"""

from __future__ import annotations

import errno
import os
import textwrap

import pytest
from support.namespaces import run_unshared
from test_shm_hardening import ROOT, run_child, unlink_quietly

from shmlab import _shm
from shmlab._shm import SHM_DIR, read_refcount

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
    rc, res = run_unshared(tmp_path, textwrap.dedent(NO_INODES), timeout=120,
                           env=dict(os.environ, PYTHONPATH=ROOT))
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
