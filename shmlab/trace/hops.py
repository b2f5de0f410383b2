"""Which calls are hops of a tensor's journey, and what each one says about the segment.

A *hop* is a function the tracer reports: ``reduce_storage``, ``DupFd``, ``rebuild_storage_fd``,
``Queue.put``... ``PYTHON_HOPS`` names the Python functions by the file they live in and their
qualified name (never by importing them: a new interpreter records before torch is imported,
and the tracer must not import torch for a learner who traces shmlab alone); ``C_HOPS`` names
torch's C methods (``_new_shared_fd_cpu``...) by their ``__name__``, as ``sys.setprofile``
reports a ``c_call``. Each hop has a *reader* that finds, in the call's arguments or its
return value, the segment's name, the fd and a short detail.

This module is loaded by file path in a new interpreter (Note [Recording in a new
interpreter] in ``shmlab.trace.session``): it imports the standard library only.

Mirrors: nothing in torch; it names the hops of torch/multiprocessing/reductions.py,
torch/storage.py, CPython's multiprocessing (queues.py, reduction.py, resource_sharer.py) and
their shmlab twins (shmlab/multiprocessing/reductions.py, shmlab/storage.py, shmlab/_shm/,
shmlab/manager/client.py).
"""

from __future__ import annotations

import os
import socket
import struct

SHM_PREFIX = "/dev/shm"


def segment_of_fd(fd) -> str | None:
    """The /dev/shm name an fd of this process opens ("/torch_1_2_0"), deleted or not."""
    if not isinstance(fd, int) or fd < 0:
        return None
    try:
        target = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return None
    return segment_of_path(target)


def segment_of_path(path) -> str | None:
    if isinstance(path, bytes):
        path = path.decode(errors="replace")
    if not isinstance(path, str):
        return None
    path = path.removesuffix(" (deleted)")
    if path.startswith(SHM_PREFIX + "/"):
        return path[len(SHM_PREFIX):]
    if path.startswith("/") and path.count("/") == 1 and len(path) > 1:
        return path  # already a shm name: "/torch_1_2_0" (torch's handle), "/shmlab_..."
    return None


def _inode(fd) -> str:
    try:
        return f", inode {os.fstat(fd).st_ino}"
    except (OSError, TypeError):
        return ""


# --- readers: (locals at the call, the return value or None) -> (segment, fd, detail) --------
def _nothing(args, ret):
    return None, None, ""


def _fd_arg(args, ret):
    fd = args.get("fd")
    return segment_of_fd(fd), fd, f"fd {fd}{_inode(fd)}"


def _fd_ret(args, ret):
    fd = ret if isinstance(ret, int) else None
    return segment_of_fd(fd), fd, f"fd {fd}{_inode(fd)}" if fd is not None else ""


def _fd_size_ret(args, ret):  # _share_fd_cpu_ -> (fd, size)
    if isinstance(ret, tuple) and len(ret) == 2:
        fd, size = ret
        return segment_of_fd(fd), fd, f"fd {fd}, {size} bytes{_inode(fd)}"
    return None, None, ""


def _filename_ret(args, ret):  # _share_filename_cpu_ -> (manager, handle, size)
    if isinstance(ret, tuple) and len(ret) >= 3:
        manager, handle, size = ret[:3]
        return (segment_of_path(handle), None,
                f"{size} bytes, manager {_text(manager)}")
    return None, None, ""


def _fds_arg(args, ret):  # sendfds(sock, fds)
    fds = list(args.get("fds") or [])
    return (segment_of_fd(fds[0]) if fds else None, fds[0] if fds else None,
            f"SCM_RIGHTS fds {fds}")


def _fds_ret(args, ret):  # recvfds -> list of fds
    fds = list(ret) if isinstance(ret, list | tuple) else []
    return (segment_of_fd(fds[0]) if fds else None, fds[0] if fds else None,
            f"SCM_RIGHTS fds {fds}" if fds else "")


def _handle_arg(args, ret):  # rebuild_storage_filename(cls, manager, handle, size)
    return (segment_of_path(args.get("handle")), None,
            f"{args.get('size')} bytes, manager {_text(args.get('manager'))}")


def _name_arg(args, ret):  # shmlab's create/attach/incref/decref(name, ...)
    name = args.get("name")
    name = "/" + name.lstrip("/") if isinstance(name, str) else name
    detail = f"refcount now {ret}" if isinstance(ret, int) else ""
    return segment_of_path(name), None, detail


def _created_ret(args, ret):  # create_unlinked -> (fd, Mapping)
    fd = ret[0] if isinstance(ret, tuple) and ret else None
    return segment_of_fd(fd), fd, f"fd {fd}{_inode(fd)}" if fd is not None else ""


def _reduced(args, ret):  # reduce_storage -> (rebuild, args)
    if isinstance(ret, tuple) and len(ret) == 2 and callable(ret[0]):
        return None, None, f"-> {getattr(ret[0], '__name__', '?')}"
    return None, None, ""


def _payload(args, ret):  # Queue.put(obj) / Queue.get() -> obj
    obj = args.get("obj") if ret is None else ret
    return None, None, type(obj).__name__ if obj is not None else ""


def _pickled(args, ret):  # ForkingPickler.dumps -> bytes
    return None, None, f"{len(ret)} bytes" if isinstance(ret, bytes | memoryview) else ""


def _unpickled(args, ret):  # pickle.loads, called by Queue.get: its `res` is the message
    res = args.get("res")
    return None, None, f"{len(res)} bytes" if isinstance(res, bytes) else ""


def _manager_request(args, ret):  # ManagerClient.register/join/free(self, name)
    name = args.get("name")
    name = name.decode() if isinstance(name, bytes) else name
    seg = segment_of_path("/" + name.lstrip("/")) if isinstance(name, str) else None
    client = args.get("self")
    handle = getattr(client, "handle", b"")
    return seg, None, f"to {_text(handle)}{_manager_pid(client)}"


def _manager_pid(client) -> str:
    """The daemon's pid, from the connected socket's peer credentials (Linux)."""
    sock = getattr(client, "_sock", None)
    try:
        raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        return f" (manager pid {struct.unpack('3i', raw)[0]})"
    except (AttributeError, OSError):
        return ""


def _released(args, ret):  # shmlab.storage._release(kind, fd, name, manager, pid)
    name = args.get("name")
    if isinstance(name, str):
        return segment_of_path("/" + name.lstrip("/")), None, f"{args.get('kind')}"
    fd = args.get("fd")
    return segment_of_fd(fd), fd, f"{args.get('kind')}, fd {fd}"


def _caller_handle(args, ret):  # torch's C calls: the caller's `fd`, `handle` or `metadata`
    fd = args.get("fd")
    if isinstance(fd, int):
        return segment_of_fd(fd), fd, f"fd {fd}"
    handle = args.get("handle")
    if handle is None and isinstance(args.get("metadata"), tuple) and len(args["metadata"]) > 1:
        handle = args["metadata"][1]
    return segment_of_path(handle), None, ""


def _text(value) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


# A hop: (event name, lib, mode, reader). mode "span": reported when it returns, with its
# duration; "mark": reported when it starts (a thread's loop, which returns only at its end).
STDLIB = "multiprocessing"
_MP = {
    "multiprocessing/queues.py": {
        "Queue.put": ("Queue.put", "span", _payload),
        "Queue.get": ("Queue.get", "span", _payload),
        "Queue._feed": ("Queue._feed", "mark", _nothing),
        "SimpleQueue.put": ("SimpleQueue.put", "span", _payload),
        "SimpleQueue.get": ("SimpleQueue.get", "span", _payload),
    },
    "multiprocessing/reduction.py": {
        "ForkingPickler.dumps": ("ForkingPickler.dumps", "span", _pickled),
        "DupFd": ("DupFd", "span", _fd_arg),
        "sendfds": ("sendfds", "span", _fds_arg),
        "recvfds": ("recvfds", "span", _fds_ret),
    },
    "multiprocessing/resource_sharer.py": {
        "DupFd.detach": ("DupFd.detach", "span", _fd_ret),
        "_ResourceSharer._serve": ("resource_sharer._serve", "mark", _nothing),
    },
}
_REDUCTIONS = {
    "reduce_tensor": ("reduce_tensor", "span", _nothing),
    "reduce_storage": ("reduce_storage", "span", _reduced),
    "rebuild_tensor": ("rebuild_tensor", "span", _nothing),
    "rebuild_storage_fd": ("rebuild_storage_fd", "span", _nothing),
    "rebuild_storage_filename": ("rebuild_storage_filename", "span", _handle_arg),
    "rebuild_storage_empty": ("rebuild_storage_empty", "span", _nothing),
    "storage_from_cache": ("storage_from_cache", "span", _nothing),
    "SharedCache.__setitem__": ("SharedCache.__setitem__", "span", _nothing),
}
_STORAGE = {
    "UntypedStorage.share_memory_": ("share_memory_", "span", _nothing),
    "UntypedStorage._share_fd_cpu_": ("_share_fd_cpu_", "span", _fd_size_ret),
    "UntypedStorage._share_filename_cpu_": ("_share_filename_cpu_", "span", _filename_ret),
    "UntypedStorage._new_shared_fd_cpu": ("_new_shared_fd_cpu", "span", _fd_arg),
    "UntypedStorage._new_shared_filename_cpu": ("_new_shared_filename_cpu", "span",
                                                _handle_arg),
    "UntypedStorage._shared_incref": ("_shared_incref", "span", _nothing),
    "UntypedStorage._shared_decref": ("_shared_decref", "span", _nothing),
}
# file suffix -> (lib, {qualname: (name, mode, reader)})
PYTHON_HOPS = {
    **{suffix: (STDLIB, table) for suffix, table in _MP.items()},
    "torch/multiprocessing/reductions.py": ("torch", _REDUCTIONS),
    "torch/storage.py": ("torch", {k: v for k, v in _STORAGE.items()
                                   if k in ("UntypedStorage.share_memory_",
                                            "UntypedStorage._share_fd_cpu_",
                                            "UntypedStorage._share_filename_cpu_")}),
    "shmlab/multiprocessing/reductions.py": ("shmlab", _REDUCTIONS),
    "shmlab/storage.py": ("shmlab", {**_STORAGE,
                                     "_release": ("release", "span", _released)}),
    "shmlab/_shm/unlinked.py": ("shmlab", {
        "create_unlinked": ("create_unlinked", "span", _created_ret),
        "map_fd": ("map_fd", "span", _fd_arg)}),
    "shmlab/_shm/refcounted.py": ("shmlab", {
        "create_refcounted": ("create_refcounted", "span", _name_arg),
        "attach_refcounted": ("attach_refcounted", "span", _name_arg),
        "incref": ("incref", "span", _name_arg),
        "decref": ("decref", "span", _name_arg)}),
    "shmlab/manager/client.py": ("shmlab", {
        "ManagerClient.register": ("ManagerClient.register", "span", _manager_request),
        "ManagerClient.join": ("ManagerClient.join", "span", _manager_request),
        "ManagerClient.free": ("ManagerClient.free", "span", _manager_request),
        "_start_manager": ("start manager", "span", _nothing)}),
}
# torch's C methods, seen as c_call from the Python that calls them (the reader gets the
# caller's locals): the Python-level twins above are torch/storage.py's wrappers.
C_HOPS = {
    "_new_shared_fd_cpu": ("_new_shared_fd_cpu", "torch", _caller_handle),
    "_new_shared_filename_cpu": ("_new_shared_filename_cpu", "torch", _caller_handle),
    "_shared_incref": ("_shared_incref", "torch", _caller_handle),
    "_shared_decref": ("_shared_decref", "torch", _caller_handle),
}
# pickle's C loads, as Queue.get calls it (`_ForkingPickler.loads(res)`)
C_LOADS = ("ForkingPickler.loads", STDLIB, _unpickled)


def lookup(code) -> tuple | None:
    """(name, lib, mode, reader) for a code object that is a hop, else None."""
    filename = code.co_filename.replace(os.sep, "/")
    for suffix, (lib, table) in PYTHON_HOPS.items():
        if filename.endswith("/" + suffix):
            hop = table.get(code.co_qualname)
            return (hop[0], lib, hop[1], hop[2]) if hop else None
    return None
