"""Tests for shmlab.examples: Hogwild on shared parameters, the evidence, the baseline, DDP.

Sized for a 2-core machine: the digits set is tiny, so start-up (spawn, import torch, the
rendezvous) costs more than training. Timeouts are generous for a loaded machine; accuracy
targets have a wide margin (the MLP reaches about 0.97 on this test set).
"""

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from shmlab.examples import hogwild
from shmlab.examples.data import load_digits
from shmlab.examples.ddp import run_ddp
from shmlab.examples.evidence import check_sharing, mapped_file
from shmlab.examples.model import TrainConfig, accuracy, make_model

TARGET = 0.90


@pytest.fixture(scope="module")
def digits():
    return load_digits()


@pytest.fixture(autouse=True)
def file_descriptor_strategy():
    """Run on torch's default strategy, whatever an earlier test in this process chose."""
    old = mp.get_sharing_strategy()
    mp.set_sharing_strategy("file_descriptor")
    yield
    mp.set_sharing_strategy(old)


def test_digits_split_is_fixed_and_standardized(digits):
    again = load_digits()
    assert digits.x_train.shape == (1348, 64) and digits.x_test.shape == (449, 64)
    assert digits.x_train.dtype == torch.float32 and digits.y_train.dtype == torch.int64
    assert torch.equal(digits.x_test, again.x_test)
    assert digits.x_train.mean(0).abs().max() < 1e-4


@pytest.mark.timeout(60)
@pytest.mark.claim("C5.1", "C5.2")
def test_hogwild_children_update_the_parents_parameters(digits):
    # Two processes train one model; their optimizer.step() calls change the parameters this
    # (parent) process sees.
    model = make_model()
    before = [p.detach().clone() for p in model.parameters()]
    seen = []
    r = hogwild.run_hogwild(2, epochs=5, target_accuracy=TARGET, model=model, data=digits,
                            on_metric=seen.append, timeout=50)
    assert r.time_to_target is not None and r.final_accuracy >= TARGET
    assert all(not torch.equal(b, p) for b, p in zip(before, model.parameters(), strict=True))
    # Each worker's memory map shows the same files (inode, device) behind the parameters.
    mine = [mapped_file(p) for p in model.parameters()]
    assert all(w["mapped_files"] == mine for w in r.workers.values()) and len(r.workers) == 2
    assert accuracy(model, digits.x_test, digits.y_test) == r.final_accuracy
    assert set(r.per_process()) == {0, 1} and len(seen) == len(r.metrics)
    assert {"rank", "step", "time", "loss", "acc", "test_acc"} <= set(r.metrics[0])


@pytest.mark.slow  # fresh interpreters import torch: seconds each on 2 cores
@pytest.mark.timeout(120)
def test_hogwild_runs_under_spawn_and_stops_at_target(digits):
    # Under spawn a child imports the worker by name: this is why it lives in the package.
    model = make_model()
    r = hogwild.run_hogwild(2, epochs=20, target_accuracy=TARGET, start_method="spawn",
                            model=model, data=digits, stop_at_target=True, timeout=100)
    assert r.time_to_target is not None
    # A spawned child maps the parent's files (received as fds), at other addresses.
    mine = [mapped_file(p) for p in model.parameters()]
    assert all(w["mapped_files"] == mine for w in r.workers.values())
    assert r.samples < 20 * len(digits.x_train)  # stopped early


@pytest.mark.timeout(90)
@pytest.mark.parametrize("method, processes", [
    ("fork", 2),
    pytest.param("spawn", 1, marks=pytest.mark.slow),  # a fresh interpreter imports torch
])
def test_children_see_the_same_storage_as_the_parent(method, processes):
    ev = check_sharing(processes, method)
    assert ev.same_storage and all(ev.markers_seen)
    assert all(row["is_shared"] for rows in [ev.parent, *ev.children.values()] for row in rows)
    same_ptr = [r["data_ptr"] for r in ev.children[0]] == [r["data_ptr"] for r in ev.parent]
    assert same_ptr == (method == "fork")  # addresses differ under spawn; the memory does not


@pytest.mark.timeout(60)
def test_a_failing_worker_is_reported_and_cleaned_up(digits):
    bad = digits._replace(x_train=digits.x_train[:, :10])  # wrong width: the model raises
    with pytest.raises(RuntimeError, match="worker . failed"):
        hogwild.run_hogwild(2, epochs=1, data=bad, timeout=50)


@pytest.mark.timeout(30)
def test_single_process_baseline(digits):
    threads = torch.get_num_threads()
    r = hogwild.run_single(epochs=5, target_accuracy=TARGET, data=digits)
    assert r.processes == 1 and r.time_to_target is not None and r.final_accuracy >= TARGET
    assert torch.get_num_threads() == threads  # restored after the run


@pytest.mark.timeout(60)
def test_hogwild_command_line(capsys):
    hogwild.main(["--processes", "2", "--epochs", "3", "--target", str(TARGET)])
    out = capsys.readouterr().out
    assert "hogwild  processes=2" in out and "single   processes=1" in out


def test_bad_settings_are_rejected():
    with pytest.raises(ValueError, match="processes"):
        hogwild.run_hogwild(0)
    with pytest.raises(ValueError, match="target_accuracy"):
        TrainConfig(target_accuracy=1.5)
    with pytest.raises(ValueError, match="nprocs"):
        run_ddp(4, batch_size=2)


_ddp_runs = {}


def ddp_spawn_result(digits):
    """One spawn DDP run, shared by two tests; made inside a test, so the leak check sees it."""
    if "spawn" not in _ddp_runs:
        _ddp_runs["spawn"] = run_ddp(2, epochs=5, target_accuracy=TARGET, data=digits,
                                     timeout=100)
    return _ddp_runs["spawn"]


@pytest.mark.slow  # fresh interpreters import torch: seconds each on 2 cores
@pytest.mark.timeout(120)
@pytest.mark.xdist_group("ddp-spawn")  # one worker, so the two tests share the run
def test_ddp_with_spawn_reaches_target(digits):
    r = ddp_spawn_result(digits)
    assert r.processes == 2 and r.time_to_target is not None and r.final_accuracy >= TARGET
    assert r.throughput > 0
    assert accuracy(r.model, digits.x_test, digits.y_test) == pytest.approx(r.final_accuracy)


def run_in_own_session(cmd: list[str], timeout: float) -> str:
    """Run `cmd` in a session of its own and return its stdout; on a timeout SIGKILL its whole
    process group (workers included), so nothing is left behind, and raise."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    assert proc.returncode == 0, err[-2000:]
    return out


@pytest.mark.slow
@pytest.mark.timeout(420)
@pytest.mark.xdist_group("ddp-spawn")
def test_ddp_is_deterministic_whatever_the_start_method(digits, tmp_path):
    # Synchronous all-reduce: the same seeds give bit-identical weights, unlike Hogwild's races.
    # The fork run forks from a fresh interpreter, not from this pytest worker: the worker has
    # threads (execnet's, torch's pool) whose locks a forked child can inherit held, and twice
    # on a loaded 2-core run its fork workers never finished.
    saved = tmp_path / "fork.pt"
    script = ("import sys, torch; from shmlab.examples.data import load_digits; "
              "from shmlab.examples.ddp import run_ddp; "
              "r = run_ddp(2, epochs=5, target_accuracy=float(sys.argv[2]), data=load_digits(), "
              "timeout=240, start_method='fork'); torch.save(r.model.state_dict(), sys.argv[1])")
    run_in_own_session([sys.executable, "-c", script, str(saved), str(TARGET)], timeout=300)
    forked = torch.load(saved)
    spawned = ddp_spawn_result(digits).model.state_dict()
    assert forked.keys() == spawned.keys()
    for name in forked:
        assert torch.equal(forked[name], spawned[name]), name


@pytest.mark.slow  # fresh interpreters import torch: seconds each on 2 cores
@pytest.mark.timeout(120)
def test_torchrun_runs_the_ddp_module():
    torchrun = Path(sys.executable).with_name("torchrun")
    cmd = [str(torchrun), "--standalone", "--nproc_per_node=2", "-m", "shmlab.examples.ddp",
           "--epochs", "3", "--target", str(TARGET)]
    out = run_in_own_session(cmd, timeout=100)
    assert "ddp      processes=2" in out and "time to 90%: not reached" not in out, out
