"""Which launcher makes a child ignore which signal, read from the child itself (`SigIgn` in
/proc/<pid>/status): `nohup` ignores SIGHUP only; a non-interactive shell's `cmd &` ignores
SIGINT (and SIGQUIT), which defeats torch's PR_SET_PDEATHSIG(SIGINT) (notebook 08).

Mirrors: coreutils nohup; POSIX sh's asynchronous lists.
"""

import shlex
import shutil
import signal
import subprocess
import sys

import pytest

# The child prints the mask of the signals it ignores, as the kernel reports it.
CHILD = ("import re; print(re.search(r'SigIgn:\\s*(\\w+)', "
         "open('/proc/self/status').read()).group(1))")


# Ignored dispositions are inherited, so the launcher starts from the defaults a terminal
# gives it, whatever this test run was started under (`nohup make test` ignores SIGHUP).
CLEAN = ("import os, signal, sys\n"
         "for s in (signal.SIGHUP, signal.SIGINT, signal.SIGQUIT):\n"
         "    signal.signal(s, signal.SIG_DFL)\n"
         "os.execvp(sys.argv[1], sys.argv[1:])")


def ignored(argv) -> set[str]:
    out = subprocess.run([sys.executable, "-c", CLEAN, *argv], capture_output=True, text=True,
                         timeout=60, stdin=subprocess.DEVNULL)
    assert out.returncode == 0, out.stderr
    mask = int(out.stdout.split()[-1], 16)
    return {s.name for s in (signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)
            if mask & (1 << (s - 1))}


@pytest.mark.timeout(120)
@pytest.mark.claim("C25.34")
@pytest.mark.skipif(shutil.which("nohup") is None, reason="no nohup on PATH")
def test_nohup_ignores_sighup_and_a_background_job_ignores_sigint(tmp_path):
    py = [sys.executable, "-c", CHILD]
    assert ignored(py) == set()
    # nohup writes its "ignoring input" note to stderr; its stdout is our pipe, not nohup.out
    assert ignored(["nohup", *py]) == {"SIGHUP"}
    job = f"{shlex.join(py)} & wait"
    assert ignored(["sh", "-c", job]) == {"SIGINT", "SIGQUIT"}
    assert ignored(["bash", "-c", job]) == {"SIGINT", "SIGQUIT"}
