"""The learner's process: runs the notebook's cells, and serves their namespace to the checker.

Mirrors: nothing in torch; an RPC server in the style of ``torch.distributed.rpc``'s owner of
``RRef``s: the objects stay here, the check process holds handles (``wire``, ``remote``).

The check process (``outside.run_outside``) starts it (``remote.Learner``) with two pipes, RFD
and WFD, and nothing else of its own. First, before any import, this process puts itself out of
the check process's reach in the other direction: it enters a user namespace of its own
(``sandbox.own_user_namespace``; where the kernel refuses, it says so and stays), so it holds no
capability over the check process's namespace and cannot ``ptrace`` it or open its
``/proc/<pid>/fd`` or ``/proc/<pid>/mem`` (the check process is not dumpable).
Then it answers one JSON request per line on RFD, one
reply per line on WFD:

* ``cells``: run the job's cells as the runner does (``runner.run_cells``), streaming
  ``{"cell": label}`` before each; the reply is the exercise's failure, or None;
* ``names``: the notebook's names, as data or handles;
* ``call``, ``getattr``, ``getitem``, ``bool``, ``len``, ``iter``, ``next``, ``callable``,
  ``repr``: one
  operation on an object a handle names;
* ``run``: a routine of the check modules (``shmlab.*``, named ``module:qualname``) called with
  the arguments given, e.g. ``report.run_in_child`` to fork a child that runs the learner's
  code concurrently;
* ``integrity``: what of the check code in this process was replaced since the first learner
  cell (a second line of defence for the routines ``run`` calls here).

Every request may carry ``drop``: handles the check side no longer holds, so their objects
(a storage and its fd, say) can die here as they would in the notebook.
"""

from __future__ import annotations

import importlib
import json
import os
import sys

from . import wire


class Server:
    """The handle table and the operations the check process may ask for."""

    def __init__(self, ns: dict):
        self.ns = ns
        self.objects: dict[int, object] = {}
        self.numbers: dict[int, int] = {}  # id(obj) -> handle, so one object has one handle
        self.next = 0
        self.before: dict | None = None
        self.known: set[str] = set()

    def handle(self, obj) -> dict:
        n = self.numbers.get(id(obj))
        if n is None:
            n, self.next = self.next, self.next + 1
            self.objects[n], self.numbers[id(obj)] = obj, n
        return {"h": n}

    def resolve(self, ref):
        if isinstance(ref, int):
            return self.objects[ref]
        module, _, qualname = ref.partition(":")
        if not module.startswith("shmlab."):
            raise ValueError(f"not a check routine: {ref}")
        obj = importlib.import_module(module)
        for part in qualname.split("."):
            obj = getattr(obj, part)
        return obj

    def drop(self, numbers) -> None:
        for n in numbers:
            obj = self.objects.pop(n, None)
            if obj is not None:
                self.numbers.pop(id(obj), None)
            del obj

    def serve(self, request: dict, send) -> object:
        op = request["op"]
        args = wire.decode(request.get("args", []), self.resolve)
        kwargs = wire.decode(request.get("kwargs", {"d": []}), self.resolve)
        target = self.objects.get(request.get("h", -1))
        if op == "cells":
            return self.cells(request["cells"], send)
        if op == "names":
            return {k: v for k, v in self.ns.items()
                    if not k.startswith("__") and k != "display"}
        if op == "call":
            return target(*args, **kwargs)
        if op == "run":
            return self.resolve(request["fn"])(*args, **kwargs)
        if op == "getattr":
            return getattr(target, request["name"])
        if op == "getitem":
            return target[args[0]]
        if op == "bool":
            return bool(target)
        if op == "len":
            return len(target)
        if op == "iter":
            return iter(target)
        if op == "next":
            return next(target)
        if op == "callable":
            return callable(target)
        if op == "repr":
            return repr(target)[:300]
        if op == "gc":
            import gc

            return gc.collect() and None
        if op == "integrity":
            return self.integrity()
        raise ValueError(f"unknown request {op!r}")

    def cells(self, cells: list, send):
        from . import integrity, runner

        failure, _, self.before, self.known = runner.run_cells(
            cells, self.ns, lambda label: send({"cell": label}))
        if self.before is None:
            self.before, self.known = integrity.fingerprint(), set(sys.modules)
        return failure

    def integrity(self) -> list[str]:
        from . import integrity

        return (integrity.differences(self.before or {}, integrity.fingerprint())
                + integrity.forged_modules(self.known))


def _learner_traceback(exc: BaseException) -> str:
    from .runner import _learner_traceback

    return _learner_traceback(exc)


def main(privilege: str) -> None:
    """Serve requests; ``privilege``: why ``sandbox.own_user_namespace`` failed ("" if not)."""
    rfd, wfd = int(sys.argv[1]), int(sys.argv[2])
    requests, replies = os.fdopen(rfd, "r"), os.fdopen(wfd, "w", buffering=1)

    def send(message: dict) -> None:
        replies.write(json.dumps(message) + "\n")
        replies.flush()

    from .runner import _fresh_main

    server = Server(_fresh_main())  # a fork child must find the learner's classes in __main__
    send({"ready": privilege})
    for line in requests:
        request = json.loads(line)
        server.drop(request.get("drop", ()))
        result = None
        try:
            result = server.serve(request, send)
            reply = {"r": wire.encode(result, server.handle)}
        except BaseException as exc:  # Note [Only plain data crosses]: as a builtin
            reply = {"e": wire.encode_error(exc), "tb": _learner_traceback(exc)[-4000:]}
        del result
        try:
            send(reply)
        except (BrokenPipeError, OSError):
            break
        sys.stdout.flush()
    os._exit(0)
