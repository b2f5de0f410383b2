"""Evidence that Hogwild workers share the parent's parameters instead of copying them.

Four observations, from the parent and from each child:
- `is_shared()`: the parameter's storage lives in shared memory;
- torch's identity of the storage: with the file_descriptor strategy, the (st_ino, st_dev) of
  the storage's fd (the key torch's `fd_id()` caches received storages by), with file_system,
  the shm file name. Same identity = same memory;
- the kernel's view: the file that /proc/self/maps says backs the parameter's address, with its
  inode. Under file_descriptor its name ends in "(deleted)": torch unlinked it at once, and only
  the open fds and mappings keep the memory alive;
- a marker: each child writes a value into a parameter; the parent reads it after the join.

`data_ptr()` is reported too, as a lesson: under fork it is equal in parent and child (the child
inherits the address space), under spawn it differs (the child maps the same memory at another
address). Equal addresses are not proof of sharing, and different ones are not proof of copying.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import torch
import torch.multiprocessing as mp

from shmlab.examples.model import make_model

MARKER = 1000.0  # child `rank` writes MARKER + rank into element `rank` of the first weight


def storage_identity(t: torch.Tensor, strategy: str | None = None):
    """What identifies the shared memory behind t: ('file_descriptor', st_ino, st_dev),
    ('file_system', name), or None if t's storage is not shared."""
    storage = t.untyped_storage()
    if not storage.is_shared():
        return None
    strategy = strategy or mp.get_sharing_strategy()
    if strategy == "file_system":
        _, name, _ = storage._share_filename_cpu_()  # (manager handle, shm name, size)
        return ("file_system", name.decode())
    # Already shared, so this returns the fd the storage keeps open; it creates nothing.
    fd, _ = storage._share_fd_cpu_()
    st = os.fstat(fd)
    return ("file_descriptor", st.st_ino, st.st_dev)


def mapped_file(t: torch.Tensor):
    """(st_ino, st_dev, path) of the file mapped at t's address in this process, or None."""
    ptr = t.untyped_storage().data_ptr()
    with open("/proc/self/maps") as maps:
        for line in maps:  # "start-end perms offset major:minor inode   path"
            fields = line.split(maxsplit=5)
            start, end = (int(a, 16) for a in fields[0].split("-"))
            if start <= ptr < end:
                major, minor = (int(n, 16) for n in fields[3].split(":"))
                path = fields[5].strip() if len(fields) > 5 else ""
                return int(fields[4]), os.makedev(major, minor), path
    return None


def parameter_report(model: torch.nn.Module, strategy: str | None = None) -> list[dict]:
    """One row per parameter: name, data_ptr, is_shared and storage identity, in this process."""
    return [{"name": name, "pid": os.getpid(), "data_ptr": p.data_ptr(),
             "is_shared": p.is_shared(), "identity": storage_identity(p, strategy),
             "mapping": mapped_file(p)}
            for name, p in model.named_parameters()]


def _child(rank, model, strategy, q):
    """Report what this child sees, then write a marker the parent should see."""
    rows = parameter_report(model, strategy)
    with torch.no_grad():
        next(model.parameters()).view(-1)[rank] = MARKER + rank
    q.put((rank, rows))


@dataclass
class SharingEvidence:
    start_method: str
    strategy: str
    parent: list[dict]
    children: dict[int, list[dict]] = field(default_factory=dict)
    markers_seen: list[bool] = field(default_factory=list)  # by the parent, one per child

    @property
    def same_storage(self) -> bool:
        """Every child's parameters are backed by the very storages the parent has."""
        def key(rows):  # the storage identity, and the mapped file's inode and device
            return [(r["identity"], r["mapping"] and r["mapping"][:2]) for r in rows]

        ids = key(self.parent)
        complete = all(i is not None and m is not None for i, m in ids)
        return complete and all(key(rows) == ids for rows in self.children.values())

    def table(self) -> str:
        lines = [f"start method={self.start_method}  sharing strategy={self.strategy}",
                 f"{'process':>10} {'parameter':10} {'data_ptr':>16} shared  identity"]
        for who, rows in [("parent", self.parent)] + [(f"child {r}", rows) for r, rows
                                                      in sorted(self.children.items())]:
            for row in rows:
                lines.append(f"{who:>10} {row['name']:10} {row['data_ptr']:16x} "
                             f"{row['is_shared']!s:6}  {row['identity']}  {row['mapping'][2]}")
        lines.append(f"markers written by children seen by the parent: {self.markers_seen}")
        return "\n".join(lines)


def check_sharing(processes: int = 2, start_method: str | None = None,
                  model: torch.nn.Module | None = None, timeout: float = 60.0) -> SharingEvidence:
    """Share `model` (default: a fresh MLP), let children report and write markers; compare."""
    model = model if model is not None else make_model()
    if processes > next(model.parameters()).numel():
        raise ValueError("more processes than elements in the first parameter to mark")
    model.share_memory()
    strategy = mp.get_sharing_strategy()
    ctx = mp.get_context(start_method)
    ev = SharingEvidence(ctx.get_start_method(), strategy, parameter_report(model, strategy))
    q = ctx.Queue()
    procs = [ctx.Process(target=_child, args=(r, model, strategy, q), daemon=True)
             for r in range(processes)]
    try:
        for p in procs:
            p.start()
        for _ in procs:
            rank, rows = q.get(timeout=timeout)
            ev.children[rank] = rows
    finally:
        for p in procs:
            if p.pid is None:  # never started: start() of an earlier one raised
                continue
            p.join(timeout=timeout)
            if p.is_alive():
                p.terminate()
                p.join()
        q.close()
    first = next(model.parameters()).detach().view(-1)
    ev.markers_seen = [first[r].item() == MARKER + r for r in range(processes)]
    return ev


if __name__ == "__main__":
    for method in ("fork", "spawn"):
        print(check_sharing(2, method).table(), end="\n\n")
