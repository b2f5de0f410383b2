"""Training examples for the Hogwild and DDP notebooks: workers live here, not in notebook cells.

Under the spawn (and forkserver) start method a child process imports the worker function by
module and name; a function defined in a notebook cell lives in `__main__`, which the child
cannot import. So every function a child runs is in this package.

- `data`: the scikit-learn digits set as tensors (offline, fixed split).
- `model`: the MLP, `TrainConfig`, `TrainResult`.
- `hogwild`: `run_hogwild()`, `run_single()`, the `train()` worker; CLI.
- `hogwild_parts`: one worker per Hogwild ingredient (a shared step, a lost update, sparse SGD).
- `evidence`: `check_sharing()`: proof that workers share the parent's parameters.
- `ddp`: `run_ddp()` with DistributedDataParallel (gloo); CLI, also under torchrun; the
  `ddp_replica()` worker that reports what one rank saw.
"""
