"""The small MLP every example trains, its settings, and how every run is measured.

Hogwild, single-process and DDP runs share these so that their numbers compare like for like:
same network, same initial weights (seeded), same test set, same definition of
"time to target accuracy".
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, field

import torch
from torch import nn

from ..messages import tr


def make_model(seed: int = 0, hidden: int = 64) -> nn.Module:
    """A 64 -> hidden -> 10 MLP, seeded so that every run starts from the same weights."""
    gen_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        return nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, 10))
    finally:
        torch.random.set_rng_state(gen_state)  # don't disturb the caller's random stream


@torch.no_grad()
def accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    """Fraction of rows of x whose arg-max logit is the label in y."""
    return (model(x).argmax(dim=1) == y).float().mean().item()


@dataclass(frozen=True)
class TrainConfig:
    """Settings shared by all examples. Each process runs `epochs` passes over *its* shard."""

    epochs: int = 10
    lr: float = 0.05
    momentum: float = 0.5
    batch_size: int = 32
    seed: int = 0
    eval_every: int = 5  # evaluate the test accuracy every this many steps (per process)
    target_accuracy: float = 0.95
    stop_at_target: bool = False  # end the run as soon as the target is reached

    def __post_init__(self):
        if self.epochs < 1 or self.batch_size < 1 or self.eval_every < 1:
            raise ValueError("epochs, batch_size and eval_every must be positive integers")
        if not 0.0 < self.target_accuracy <= 1.0:
            raise ValueError(f"target_accuracy must be in (0, 1], got {self.target_accuracy!r}")


@dataclass
class TrainResult:
    """What a run measured. Times are seconds since all processes were ready to train."""

    mode: str  # "hogwild", "single" or "ddp"
    processes: int
    target_accuracy: float
    time_to_target: float | None  # first test accuracy >= target; None if never reached
    final_accuracy: float  # test accuracy of the final parameters, measured by the parent
    train_time: float  # start signal -> last process finished
    wall_time: float  # including process start-up (spawn, import torch, rendezvous)
    samples: int  # training samples processed by all processes together
    metrics: list[dict] = field(default_factory=list, repr=False)
    model: nn.Module | None = field(default=None, repr=False)
    workers: dict[int, dict] = field(default_factory=dict, repr=False)  # rank -> pid, evidence

    @property
    def throughput(self) -> float:
        """Training samples per second, all processes together."""
        return self.samples / self.train_time if self.train_time > 0 else float("nan")

    def per_process(self) -> dict[int, list[dict]]:
        """Metrics grouped by process rank, in arrival order: one curve per process."""
        out: dict[int, list[dict]] = defaultdict(list)
        for m in self.metrics:
            out[m["rank"]].append(m)
        return dict(out)

    def summary(self) -> str:
        """One line; the ``name=value`` fields stay English in either language (notebook 07's
        hidden test reads ``processes=`` and ``final accuracy=`` from a torchrun's output)."""
        ttt = (tr("not reached") if self.time_to_target is None
               else f"{self.time_to_target:.2f} s")
        to_target = tr("time to {target:.0%}: {ttt}", target=self.target_accuracy, ttt=ttt)
        return (
            f"{self.mode:8s} processes={self.processes}  {to_target}"
            f"  final accuracy={self.final_accuracy:.3f}  train={self.train_time:.2f} s"
            f"  wall={self.wall_time:.2f} s  throughput={self.throughput:,.0f} samples/s"
        )


def time_to_target(metrics: list[dict], target: float) -> float | None:
    """Earliest time at which any process measured a test accuracy >= target."""
    times = [m["time"] for m in metrics if (m.get("test_acc") or 0.0) >= target]
    return min(times) if times else None


class MetricCollector:
    """Parent side: turns worker messages into metrics, live callbacks and a progress bar."""

    def __init__(self, cfg, on_metric, total_steps, progress, stop=None):
        self.cfg, self.on_metric, self.stop = cfg, on_metric, stop
        self.metrics, self.done, self.t0 = [], set(), time.monotonic()
        self.total_steps, self.progress, self.bar = total_steps, progress, None

    def _open_bar(self):  # opened when training starts, so start-up time is not shown as a step
        if self.progress and self.bar is None:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=self.total_steps, unit="step", desc="training")

    def put(self, msg):  # duck-types Queue.put, so the single-process run can call it directly
        if msg.get("ready"):  # the clock starts when training does, not at process start-up
            # Default "now": the single-process run, whose worker is this process, gets here
            # after train()'s set-up (creating the first optimizer imports torch._dynamo: ~3 s).
            self.t0 = msg.get("t0", time.monotonic())
            self._open_bar()
            return
        if msg.get("done"):
            self.done.add(msg["rank"])
            return
        msg["time"] -= self.t0
        self.metrics.append(msg)
        self._open_bar()
        if self.bar is not None:
            self.bar.update(1)
        if self.on_metric is not None:
            self.on_metric(msg)
        reached = msg["test_acc"] is not None and msg["test_acc"] >= self.cfg.target_accuracy
        if reached and self.cfg.stop_at_target and self.stop is not None:
            self.stop.set()

    def close(self):
        if self.bar is not None:
            self.bar.close()
