"""Send one shared tensor through a Queue to a child, so ``strace`` can show what crosses.

Notebook 04 (claim C12.12) runs it under ``strace -f -e trace=sendmsg,recvmsg,write,read``:

    python -m shmlab.examples.wire file_descriptor   # or file_system

The parent puts a 1,000-float tensor on a ``torch.multiprocessing`` Queue; a ``fork`` child
takes it and exits. Before sending, the parent prints ``MARK <pid>`` so the trace can be read
from that point on.

Mirrors: CPython multiprocessing/connection.py (``_send_bytes``: a 4-byte length, then the
pickle), resource_sharer.py and reduction.py (``sendfds``: one byte of data and an
``SCM_RIGHTS`` control message).
"""

import os
import sys

import torch
import torch.multiprocessing as mp


def take(q):
    t = q.get(timeout=60)
    os.write(1, f"child got {t.numel()} floats, first {float(t[0])}\n".encode())


def main(strategy: str) -> None:
    mp.set_sharing_strategy(strategy)
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    t = torch.full((1000,), 7.0).share_memory_()
    p = ctx.Process(target=take, args=(q,))
    p.start()
    os.write(1, f"MARK {os.getpid()}\n".encode())
    q.put(t)
    p.join(60)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "file_descriptor")
