"""Training examples the tests and lab 5 run: Hogwild and DDP as complete programs.

The notebooks write their own workers (``%%writefile`` cells, ``shmlab.harness.workers``); these
are the reference runs a test or a grader starts from Python or the command line.

- `data`: the scikit-learn digits set as tensors (offline, fixed split).
- `model`: the MLP, `TrainConfig`, `TrainResult`.
- `hogwild`: `run_hogwild()`, `run_single()`, the `train()` worker; CLI.
- `evidence`: `check_sharing()`: proof that workers share the parent's parameters.
- `ddp`: `run_ddp()` with DistributedDataParallel (gloo); CLI, also under torchrun.
"""
