"""What Module.share_memory() shares, and what an optimizer handed to a child arrives with.

Module.share_memory() is _apply(lambda t: t.share_memory_()): parameters, buffers and every .grad
that exists at that moment move to shared memory. What a child then sees depends on the start
method: a fork child inherits the objects themselves; spawn and forkserver pickle them, and a
Parameter is pickled without its .grad while every tensor that is pickled (an optimizer's state
included, once a step has created it) goes through torch's reducers, which share it. Each
experiment runs in a script of its own, so this test process never changes its sharing strategy.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

SCRIPT = r'''
import json, sys
import torch, torch.multiprocessing as mp
from torch import nn


def fill_grad(lin):
    if lin.weight.grad is None:
        sys.exit(3)  # a pickled Parameter arrives without its .grad
    lin.weight.grad.fill_(5.0)


def backward_in_child(lin, q):
    lin(torch.ones(1, 2)).sum().backward()  # the first backward allocates .grad here
    opt = torch.optim.SGD(lin.parameters(), lr=0.1, momentum=0.9)  # built here
    opt.step()
    q.put((lin.weight.grad.is_shared(), opt.state[lin.weight]["momentum_buffer"].is_shared()))


def fill_momentum(opt, q):
    buf = opt.state[opt.param_groups[0]["params"][0]]["momentum_buffer"]
    q.put(buf.is_shared())
    buf.fill_(9.0)


def first_step(opt, q):
    params = opt.param_groups[0]["params"]
    sum(p.sum() for p in params).backward()
    opt.step()  # the first step creates the state, here
    q.put(opt.state[params[0]]["momentum_buffer"].is_shared())


def main(method):
    ctx = mp.get_context(method)
    out = {}
    lin, bn = nn.Linear(2, 1), nn.BatchNorm1d(2)
    lin(torch.ones(1, 2)).sum().backward()  # .grad exists before share_memory()
    lin.share_memory()
    bn.share_memory()
    out["old grad shared"] = lin.weight.grad.is_shared()
    out["buffer shared"] = bn.running_mean.is_shared()
    p = ctx.Process(target=fill_grad, args=(lin,))
    p.start(); p.join(60)
    out["child had grad"] = p.exitcode == 0
    out["child fill seen"] = lin.weight.grad.flatten().tolist() == [5.0, 5.0]

    fresh = nn.Linear(2, 1)
    fresh.share_memory()  # no .grad yet
    q = ctx.Queue()
    p = ctx.Process(target=backward_in_child, args=(fresh, q))
    p.start()
    out["new grad shared in child"], out["child's optimizer state shared"] = q.get(timeout=60)
    p.join(60)
    out["parent grad after child backward"] = fresh.weight.grad is None

    lin3 = nn.Linear(2, 1)
    opt = torch.optim.SGD(lin3.parameters(), lr=0.1, momentum=0.9)
    lin3(torch.ones(1, 2)).sum().backward()
    opt.step()  # momentum_buffer exists, private
    buf = opt.state[lin3.weight]["momentum_buffer"]
    out["momentum shared before"] = buf.is_shared()
    p = ctx.Process(target=fill_momentum, args=(opt, q))
    p.start(); out["momentum shared in child"] = q.get(timeout=60); p.join(60)
    out["momentum shared after"] = buf.is_shared()
    out["child momentum write seen"] = buf.flatten().tolist() == [9.0, 9.0]

    lin4 = nn.Linear(2, 1)
    fresh_opt = torch.optim.SGD(lin4.parameters(), lr=0.1, momentum=0.9)  # no step: no state
    p = ctx.Process(target=first_step, args=(fresh_opt, q))
    p.start(); out["fresh optimizer state shared in child"] = q.get(timeout=60); p.join(60)
    out["fresh optimizer state in parent"] = len(fresh_opt.state)
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1])
'''

METHODS = ("fork", "spawn", "forkserver")
# One run of the experiment answers every test here: under pytest-xdist they stay on one worker,
# or each worker would run the module fixture (three interpreters per start method) again.
pytestmark = pytest.mark.xdist_group("module-sharing")


@pytest.fixture(scope="module")
def seen(tmp_path_factory):
    """The experiment's observations, once per start method (a few seconds each)."""
    script = tmp_path_factory.mktemp("sharing") / "module_sharing.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")]))}
    out = {}
    for method in METHODS:
        done = subprocess.run([sys.executable, str(script), method], capture_output=True,
                              text=True, timeout=180, env=env, cwd=script.parent)
        assert done.returncode == 0, done.stderr
        out[method] = json.loads(done.stdout.strip().splitlines()[-1])
    return out


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.claim("C25.3", "C25.4", start_methods=("fork", "spawn", "forkserver"))
def test_share_memory_moves_parameters_buffers_and_existing_grads(seen):
    for method, obs in seen.items():
        assert obs["old grad shared"] and obs["buffer shared"], (method, obs)
        # a fork child has the very same shared .grad; a pickled Parameter arrives without .grad
        assert obs["child had grad"] is (method == "fork"), (method, obs)
        assert obs["child fill seen"] is (method == "fork"), (method, obs)


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.claim("C25.5", start_methods=("fork", "spawn", "forkserver"))
def test_a_grad_created_after_share_memory_is_private(seen):
    for method, obs in seen.items():
        assert obs["new grad shared in child"] is False, (method, obs)
        assert obs["parent grad after child backward"], (method, obs)
        assert obs["child's optimizer state shared"] is False, (method, obs)


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.claim("C25.6", start_methods=("fork", "spawn", "forkserver"))
def test_an_optimizer_passed_to_a_child(seen):
    for method, obs in seen.items():
        assert obs["momentum shared before"] is False, (method, obs)
        pickled = method != "fork"  # fork passes the Process's arguments without pickling them
        assert obs["momentum shared in child"] is pickled, (method, obs)
        assert obs["momentum shared after"] is pickled, (method, obs)  # moved in the parent too
        assert obs["child momentum write seen"] is pickled, (method, obs)
        # an optimizer that has not stepped has no state to share: the child's is its own
        assert obs["fresh optimizer state shared in child"] is False, (method, obs)
        assert obs["fresh optimizer state in parent"] == 0, (method, obs)
