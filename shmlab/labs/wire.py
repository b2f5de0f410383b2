"""What crosses between the check process and the learner's process: data, handles, errors.

Mirrors: nothing in torch; the closest is ``torch.distributed.rpc``'s ``RRef`` (a reference to
an object that stays in its owner's process), without pickle.

Note [Only plain data crosses]
The check process never unpickles anything the learner's process sends: unpickling runs code
the sender chose. A value crosses as JSON only if its type is EXACTLY one of ``None``, ``bool``,
``int``, ``float``, ``str``, ``bytes``, or a ``tuple``, ``list`` or ``dict`` of such values,
checked with ``type(x) is``, never ``isinstance``: a ``float`` subclass whose ``==`` is always
true, or an ``int`` subclass with a custom ``__index__``, is not plain data, so it stays where
it was made and crosses as a *handle* (``{"h": n}``), which the check side wraps in a
``remote.Proxy``. A proxy equals only itself, so such an object never compares equal to what a
check expects. A container's elements are encoded one by one (so ``(rebuild, (x, y))`` crosses
as a real tuple whose first element is a handle); only the exact builtin types are looked
into, so iterating them runs no learner code. An exception crosses as the nearest builtin
class in its MRO and its message (``OSError``s keep their errno): the check side re-raises a
fresh instance of that builtin class, never the learner's.
"""

from __future__ import annotations

import base64
import builtins
import math

_PLAIN = (bool, int, str)
_DEPTH = 32  # deeper nesting (or a list that contains itself) crosses as a handle


def encode(obj, handle, depth: int = 0):
    """``obj`` as JSON-able data; ``handle(x)`` gives the reference (``{"h": n}``, or
    ``{"fn": "module:qualname"}`` for a check routine) for anything not plain."""
    kind = type(obj)
    if obj is None or kind in _PLAIN:
        return obj
    if depth < _DEPTH:
        if kind is float:
            return obj if math.isfinite(obj) else {"f": repr(obj)}
        if kind is bytes:
            return {"b": base64.b64encode(obj).decode()}
        if kind is tuple:
            return {"t": [encode(x, handle, depth + 1) for x in obj]}
        if kind is list:
            return [encode(x, handle, depth + 1) for x in obj]
        if kind is dict:
            return {"d": [[encode(k, handle, depth + 1), encode(v, handle, depth + 1)]
                          for k, v in list(obj.items())]}
    return handle(obj)


def decode(data, resolve):
    """The value ``encode`` made; ``resolve(n)`` gives what handle ``n`` stands for here."""
    if data is None or type(data) in _PLAIN or type(data) is float:
        return data
    if type(data) is list:
        return [decode(x, resolve) for x in data]
    if type(data) is not dict or len(data) != 1:
        raise ValueError(f"not wire data: {type(data).__name__}")
    (tag, value), = data.items()
    if tag == "f":
        return float(value)
    if tag == "b":
        return base64.b64decode(value)
    if tag == "t":
        return tuple(decode(x, resolve) for x in value)
    if tag == "d":
        return {decode(k, resolve): decode(v, resolve) for k, v in value}
    if tag == "h":
        return resolve(int(value))
    if tag == "fn":
        return resolve(str(value))
    raise ValueError(f"not wire data: tag {tag!r}")


def encode_error(exc: BaseException) -> dict:
    """``exc`` as (nearest builtin class, message, errno); never the learner's class itself."""
    base = next(c for c in type(exc).__mro__ if c.__module__ == "builtins")
    try:
        message = str(exc)[:2000]
    except BaseException:  # noqa: BLE001 - a __str__ that raises is the learner's: no message
        message = "(its message could not be read)"
    errno = getattr(exc, "errno", None) if isinstance(exc, OSError) else None
    if type(errno) is int and type(getattr(exc, "strerror", None)) is str:
        message = exc.strerror  # OSError(errno, strerror) rebuilds "[Errno n] strerror"
    return {"type": base.__name__, "message": message,
            "errno": errno if type(errno) is int else None}


def decode_error(data: dict) -> BaseException:
    """A fresh builtin exception from ``encode_error``'s data (an unknown name: RuntimeError)."""
    cls = getattr(builtins, str(data.get("type")), None)
    if not (isinstance(cls, type) and issubclass(cls, BaseException)):
        cls = RuntimeError
    message = str(data.get("message", ""))
    errno = data.get("errno")
    if issubclass(cls, OSError) and type(errno) is int:
        return OSError(errno, message)  # OSError picks the subclass for errno (EEXIST...)
    try:
        return cls(message)
    except TypeError:  # a builtin that needs other arguments (UnicodeError's kin)
        return RuntimeError(f"{cls.__name__}: {message}")
