"""What a manager's client raises: the manager could not be started, reached or trusted.

Mirrors: the std::runtime_error that torch/lib/libshm's client throws (core.cpp, socket.h),
split in two so that a forged handle can be told from a manager that is gone.

Every other module imports these names from here; nothing re-exports them.
"""

from __future__ import annotations

__all__ = ["ManagerError", "NotAManagerError"]


class ManagerError(RuntimeError):
    """The manager could not be started, reached, or refused a request."""


class NotAManagerError(ManagerError):
    """The handle does not lead to a shmlab manager: nothing was sent over it."""
