"""What `model.share_memory()` shares, what a child gets without it, and why spawn needs the
`__main__` guard: facts the mock interview and the glossary cite (their claims are in
shmlab/facts/claims.json).

Mirrors: torch/nn/modules/module.py (share_memory), torch/multiprocessing/reductions.py.
Each check runs as a real main script in a fresh interpreter, as a learner's script would.
"""

from __future__ import annotations

import subprocess
import sys

import pytest


def run(tmp_path, code: str, *args: str) -> subprocess.CompletedProcess:
    script = tmp_path / "main.py"
    script.write_text(code)
    return subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)


GRADS = """
import multiprocessing, torch

def touch(model, fresh, q):
    with torch.no_grad():
        for p in model.parameters():
            p.grad.fill_(5.0)  # a .grad that existed at share_memory(): shared
    fresh(torch.ones(2, 4)).sum().backward()  # first .grad of these, made here
    optimizer = torch.optim.SGD(fresh.parameters(), lr=0.1, momentum=0.9)  # built here
    optimizer.step()
    state = [optimizer.state[p]["momentum_buffer"] for p in fresh.parameters()]
    q.put([t.is_shared() for t in (*(p.grad for p in fresh.parameters()), *state)])

if __name__ == "__main__":
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4))
    model(torch.ones(2, 4)).sum().backward()
    model.share_memory()
    fresh = torch.nn.Linear(4, 1)
    fresh.share_memory()
    shared = [t.is_shared() for t in (*model.parameters(), *model.buffers())]
    grads = [p.grad.is_shared() for p in model.parameters()]
    ctx = multiprocessing.get_context("fork")
    q = ctx.Queue()
    child = ctx.Process(target=touch, args=(model, fresh, q))
    child.start()
    child_grads = q.get(timeout=60)
    child.join(60)
    print(all(shared), all(grads), all(bool((p.grad == 5.0).all()) for p in model.parameters()),
          any(child_grads), all(p.grad is None for p in fresh.parameters()), child.exitcode)
"""


@pytest.mark.timeout(150)
@pytest.mark.claim("C25.3", "C25.4", "C25.5")
def test_share_memory_shares_existing_grads_and_a_childs_new_grads_are_its_own(tmp_path):
    out = run(tmp_path, GRADS)
    # params and buffers shared; existing grads shared, the child's fill_ seen; the child's
    # first grads and its own optimizer's state private (not shared, the parent has no grads)
    assert out.stdout.split() == ["True", "True", "True", "False", "True", "0"], out.stderr


FORGET = """
import sys, torch, torch.multiprocessing as mp

def step(model):
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)

if __name__ == "__main__":
    model = torch.nn.Linear(3, 2)  # no model.share_memory()
    before = [p.detach().clone() for p in model.parameters()]
    ctx = mp.get_context(sys.argv[1])
    child = ctx.Process(target=step, args=(model,))
    child.start()
    child.join(60)
    after = list(model.parameters())
    if all(torch.equal(a + 1, b) for a, b in zip(before, after)):
        seen = "updated"
    elif all(torch.equal(a, b) for a, b in zip(before, after)):
        seen = "unchanged"
    else:
        seen = "other"
    print(seen, all(p.is_shared() for p in after), child.exitcode)
"""


@pytest.mark.timeout(150)
@pytest.mark.claim("C25.412", start_methods=("fork", "spawn"))
@pytest.mark.parametrize("method, seen", [("fork", ["unchanged", "False", "0"]),
                                          ("spawn", ["updated", "True", "0"])])
def test_without_share_memory_fork_trains_copies_and_spawn_shares_anyway(tmp_path, method, seen):
    out = run(tmp_path, FORGET, method)
    assert out.stdout.split() == seen, out.stderr
    if method == "fork":
        assert "Warning" not in out.stderr, out.stderr  # silently


NO_GUARD = """
import multiprocessing

def work():
    pass

ctx = multiprocessing.get_context("spawn")
child = ctx.Process(target=work)  # no `if __name__ == "__main__":` around this
child.start()
child.join(60)
print("exitcode", child.exitcode, flush=True)
"""


@pytest.mark.timeout(150)
@pytest.mark.claim("C25.205", start_methods=("spawn",))
def test_spawn_without_the_main_guard_fails_in_the_child(tmp_path):
    out = run(tmp_path, NO_GUARD)
    assert "exitcode 1" in out.stdout, (out.stdout, out.stderr)
    assert "An attempt has been made to start a new process before the" in out.stderr
    assert "bootstrapping phase" in out.stderr
