"""The grader's trust anchors: hashed instructor copies, and a fingerprint of the check code.

Two questions, answered before a learner's line runs and again after:

* Are the instructor copies the ones the package shipped? ``SHA256SUMS`` next to them records
  each copy's hash; ``load_sources`` refuses a copy that differs (``IntegrityError`` names it)
  and returns the verified texts, which the whole batch then grades from memory. Grading never
  writes a source; ``changed_sources`` tells the batch that a notebook wrote one.
* Is the check code the code the grader imported? ``fingerprint()`` records the identity of
  every function, code object, default-argument tuple and class method in the watched modules
  (``shmlab.*``, the stdlib modules the checks use, a few of ``torch``'s and ``numpy``'s) and of
  the modules themselves in ``sys.modules``. Patching ``Cases.check``, rebinding a lab module,
  swapping a builtin or a ``__code__`` changes an identity; ``differences`` lists which.
"""

from __future__ import annotations

import hashlib
import os
import sys
import types
from pathlib import Path

SUMS = "SHA256SUMS"
# The stdlib modules a check leans on: patch one of their functions and a check can be fooled.
_STDLIB = ("builtins", "os", "posix", "posixpath", "socket", "_socket", "fcntl", "mmap", "time",
           "traceback", "contextlib", "selectors", "signal", "struct", "gc", "json", "io",
           "pickle", "copyreg", "_posixshmem", "threading", "multiprocessing",
           "multiprocessing.reduction", "multiprocessing.connection", "multiprocessing.context")
# Big libraries rewrap some of their own functions lazily (torch.manual_seed, on first use):
# only the few names a check calls are watched there.
_LIBRARY_NAMES = {"torch": ("equal", "allclose", "set_num_threads", "no_grad", "zeros"),
                  "numpy": ("arange", "array_equal", "asarray")}


class IntegrityError(RuntimeError):
    """An instructor copy (or its hash list) is not what the package recorded."""


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def read_sums(source_dir) -> dict[str, str]:
    path = Path(source_dir) / SUMS
    if not path.is_file():
        raise IntegrityError(f"{path} is missing: the instructor copies in {source_dir} cannot "
                             "be verified (an instructor who edited them records new hashes "
                             f"with: python -m shmlab.labs hash {source_dir})")
    sums = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            hexdigest, _, name = line.strip().partition("  ")
            sums[name] = hexdigest
    return sums


def write_sums(source_dir) -> Path:
    """Record each ``*.ipynb``'s hash in ``source_dir``: an instructor's act, never grading's."""
    source_dir = Path(source_dir)
    lines = [f"{digest(p.read_bytes())}  {p.name}" for p in sorted(source_dir.glob("*.ipynb"))]
    (source_dir / SUMS).write_text("\n".join(lines) + "\n", encoding="utf-8")
    return source_dir / SUMS


def load_sources(source_dir) -> dict[str, bytes]:
    """Every instructor copy in ``source_dir``, verified against ``SHA256SUMS``: {name: bytes}."""
    source_dir = Path(source_dir)
    if not source_dir.is_dir():
        raise IntegrityError(f"{source_dir} is not a folder of instructor copies")
    sums = read_sums(source_dir)
    found = {p.name: p.read_bytes() for p in source_dir.glob("*.ipynb")}
    for name in sorted(set(sums) | set(found)):
        if name not in found:
            raise IntegrityError(f"{source_dir / name} is listed in {SUMS} but missing")
        if sums.get(name) != digest(found[name]):
            raise IntegrityError(
                f"{source_dir / name} was modified: its sha256 is {digest(found[name])[:16]}..., "
                f"{SUMS} records {(sums.get(name) or 'nothing')[:16]}...; refusing to grade "
                "with it (reinstall shmlab, or, if you edited it on purpose, run: "
                f"python -m shmlab.labs hash {source_dir})")
    return found


def changed_sources(source_dir, verified: dict[str, bytes]) -> list[str]:
    """Names whose file (or hash list) no longer matches what the batch verified at its start."""
    source_dir = Path(source_dir)
    changed = [n for n, data in verified.items()
               if not (source_dir / n).is_file() or (source_dir / n).read_bytes() != data]
    extra = {p.name for p in source_dir.glob("*.ipynb")} - set(verified)
    return sorted(changed + sorted(extra))


def _watched(name: str) -> bool:
    return name == "shmlab" or name.startswith("shmlab.") or name in _STDLIB


def fingerprint() -> dict[tuple, int]:
    """``{where: id(object)}`` for the code a check runs; compare two with ``differences``."""
    fp: dict[tuple, int] = {("sys.gettrace",): id(sys.gettrace()),
                            ("sys.getprofile",): id(sys.getprofile())}
    for modname, module in list(sys.modules.items()):
        if not isinstance(module, types.ModuleType):
            continue
        if modname in _LIBRARY_NAMES:
            fp[("sys.modules", modname)] = id(module)
            for attr in _LIBRARY_NAMES[modname]:
                _record(fp, (modname, attr), getattr(module, attr, None), own=False)
        elif _watched(modname):
            fp[("sys.modules", modname)] = id(module)
            for attr, value in list(vars(module).items()):
                _record(fp, (modname, attr), value, own=modname.startswith("shmlab"))
    return fp


def _record(fp: dict, where: tuple, value, own: bool) -> None:
    if isinstance(value, (types.FunctionType, types.BuiltinFunctionType, types.ModuleType,
                          type)):
        fp[where] = id(value)
    if isinstance(value, types.FunctionType):
        # Immutable, so identity is enough: a new __code__ or __defaults__ is a new object.
        for part in ("__code__", "__defaults__", "__kwdefaults__"):
            fp[(*where, part)] = id(getattr(value, part))
    elif isinstance(value, type) and (own or value.__module__ == where[0]):
        for attr, member in list(vars(value).items()):
            if callable(member) or isinstance(member, (property, classmethod, staticmethod)):
                fp[(*where, attr)] = id(member)
                if isinstance(member, types.FunctionType):
                    fp[(*where, attr, "__code__")] = id(member.__code__)


def differences(before: dict, after: dict) -> list[str]:
    """What a learner's code replaced: entries whose object changed or went away.

    New entries are ignored: importing a module or a lazily created attribute is not a patch
    (``forged_modules`` looks at new modules). A replaced module comes first: it explains the
    attributes that went with it.
    """
    changed = (f"sys.modules[{k[1]}]" if k[0] == "sys.modules" else ".".join(map(str, k))
               for k, v in before.items() if after.get(k) != v)
    return sorted(changed, key=lambda name: (not name.startswith("sys.modules["), name))


def forged_modules(known) -> list[str]:
    """Watched modules imported since ``known`` (a set of names) that did not come from a file.

    A check may import a module lazily (``shmlab.introspect`` in ``Cases``); a learner who put
    a stand-in into ``sys.modules`` first is not a *changed* entry, so ``differences`` cannot
    see it. A genuine module has a spec whose origin is a file (or is built in), and every
    function and method it defines was compiled from that file.
    """
    forged = []
    for name, module in list(sys.modules.items()):
        if name in known or not (_watched(name) or name in _LIBRARY_NAMES):
            continue
        why = _not_genuine(name, module)
        if why:
            forged.append(f"sys.modules[{name}] ({why})")
    return sorted(forged)


def _not_genuine(name: str, module) -> str:
    if not isinstance(module, types.ModuleType):
        return f"a {type(module).__name__}, not a module"
    origin = getattr(getattr(module, "__spec__", None), "origin", None)
    if origin == "frozen":  # the stdlib's frozen modules (os, posixpath...) name their code so
        origin = f"<frozen {name}>"
    elif origin != "built-in" and not (origin and os.path.isfile(origin)):
        return "not loaded from a file"
    if name in _LIBRARY_NAMES:  # big libraries re-export functions of their submodules
        return ""
    for attr, value in list(vars(module).items()):
        # Module-level functions only: a class's methods may be generated elsewhere (enum,
        # namedtuple, dataclass), and a decorated function says so with __wrapped__.
        if (isinstance(value, types.FunctionType) and value.__module__ == name
                and not hasattr(value, "__wrapped__")
                and value.__code__.co_filename != origin):
            return f"{attr} was compiled from {value.__code__.co_filename}, not {origin}"
    return ""


def grader_files() -> dict[str, str]:
    """Hashes of the grader's own Python files, so a batch sees a notebook rewrite them."""
    here = Path(__file__).resolve().parent
    return {p.name: digest(p.read_bytes()) for p in sorted(here.glob("*.py"))}


def is_learner_frame(filename: str) -> bool:
    """True for a frame of the learner's own cells (the runner names them ``<answer ...>``)."""
    return filename.startswith("<answer") or filename.startswith("<ipython-input") or (
        os.sep + "ipykernel_" in filename)
