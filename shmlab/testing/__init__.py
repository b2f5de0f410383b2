"""The test kit, as torch keeps ``torch.testing._internal``: what tests and the stress tool attack.

- ``faults``: stalls, observer floods, oversized STATUS, bad lines: faults for a manager.
- ``family``: ``Family``, a producer/consumer pair of holders, and ``wait_reclaimed``.
- ``fault_trial``: ``run_fault_trial``, ``FAULT_KINDS``: a live family under one fault.
- ``stress``: ``python -m shmlab stress``: families killed at random points, and what they left.

Nothing in the core imports this package.
"""
