"""shmlab decides its platform once, at import: Linux only, and an ImportError that says why.

Real interpreters in subprocesses: pretending to be macOS must happen before shmlab is imported.
"""

import subprocess
import sys

import pytest


def _import_shmlab_as(platform: str | None) -> subprocess.CompletedProcess:
    pretend = f"sys.platform = {platform!r}; " if platform else ""
    code = f"import sys; {pretend}import shmlab; print('imported', sys.platform)"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)


@pytest.mark.parametrize("platform", ["darwin", "win32"])
def test_import_elsewhere_than_linux_raises_importerror_saying_why(platform):
    out = _import_shmlab_as(platform)
    assert out.returncode != 0 and "imported" not in out.stdout
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: shmlab runs on Linux only"), out.stderr
    assert platform in last
    for why in ("POSIX shared memory", "shm_open", "SCM_RIGHTS", "/proc", "SO_PEERCRED",
                "posix_fallocate"):
        assert why in last, why


def test_import_on_linux_works():
    out = _import_shmlab_as(None)
    assert out.returncode == 0 and out.stdout.strip() == f"imported {sys.platform}", out.stderr
    assert sys.platform.startswith("linux")
