"""The trace as data: ``Event``, ``ProcessInfo``, ``Trace`` (hops, JSON), and the errors.

A ``Trace`` is what ``with trace() as tr`` fills: every event of every process of the family,
Python-level hops and system calls on one clock (Note [One clock for every process] in
``shmlab.trace.recorder``), the processes with their labels, the honest limits of what was
seen, and the tracer's own overhead. Drawing it is ``shmlab.trace.render``.

Mirrors: nothing in torch; a plain record of what the recorder and strace saw.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

LAYERS = ("python", "syscall")


class TraceError(RuntimeError):
    """The trace cannot be taken as asked (ptrace refused, strace failed to attach)."""


class StraceUnavailable(TraceError):
    """``syscalls=True`` but there is no strace to run."""


@dataclass(frozen=True)
class Event:
    t: float  # CLOCK_REALTIME seconds, the start of the step
    pid: int
    tid: int
    thread: str
    layer: str  # "python" | "syscall"
    name: str
    lib: str | None  # "torch", "shmlab", "multiprocessing", None (a system call)
    detail: str
    segment: str | None  # "/torch_1_2_0": the shm name that ties sender and receiver
    fd: int | None
    duration: float | None

    @property
    def end(self) -> float:
        return self.t + (self.duration or 0.0)


def step_of(e: Event) -> str | None:
    """The handout's word for an event, the same for torch and shmlab (None: not a step).

    create, open, map, unmap, unlink, close: the segment's system calls; send fd / receive
    fd: ``SCM_RIGHTS``; register / free: a message to the manager's socket; pickle /
    unpickle: the queue's bytes; refcount +1 / refcount -1: shmlab's count in the header,
    and torch's in-flight count (``_shared_incref``/``_shared_decref``; its header count
    itself changes by atomics no tracer sees)."""
    if e.layer == "syscall":
        if e.name == "openat":
            return "create" if "O_CREAT" in e.detail else "open"
        if e.name in ("sendmsg", "recvmsg") and "SCM_RIGHTS" in e.detail:
            return "send fd" if e.name == "sendmsg" else "receive fd"
        if "to the manager:" in e.detail:
            said = e.detail.split("to the manager:", 1)[1]
            return "free" if ("FREE" in said or "AllocInfo free" in said) else "register"
        return {"mmap": "map", "munmap": "unmap", "unlink": "unlink",
                "close": "close"}.get(e.name)
    if e.lib == "torch" and e.name in ("_shared_incref", "_shared_decref"):
        return "refcount +1" if e.name == "_shared_incref" else "refcount -1"
    return {"ForkingPickler.dumps": "pickle", "ForkingPickler.loads": "unpickle",
            "incref": "refcount +1", "attach_refcounted": "refcount +1",
            "decref": "refcount -1"}.get(e.name)  # shmlab's _shared_*: their incref/decref


@dataclass
class ProcessInfo:
    pid: int
    ppid: int | None
    label: str  # "main", "child 1", "manager", "resource_tracker", "forkserver"
    argv: list[str] = field(default_factory=list)


@dataclass
class Trace:
    events: list[Event] = field(default_factory=list)
    processes: dict[int, ProcessInfo] = field(default_factory=dict)
    limits: list[str] = field(default_factory=list)
    overhead: dict = field(default_factory=dict)
    running: bool = field(default=False, compare=False)  # True while the block records
    _poll: object = field(default=None, repr=False, compare=False)  # live reader, while running

    # -- reading ---------------------------------------------------------------------------
    def poll(self) -> list[Event]:
        """The events recorded since the last poll (readable while the block runs)."""
        return self._poll() if callable(self._poll) else []

    def hops(self, pid: int | None = None, layer: str | None = None,
             segment: str | None = None) -> list[str]:
        """The events' names in time order, of one process and/or one layer (for asserts)."""
        if layer is not None and layer not in LAYERS:
            raise ValueError(f"layer must be one of {LAYERS} or None, not {layer!r}")
        return [e.name for e in self.events
                if (pid is None or e.pid == pid) and (layer is None or e.layer == layer)
                and (segment is None or e.segment == segment)]

    def steps(self, pid: int | None = None, segment: str | None = None,
              layer: str | None = None) -> list[str]:
        """The handout's steps (``step_of``) in time order: what a hidden test asserts."""
        out = []
        for e in self.events:
            if (pid is None or e.pid == pid) and (segment is None or e.segment == segment) \
                    and (layer is None or e.layer == layer):
                step = step_of(e)
                if step is not None:
                    out.append(step)
        return out

    def segments(self) -> list[str]:
        """The segments the trace saw, in order of first appearance."""
        return list(dict.fromkeys(e.segment for e in self.events if e.segment))

    def pids(self, label_prefix: str = "") -> list[int]:
        return [p.pid for p in self.processes.values() if p.label.startswith(label_prefix)]

    # -- JSON ------------------------------------------------------------------------------
    def to_json(self) -> str:
        return json.dumps({"events": [asdict(e) for e in self.events],
                           "processes": [asdict(p) for p in self.processes.values()],
                           "limits": self.limits, "overhead": self.overhead}, indent=1)

    @classmethod
    def from_json(cls, text: str) -> Trace:
        data = json.loads(text)
        try:
            return cls(events=[Event(**e) for e in data["events"]],
                       processes={p["pid"]: ProcessInfo(**p) for p in data["processes"]},
                       limits=list(data.get("limits", [])),
                       overhead=dict(data.get("overhead", {})))
        except (KeyError, TypeError) as exc:
            raise ValueError(f"not a trace written by Trace.to_json: {exc}") from None

    # -- pictures (shmlab.trace.render) ------------------------------------------------------
    def to_mermaid(self) -> str:
        from .render import mermaid
        return mermaid(self)

    def table(self) -> str:
        from .render import table
        return table(self)

    def show(self) -> None:
        from .render import show
        show(self)
