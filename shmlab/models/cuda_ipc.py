"""A MODEL, on CPU shared memory, of how torch shares CUDA tensors between processes.

Mirrors: torch/csrc/CudaIPCTypes.cpp (CudaIPCSentData, the ref-counter files, the limbo,
CudaIPCCollect) and torch/multiprocessing/reductions.py (reduce_tensor's CUDA branch,
rebuild_cuda_tensor). No GPU is involved: a named shmlab segment stands in for one
``cudaMalloc`` allocation, and its name for the ``cudaIpcMemHandle`` that covers it.

Note [The protocol being modelled]
* A block (a tensor's storage) is a range ``[offset, offset + size)`` inside a segment owned by
  the producer's caching allocator. Sending it sends ``(handle of the whole segment, offset,
  size)`` plus a ref-counter slot: one int64 in a shared counters file of ``SLOTS`` slots
  (torch: 10000 int64 in a RefcountedMapAllocator file). Each send gets a new slot set to 1.
* The consumer maps the segment once per handle, caches the block by ``(handle, offset)``
  (a second arrival releases its own slot at once), and sets its slot to 0 when it frees it.
* A producer that frees a block while any of its slots is > 0 must not give the memory back
  to its allocator (the next ``alloc`` would hand the consumer's bytes to someone else): the
  block goes to the *limbo*. ``ipc_collect()`` returns limbo blocks whose slots are all 0.
* A received block cannot be sent on: "Attempted to send CUDA tensor received from another
  process...". A producer that exits with blocks in limbo warns.
* When the limbo is collected (CudaIPCSentDataDelete, CudaIPCCollect): every time the producer
  frees a block it had sent (after parking it, if it must), and on ``ipc_collect()``; never on a
  send. Adding a block while more than ``WARN_AFTER_BLOCKS_IN_LIMBO`` wait there warns once.
* A counters file retires (CudaIPCRefCountersFile, ReturnRefCounter): a slot is handed back when
  the block it was sent with is really freed, and a file whose ``SLOTS`` slots were all handed
  out and all handed back is closed. ``ipc_collect()`` with an empty limbo also closes the
  current file if none of its slots is out (safe_clean_current_file).
Not modelled: CUDA events (stream sync), devices, and the caching allocator's free-memory
callback that also collects (torch runs it whenever an allocation finds no free cached block,
before ``cudaMalloc``; memory need not run out).
Only the consumer writes a slot after the send and the producer only reads it, so plain int64
stores suffice here where torch uses atomics.
"""

from __future__ import annotations

import atexit
import os
import time
import warnings
from typing import NamedTuple

import numpy as np

from shmlab import _shm

SLOTS = 10_000              # int64 counters per file, as CUDA_IPC_REF_COUNTER_FILE_SIZE
WARN_AFTER_BLOCKS_IN_LIMBO = 1000  # as CUDA_IPC_WARN_AFTER_X_BLOCKS_IN_LIMBO
SEGMENT_SIZE = 64 * 1024    # bytes per "cudaMalloc" segment (torch's small pool: 2 MiB)
RESEND_ERROR = ("Attempted to send CUDA tensor received from another process; this is not "
                "currently supported. Consider cloning before sending.")
LIMBO_WARNING = (f"Producer process tried to deallocate over {WARN_AFTER_BLOCKS_IN_LIMBO} memory "
                 "blocks referred by consumer processes. Deallocation might be significantly "
                 "slowed down.")
EXIT_WARNING = ("Producer process has been terminated before all shared CUDA tensors "
                "released. See Note [Sharing CUDA tensors]")


class IpcHandle(NamedTuple):
    """What travels for one send (rebuild_cuda_tensor's storage_* and ref_counter_* args)."""
    handle: str           # the whole allocation (torch: cudaIpcMemHandle bytes)
    offset: int           # where the block starts inside it
    size: int             # the block's bytes
    counter_handle: str   # the counters file
    counter_offset: int   # this send's slot in it


class _Counters:
    """One counters file: SLOTS int64 slots after the refcount header."""

    def __init__(self, name: str, create: bool):
        size = SLOTS * 8
        self.name = name
        self.mapping = (_shm.create_refcounted if create else _shm.attach_refcounted)(name, size)
        self.slots = np.frombuffer(self.mapping.buffer(_shm.HEADER_SIZE), np.int64, SLOTS)
        self.next = 0  # the next slot to hand out: slots are never reused (rotate_offset)
        self.used = 0  # slots handed out whose block is not freed yet (used_slots_)

    def close(self) -> None:
        self.slots = None
        _shm.decref(self.name)


class Block:
    """A tensor's storage: ``size`` bytes at ``offset`` in a segment (``handle``)."""

    def __init__(self, handle: str, offset: int, size: int, mapping, received: bool):
        self.handle, self.offset, self.size, self.received = handle, offset, size, received
        self._mapping, self.sends, self.freed = mapping, [], False  # sends: [(counters, slot)]

    def numpy(self, dtype=np.uint8) -> np.ndarray:
        """A zero-copy view of the block's bytes."""
        buf = self._mapping.buffer(_shm.HEADER_SIZE + self.offset)
        return np.frombuffer(buf, dtype, self.size // np.dtype(dtype).itemsize)

    def counters(self) -> list[int]:
        """The value of every slot this block was sent with (producer side)."""
        if self.received:
            raise RuntimeError("only the producer reads a block's counters")
        # a retired file (closed) had every slot handed back: nothing is counted there
        return [int(c.slots[i]) if c.slots is not None else 0 for c, i in self.sends]

    def free(self, limbo: bool = True) -> str:
        """``del tensor``: the producer frees or parks it; a consumer releases its slot.
        ``limbo=False`` frees at once even if shared: what torch's rule prevents, for demos."""
        return _receiver().free(self) if self.received else _producer().free(self, limbo)

    def __reduce__(self):  # reduce_tensor's CUDA branch: send a handle, never the bytes
        if self.received:
            raise RuntimeError(RESEND_ERROR)
        return rebuild_block, tuple(_producer().share(self))


class _Producer:
    """This process's caching allocator + CudaIPCSentData bookkeeping + the limbo."""

    def __init__(self):
        self.pid, self.segments, self.cache, self.limbo = os.getpid(), {}, [], []
        self.counters: list[_Counters] = []
        self.bump = SEGMENT_SIZE  # bytes used in the newest segment (full: none yet)
        self.warned = False  # the limbo warning is given once per process

    def alloc(self, size: int) -> Block:
        if not 0 < size <= SEGMENT_SIZE:
            raise ValueError(f"size must be in 1..{SEGMENT_SIZE} bytes, got {size}")
        for i, (handle, offset, got) in enumerate(self.cache):  # reuse a freed block first
            if got == size:
                del self.cache[i]
                return Block(handle, offset, size, self.segments[handle], received=False)
        if self.bump + size > SEGMENT_SIZE:  # "cudaMalloc" a new segment
            handle = _shm.new_name()
            self.segments[handle] = _shm.create_refcounted(handle, SEGMENT_SIZE)
            self.newest, self.bump = handle, 0
        block = Block(self.newest, self.bump, size, self.segments[self.newest], received=False)
        self.bump += size
        return block

    def share(self, block: Block) -> IpcHandle:
        if block.freed:
            raise ValueError("cannot send a freed block")
        if not self.counters or self.counters[-1].next == SLOTS:  # file full: open a new one
            self.counters.append(_Counters(_shm.new_name(), create=True))
        counters = self.counters[-1]
        slot, counters.next = counters.next, counters.next + 1
        counters.used += 1
        counters.slots[slot] = 1  # one consumer will hold it
        block.sends.append((counters, slot))
        return IpcHandle(block.handle, block.offset, block.size, counters.name, slot * 8)

    def free(self, block: Block, limbo: bool = True) -> str:
        if block.freed:
            return "already freed"
        block.freed = True
        state = "freed"
        if limbo and any(block.counters()):  # a consumer may still use it: CudaIPCSentDataLimbo
            if len(self.limbo) > WARN_AFTER_BLOCKS_IN_LIMBO and not self.warned:
                warnings.warn(LIMBO_WARNING, RuntimeWarning, stacklevel=3)
                self.warned = True
            self.limbo.append(block)
            state = "limbo"
        else:
            self._give_back(block)
        if block.sends:  # torch's deleter of a sent block collects the whole limbo each time
            self._collect_limbo()
        return state

    def _give_back(self, block: Block) -> None:
        """The block's memory returns to the allocator, and its slots to their files."""
        self.cache.append((block.handle, block.offset, block.size))
        for counters, _ in block.sends:  # ReturnRefCounter, in ~CudaIPCSentData
            counters.used -= 1
            if counters.used == 0 and counters.next == SLOTS:  # full and all handed back
                self.counters.remove(counters)
                counters.close()

    def _collect_limbo(self) -> int:
        done = [b for b in self.limbo if not any(b.counters())]
        self.limbo = [b for b in self.limbo if b not in done]
        for b in done:
            self._give_back(b)
        return len(done)

    def collect(self) -> int:
        freed = self._collect_limbo()
        current = self.counters[-1] if self.counters else None
        if not self.limbo and current is not None and current.used == 0:
            self.counters.pop()  # safe_clean_current_file: the next send opens a new file
            current.close()
        return freed

    def shutdown(self) -> None:
        self.collect()
        if self.limbo:
            warnings.warn(EXIT_WARNING, RuntimeWarning, stacklevel=2)
        self.limbo, self.cache = [], []
        for handle in self.segments:  # consumers still mapping a segment keep it alive
            _shm.decref(handle)
        for counters in self.counters:
            counters.close()
        self.segments, self.counters = {}, []


class _Receiver:
    """rebuild_cuda_tensor's side: mapped segments and counters, the (handle, offset) cache."""

    def __init__(self):
        self.pid = os.getpid()
        self.maps: dict[str, list] = {}   # name -> [mapping or _Counters, users]
        self.cache: dict[tuple[str, int], Block] = {}

    def _attach(self, name: str, make):
        entry = self.maps.get(name) or self.maps.setdefault(name, [make(name), 0])
        entry[1] += 1
        return entry[0]

    def _detach(self, name: str) -> None:
        entry = self.maps[name]
        entry[1] -= 1
        if entry[1] == 0:
            del self.maps[name]
            entry[0].close() if isinstance(entry[0], _Counters) else _shm.decref(name)

    def _release(self, counter_handle: str, counter_offset: int) -> None:
        self.maps[counter_handle][0].slots[counter_offset // 8] -= 1  # _release_ipc_counter
        self._detach(counter_handle)

    def rebuild(self, h: IpcHandle) -> Block:
        self._attach(h.counter_handle, lambda n: _Counters(n, create=False))  # held until release
        block = self.cache.get((h.handle, h.offset))
        if block is not None:  # already mapped: this send's slot is not needed
            self._release(h.counter_handle, h.counter_offset)
            return block
        mapping = self._attach(h.handle, lambda n: _shm.attach_refcounted(n, SEGMENT_SIZE))
        block = Block(h.handle, h.offset, h.size, mapping, received=True)
        block.sends = [(h.counter_handle, h.counter_offset)]
        self.cache[(h.handle, h.offset)] = block
        return block

    def free(self, block: Block) -> str:
        if block.freed:
            return "already freed"
        block.freed = True
        del self.cache[(block.handle, block.offset)]
        block._mapping = None
        self._release(*block.sends[0])
        self._detach(block.handle)
        return "released"

    def shutdown(self) -> None:
        for block in list(self.cache.values()):
            self.free(block)


_state: dict[str, _Producer | _Receiver] = {}


def _producer() -> _Producer:
    """This process's producer state (a forked child starts its own, as torch's is global)."""
    p = _state.get("producer")
    if p is None or p.pid != os.getpid():
        p = _state["producer"] = _Producer()
    return p


def _receiver() -> _Receiver:
    """This process's receiver state (a forked child does not inherit its parent's)."""
    r = _state.get("receiver")
    if r is None or r.pid != os.getpid():
        r = _state["receiver"] = _Receiver()
    return r


def alloc(size: int) -> Block:
    """A new block of ``size`` bytes from this process's caching allocator (torch.empty on cuda)."""
    return _producer().alloc(size)


def share(block: Block) -> IpcHandle:
    """Export ``block`` for one consumer (storage._share_cuda_()): a handle and a fresh slot."""
    if block.received:
        raise RuntimeError(RESEND_ERROR)
    return _producer().share(block)


def rebuild_block(*handle) -> Block:
    """Map a sent block in the receiving process (rebuild_cuda_tensor)."""
    return _receiver().rebuild(IpcHandle(*handle))


def ipc_collect() -> int:
    """Free the limbo blocks no consumer holds any more (torch.cuda.ipc_collect()); how many."""
    return _producer().collect()


def limbo() -> list[Block]:
    """The blocks this producer freed while a consumer still held them."""
    return list(_producer().limbo)


def wait_released(block: Block, timeout: float = 30.0, poll: float = 0.005) -> bool:
    """Block until every consumer released ``block`` (all its slots are 0); False on timeout."""
    deadline = time.monotonic() + timeout
    while any(block.counters()) and time.monotonic() < deadline:
        time.sleep(poll)
    return not any(block.counters())


def shutdown() -> None:
    """What process exit does: release what we received; warn about limbo; free segments."""
    for key in ("receiver", "producer"):
        state = _state.get(key)
        if state is not None and state.pid == os.getpid():
            state.shutdown()


atexit.register(shutdown)
