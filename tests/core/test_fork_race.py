"""A fork while a Queue's feeder thread makes the process's first file_system share.

Each library runs tests/core/fork_race.py's reproduction (upstream's test_fill: q.put([x, x[:, 1]])
then at once a fork child that writes into the received tensor) RUNS times, each in a fresh
interpreter with sys.setswitchinterval(1e-5) so that the feeder thread and the forking main
thread interleave finely. Two ways it can hang: the child blocks on the import lock of a
lazily imported module, or the child holds the write end of Popen's exec-error pipe while the
feeder waits on it, and the manager's grace runs out (ManagerError ENOENT). RUNS is enough to
see either (how often each showed: docs/benchmarks.md, "How often the fork race hung"). See
Note [Forking while the first share is in flight] in shmlab/storage.py and Note [Forking while
a manager starts] in client.py.
"""

from __future__ import annotations

import fork_race
import pytest

RUNS = 20
TORCH_RUNS = 5  # torch is only the comparison here, and a fresh interpreter importing it takes ~6 s
WAIT_S = 5.0  # a run that has not finished by then is a hang (a good one takes ~0.1 s)


@pytest.mark.slow
@pytest.mark.timeout(RUNS * (WAIT_S + 15) + 60)
@pytest.mark.parametrize("lib", ["torch", "shmlab"])
def test_fork_during_the_first_file_system_share_does_not_hang(lib):
    runs = TORCH_RUNS if lib == "torch" else RUNS
    result = fork_race.run_trials(lib, runs, switch=1e-5, warm=True, wait_s=WAIT_S)
    print({k: v for k, v in result.items() if k != "samples"})
    detail = "\n\n".join(s[-3000:] for s in result["samples"])
    assert result["errors"] == 0, f"{result['errors']} runs failed otherwise:\n{detail}"
    if lib == "torch" and result["hangs"]:
        # torch has a much rarer race of its own (in C++); report it, it is not ours to fix
        pytest.xfail(f"torch hung in {result['hangs']} of {runs} runs: {result['causes']}")
    assert result["hangs"] == 0, (f"{result['hangs']} of {runs} runs hung: "
                                  f"{result['causes']}\n{detail}")
