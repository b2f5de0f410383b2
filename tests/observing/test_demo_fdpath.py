"""shmlab.lessons.fdpath.segment_bytes: one segment's memory, wherever it is still held (C12.7)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from shmlab.lessons import fdpath

MB = 2**20
# Maps the segment whose fd it inherits (argv[1]), closes that fd (the mapping alone holds it),
# says so, and keeps the mapping until its stdin closes.
MAPPER = """
import mmap, os, sys
fd = int(sys.argv[1])
m = mmap.mmap(fd, 0)
os.close(fd)
print("mapped", flush=True)
sys.stdin.read()
"""


def _unlinked_segment(tag: str, size: int) -> int:
    """An unlinked /dev/shm segment of ``size`` allocated bytes, as file_descriptor makes one."""
    name = f"/dev/shm/shmlab_{os.getpid()}_{tag}_0"
    fd = os.open(name, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    os.unlink(name)
    os.posix_fallocate(fd, 0, size)
    return fd


@pytest.mark.timeout(60)
def test_segment_bytes_follows_one_segment_through_another_process_mapping():
    fd = _unlinked_segment("seg", MB)
    st = os.fstat(fd)
    seg = (st.st_ino, st.st_dev)
    assert fdpath.segment_bytes(*seg) == MB  # through our fd
    child = subprocess.Popen([sys.executable, "-c", MAPPER, str(fd)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True, pass_fds=(fd,))
    try:
        assert child.stdout.readline().strip() == "mapped"
        os.close(fd)  # now only the child's mapping (no fd anywhere) holds the segment
        other = _unlinked_segment("other", 4 * MB)  # another program's shm use meanwhile
        held = fdpath.segment_bytes(*seg)
        os.close(other)
    finally:
        child.communicate(timeout=30)
    assert held == MB, "the child's mapping alone holds the segment's pages"
    assert fdpath.segment_bytes(*seg) == 0, "nothing refers to it any more: freed"
