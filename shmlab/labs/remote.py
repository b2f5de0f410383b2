"""The learner's process seen from the check process: ``Learner``, ``Proxy``, and ``place``.

Mirrors: nothing in torch; ``torch.distributed.rpc.RRef`` is the closest (a reference whose
object lives in another process; ``rpc_sync`` runs a function there).

A check is written once and runs in two places (Note [The verdict outside the learner's
process], in ``outside``): in the notebook, on the learner's real objects; in the grader, in
the check process, on ``Proxy``s of them. Where the two must differ (pickling the learner's
object, forking a child that runs the learner's code) the check asks ``place(obj)``, which is
``LOCAL`` for a real object and the ``Learner`` a proxy belongs to: ``at.run(fn, *args)`` runs
the check's own routine ``fn`` next to the object, ``at.run_in_child`` forks there, ``at.pid``
names the process whose ``/proc`` entries and ``/dev/shm`` files to look at from outside.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import weakref

from ..messages import tr
from . import report, sandbox, wire

# The learner's process: ``sandbox.own_user_namespace`` runs before anything is imported (the
# sandbox module is stdlib only, loaded from its file), then ``learner.main`` serves.
_START = ("import sys, importlib.util as u; s = u.spec_from_file_location('_sandbox', "
          "sys.argv.pop(1)); m = u.module_from_spec(s); s.loader.exec_module(m); "
          "why = m.own_user_namespace(); from shmlab.labs.learner import main; main(why)")


class LearnerDied(RuntimeError):
    """The learner's process ended while the check waited for its reply."""


class Learner:
    """The learner's process (``learner.main``), started by and driven from the check process."""

    def __init__(self):
        to_learner, self._requests = os.pipe()
        self._replies, from_learner = os.pipe()
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _START, sandbox.__file__, str(to_learner),
             str(from_learner)],
            pass_fds=(to_learner, from_learner), stdin=subprocess.DEVNULL)
        os.close(to_learner)
        os.close(from_learner)
        self._in = os.fdopen(self._replies, "r")
        self._proxies: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
        self._dropped: list[int] = []
        self.pid = self.proc.pid
        report.OWNERS.add(self.pid)  # its segments are the check's to report (``Cases``)
        self.isolation = self._read()["ready"]

    def _read(self) -> dict:
        line = self._in.readline()
        if not line:
            died = LearnerDied(tr("your code's process ended (os._exit, a crash or a kill) "
                                  "while the check was waiting for it"))
            died.shmlab_learner_traceback = ""  # what ended it was the learner's code
            raise died
        return json.loads(line)

    def _send(self, request: dict) -> None:
        request["drop"], self._dropped = self._dropped, []
        data = (json.dumps(request) + "\n").encode()
        try:
            while data:
                data = data[os.write(self._requests, data):]
        except BrokenPipeError:
            self._read()  # what it said before it went, or LearnerDied
            raise LearnerDied(tr("your code's process ended before the check's request")) \
                from None

    def request(self, op: str, *args, on_cell=None, **fields):
        """Send one request; return its decoded result, or raise what the learner's code
        raised (a fresh builtin exception; its traceback as ``shmlab_learner_traceback``)."""
        fields["op"] = op
        if args:
            fields["args"] = wire.encode(list(args), self._ref)
        self._send(fields)
        while True:
            reply = self._read()
            if "cell" in reply and on_cell is not None:
                on_cell(str(reply["cell"]))
            elif "r" in reply:
                return wire.decode(reply["r"], self._resolve)
            elif "e" in reply:
                exc = wire.decode_error(reply["e"])
                exc.shmlab_learner_traceback = str(reply.get("tb", ""))
                raise exc

    def _ref(self, obj) -> dict:
        if isinstance(obj, Proxy) and obj._learner is self:
            return {"h": obj._handle}
        if callable(obj) and getattr(obj, "__module__", "").startswith("shmlab."):
            return {"fn": f"{obj.__module__}:{obj.__qualname__}"}
        raise TypeError(f"a check may send the learner's process plain data, its own objects "
                        f"and the check's routines, not a {type(obj).__name__}")

    def _resolve(self, ref):
        if not isinstance(ref, int):
            raise ValueError("the learner's process sent a routine name")
        proxy = self._proxies.get(ref)
        if proxy is None:
            proxy = self._proxies[ref] = Proxy(self, ref)
        return proxy

    def run(self, fn, *args, **kwargs):
        """``fn(*args, **kwargs)`` in the learner's process: ``fn`` is a check routine."""
        return self.request("run", *args, fn=self._ref(fn)["fn"],
                            kwargs=wire.encode(kwargs, self._ref))

    def run_in_child(self, fn, *args, timeout: float = 30.0):
        """``report.run_in_child`` there: a fork of the learner's process runs ``fn(*args)``."""
        return self.run(report.run_in_child, fn, *args, timeout=timeout)

    def callable(self, obj) -> bool:
        return isinstance(obj, Proxy) and self.request("callable", h=obj._handle) is True

    def sync(self) -> None:
        """Let the objects the check no longer holds die there now (before counting fds)."""
        import gc

        gc.collect()
        self.request("gc")

    def close(self) -> None:
        report.OWNERS.discard(self.pid)
        try:
            self.proc.kill()
        except ProcessLookupError:
            pass
        self.proc.wait()
        self._in.close()
        os.close(self._requests)


class Proxy:
    """An object of the learner's process: calls, attributes, truth, ``len``, indexing,
    iteration, ``with`` and ``close`` are forwarded; it equals only itself (Note [Only plain data
    crosses])."""

    def __init__(self, learner: Learner, handle: int):
        self._learner, self._handle = learner, handle

    def __getattr__(self, name: str):
        if name.startswith("_Proxy") or name in ("_learner", "_handle"):
            raise AttributeError(name)
        return self._learner.request("getattr", h=self._handle, name=name)

    def __call__(self, *args, **kwargs):
        return self._learner.request("call", *args, h=self._handle,
                                     kwargs=wire.encode(kwargs, self._learner._ref))

    def __bool__(self) -> bool:
        truth = self._learner.request("bool", h=self._handle)
        if type(truth) is not bool:
            raise TypeError("bool() of your object is not a bool")
        return truth

    def __len__(self) -> int:
        n = self._learner.request("len", h=self._handle)
        if type(n) is not int:
            raise TypeError("len() of your object is not an int")
        return n

    def __getitem__(self, key):
        return self._learner.request("getitem", key, h=self._handle)

    def __iter__(self):
        it = self._learner.request("iter", h=self._handle)
        while True:
            try:
                yield self._learner.request("next", h=it._handle)
            except StopIteration:
                return

    def __enter__(self):
        return self.__getattr__("__enter__")()

    def __exit__(self, *exc):
        return self.__getattr__("__exit__")(None, None, None) is True

    def __repr__(self) -> str:
        try:
            return self._learner.request("repr", h=self._handle)
        except Exception:  # noqa: BLE001 - a repr that raises: say what it is, not why
            return "<an object of your code>"

    def __del__(self):
        try:
            self._learner._dropped.append(self._handle)
        except Exception:  # noqa: BLE001 - at interpreter exit the learner may be gone
            pass


class _Local:
    """The notebook's own process: the learner's objects are real, the check runs next to them."""

    pid = property(lambda self: os.getpid())

    @staticmethod
    def run(fn, *args, **kwargs):
        return fn(*args, **kwargs)

    @staticmethod
    def run_in_child(fn, *args, timeout: float = 30.0):
        return report.run_in_child(fn, *args, timeout=timeout)

    callable = staticmethod(callable)

    @staticmethod
    def sync() -> None:
        import gc

        gc.collect()


LOCAL = _Local()


def place(*objs):
    """Where the learner's objects live: their ``Learner``, or ``LOCAL`` for real objects."""
    for obj in objs:
        if isinstance(obj, Proxy):
            return obj._learner
    return LOCAL
