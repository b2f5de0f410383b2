"""Beyond one machine: what DDP exchanges, the rendezvous store, collectives and uneven ranks,
gloo and nccl, DataParallel — the claims the drill's "beyond" cards rest on.

Mirrors: torch/nn/parallel/distributed.py, torch/distributed/distributed_c10d.py,
torch/nn/parallel/data_parallel.py (the installed torch; gloo on CPU, in-process where one rank
is enough).
"""

import datetime
import inspect
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as tmp
from torch.nn.parallel import DistributedDataParallel as DDP

TIMEOUT = 60


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def one_rank():
    """A one-rank gloo group over a TCPStore hosted here; torn down after the test."""
    store = dist.TCPStore("127.0.0.1", _free_port(), world_size=1, is_master=True,
                          timeout=datetime.timedelta(seconds=30))
    keys_before = store.num_keys()
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        yield store, keys_before
    finally:
        dist.destroy_process_group()


@pytest.mark.claim("C25.123")
def test_ddp_all_reduces_gradients_during_backward(one_rank):
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 1), torch.nn.Linear(1, 1))
    net[2].requires_grad_(False)  # a frozen layer: its parameters get no gradient to reduce
    model = DDP(net)
    calls = []

    def hook(state, bucket):
        calls.append(("in backward", [g.clone() for g in bucket.gradients()]))
        fut = dist.all_reduce(bucket.buffer(), async_op=True).get_future()
        return fut.then(lambda f: f.value()[0])

    model.register_comm_hook(None, hook)
    before = [p.detach().clone() for p in model.parameters()]
    model(torch.randn(8, 4)).sum().backward()
    assert calls, "the all-reduce hook ran inside backward()"
    grads = {id(g) for _, gs in calls for g in gs}
    # every gradient of the parameters that require grad, in buckets
    assert len(grads) == sum(1 for p in model.parameters() if p.requires_grad) == 4
    assert all(torch.equal(a, p) for a, p in zip(before, model.parameters(), strict=True))
    src = inspect.getsource(DDP.__init__)
    assert "bucket_cap_mb" in src
    assert "_sync_module_states(" in src  # rank 0's parameters and buffers, broadcast once
    assert "requires_grad" in inspect.getsource(DDP._build_params_for_reducer)


@pytest.mark.claim("C25.127")
def test_the_rendezvous_is_a_store_the_ranks_meet_in(one_rank):
    store, keys_before = one_rank
    assert store.num_keys() > keys_before  # gloo exchanged its connection data there
    src = inspect.getsource(dist.init_process_group)
    assert 'If neither is specified, ``init_method`` is assumed to be "env://".' in src
    import sys

    rdzv = inspect.getsource(sys.modules["torch.distributed.rendezvous"]._env_rendezvous_handler)
    assert '"MASTER_ADDR"' in rdzv and '"MASTER_PORT"' in rdzv
    assert "_create_c10d_store(" in rdzv
    create = inspect.getsource(sys.modules["torch.distributed.rendezvous"]._create_c10d_store)
    assert "TCPStore(" in create and "rank == 0" in create  # rank 0 hosts the store


def _rank(rank, port, extra, out):
    store = dist.TCPStore("127.0.0.1", port, world_size=2, is_master=rank == 0,
                          timeout=datetime.timedelta(seconds=30))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=3))
    t = torch.ones(1)
    dist.all_reduce(t)  # both ranks: the step they share
    result = float(t)
    if extra:
        try:
            dist.all_reduce(t)  # one more step the other rank never takes
            result = "completed"
        except RuntimeError as e:
            result = type(e).__name__ + ": " + str(e)[:300]
    else:
        store.wait(["done"], datetime.timedelta(seconds=30))
    out.put((rank, result))
    if extra:
        store.set("done", "1")
    dist.destroy_process_group()


@pytest.mark.claim("C25.125", start_methods=("fork",))
def test_a_rank_with_an_extra_collective_waits_until_the_timeout():
    ctx = tmp.get_context("fork")
    out, port = ctx.Queue(), _free_port()
    ranks = [ctx.Process(target=_rank, args=(r, port, r == 0, out)) for r in (0, 1)]
    for p in ranks:
        p.start()
    try:
        got = dict(out.get(timeout=TIMEOUT) for _ in ranks)
    finally:
        for p in ranks:
            p.join(TIMEOUT)
    assert got[1] == 2.0
    assert got[0].startswith("RuntimeError") and "Timed out" in got[0], got
    sampler = [list(torch.utils.data.DistributedSampler(range(10), num_replicas=3, rank=r,
                                                        shuffle=False)) for r in range(3)]
    assert [len(s) for s in sampler] == [4, 4, 4]  # padded by repeating samples
    dropped = [len(torch.utils.data.DistributedSampler(range(10), num_replicas=3, rank=r,
                                                       drop_last=True)) for r in range(3)]
    assert dropped == [3, 3, 3]
    assert "Joinable" in [b.__name__ for b in DDP.__mro__] and hasattr(DDP, "join")


@pytest.mark.claim("C25.126")
def test_gloo_for_cpu_nccl_for_cuda(one_rank):
    assert dist.Backend.default_device_backend_map["cpu"] == "gloo"
    assert dist.Backend.default_device_backend_map["cuda"] == "nccl"
    assert dist.Backend.backend_capability["nccl"] == ["cuda"]
    assert dist.Backend.backend_capability["gloo"] == ["cpu", "cuda"]
    t = torch.ones(3)
    dist.all_reduce(t)  # gloo on a CPU tensor
    assert dist.get_backend() == "gloo" and torch.equal(t, torch.ones(3))


@pytest.mark.claim("C25.124")
def test_dataparallel_is_one_process_with_threads():
    import sys

    import torch.nn.parallel  # noqa: F401  (the modules; their names are shadowed by functions)

    data_parallel = sys.modules["torch.nn.parallel.data_parallel"]
    parallel_apply = sys.modules["torch.nn.parallel.parallel_apply"]
    forward = inspect.getsource(data_parallel.DataParallel.forward)
    for step in ("self.scatter(", "self.replicate(", "self.parallel_apply(", "self.gather("):
        assert step in forward
    # one device: after the scatter, the module itself runs, with no replica and no thread
    one = forward.index("if len(self.device_ids) == 1:")
    assert forward.index("self.scatter(") < one < forward.index("self.replicate(")
    assert "return self.module(*inputs[0], **module_kwargs[0])" in forward[one:]
    assert "self.output_device" in forward
    assert "threading.Thread(" in inspect.getsource(parallel_apply.parallel_apply)
