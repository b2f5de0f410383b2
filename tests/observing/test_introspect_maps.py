"""introspect.mapped_by / held_by / orphaned: who uses a file, and whose parent is gone.

Real processes and real files in a private folder on the /dev/shm tmpfs; the orphan checks
read a hand-made process table, since the kernel gives no way to fake a dead parent.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time

import pytest

from shmlab import introspect
from shmlab.introspect import ProcStat


@pytest.fixture
def segment():
    folder = tempfile.mkdtemp(prefix="maps-test-", dir=introspect.SHM_DIR)
    path = os.path.join(folder, "torch_1_2_3")
    with open(path, "wb") as f:
        f.write(bytes(8192))
    yield path
    shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.timeout(60)
def test_mapped_by_sees_a_mapping_whose_fd_was_closed(segment):
    # (Python's mmap keeps a dup of the fd; torch's receivers keep none: only the maps show them.)
    code = ("import mmap, os, sys; fd = os.open(sys.argv[1], os.O_RDONLY); "
            "m = mmap.mmap(fd, 0, prot=mmap.PROT_READ); os.close(fd); print('ready', flush=True); "
            "sys.stdin.read()")
    proc = subprocess.Popen([sys.executable, "-c", code, segment], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        assert introspect.mapped_by([segment]) == {segment: [proc.pid]}
    finally:
        proc.stdin.close()
        proc.wait(30)
        proc.stdout.close()
    assert introspect.mapped_by([segment]) == {segment: []}


def test_held_by_sees_an_fd_on_a_file_unlinked_since(segment):
    fd = os.open(segment, os.O_RDONLY)
    try:
        os.unlink(segment)  # the link now reads "<path> (deleted)"
        assert os.getpid() in introspect.held_by([segment])[segment]
    finally:
        os.close(fd)
    assert introspect.held_by([segment]) == {segment: []}


def test_orphaned_reads_the_signs_of_a_dead_parent():
    now = time.time()
    table = {
        1: ProcStat(0, "S", "init", now - 100),
        10: ProcStat(1, "S", "python", now - 50),  # adopted by pid 1
        11: ProcStat(12, "S", "python", now - 50),  # its parent is not in the table
        13: ProcStat(14, "S", "python", now - 50),  # parent started after it: a reused pid
        14: ProcStat(1, "S", "bash", now - 10),
        15: ProcStat(16, "S", "python", now - 50),  # adopted by a subreaper
        16: ProcStat(1, "S", "systemd", now - 90),
        17: ProcStat(18, "S", "python", now - 50),  # a live parent that started first
        18: ProcStat(1, "S", "bash", now - 60),
    }
    assert [p for p in (10, 11, 13, 15, 17) if introspect.orphaned(p, table)] == [10, 11, 13, 15]
    assert not introspect.orphaned(99, table)  # not in the table: not a process we know
