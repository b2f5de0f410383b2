"""Facts the drill's Q3, Q4 and Q5 cards rest on, each asserted on the installed torch / Python.

Each test names the claim it proves (``@pytest.mark.claim``, shmlab/facts/assertions.py). Real
processes where the fact is about processes; each child runs with a timeout and leaves nothing.
"""

from __future__ import annotations

import inspect
import os
import re
import shutil
import subprocess
import sys
import textwrap
import time
from multiprocessing.reduction import ForkingPickler
from pathlib import Path

import pytest
import torch
from torch.multiprocessing import reductions

pytestmark = pytest.mark.timeout(120)


def run(code: str, *args: str, timeout: float = 90, cwd=None) -> subprocess.CompletedProcess:
    """python -c code (or a script path given in args) in a fresh interpreter."""
    argv = [sys.executable, "-c", textwrap.dedent(code), *args] if code else [sys.executable,
                                                                             *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=cwd)


# --- Q3: CUDA (read from the installed source; tests/core/test_cuda.py runs them on a GPU) ------
@pytest.mark.claim("C25.200")
def test_a_cuda_tensor_travels_as_its_blocks_handle_and_offset():
    reduce_src = inspect.getsource(reductions.reduce_tensor)
    assert "storage._share_cuda_()" in reduce_src
    for field in ("storage_offset_bytes", "ref_counter_handle", "event_handle"):
        assert field in reduce_src, field
    assert "identifier which CUDA allocation is the storage in" in reduce_src
    assert "offset(in bytes) of the storage in the CUDA allocation" in reduce_src
    assert "cudaIpcMemHandle" in inspect.getsource(reductions)  # the note on the caching allocator
    rebuild = inspect.getsource(reductions.rebuild_cuda_tensor)
    assert "storage_from_cache(\n            storage_cls, (storage_handle, storage_offset_bytes)" \
        in rebuild


@pytest.mark.claim("C25.202")
def test_ipc_collect_frees_what_consumers_released():
    doc = " ".join(inspect.getdoc(torch.cuda.ipc_collect).split())
    assert "Force collects GPU memory after it has been released by CUDA IPC" in doc
    assert "Force closes shared memory file used for reference counting" in doc
    assert "producer process stopped actively sending" in doc
    # the collected blocks go back to the caching allocator; empty_cache hands cached ones out
    empty = " ".join(inspect.getdoc(torch.cuda.empty_cache).split())
    assert "Release all unoccupied cached memory currently held by the caching allocator" in empty


@pytest.mark.claim("C25.218")
def test_pin_memory_runs_in_a_thread_of_the_main_process():
    from torch.utils.data import dataloader
    src = inspect.getsource(dataloader._MultiProcessingDataLoaderIter.__init__)
    assert "threading.Thread(\n                target=_utils.pin_memory._pin_memory_loop" in src
    worker = inspect.getsource(torch.utils.data._utils.worker._worker_loop)
    assert "pin_memory" not in worker  # workers never pin


# --- Q3: start methods ----------------------------------------------------------------------
@pytest.mark.claim("C25.203")
def test_the_default_start_method_and_the_dataloaders():
    import multiprocessing.context as ctx
    src = inspect.getsource(ctx)
    assert sys.platform.startswith("linux") and sys.version_info < (3, 14)
    assert "if sys.platform == 'darwin':" in src
    assert "_default_context = DefaultContext(_concrete_contexts['spawn'])" in src
    assert run("import multiprocessing as m; print(m.get_start_method())").stdout.strip() == "fork"
    from torch.utils.data import dataloader
    init = inspect.getsource(dataloader._MultiProcessingDataLoaderIter.__init__)
    assert ("if loader.multiprocessing_context is None:\n"
            "            multiprocessing_context = torch.multiprocessing") in init


@pytest.mark.claim("C25.204", start_methods=("spawn",))
def test_spawn_cannot_find_a_function_of_a_fileless_main(tmp_path):
    body = textwrap.dedent("""
        import multiprocessing as mp
        def work():
            print("child ran work()", flush=True)
        if __name__ == "__main__":
            p = mp.get_context("spawn").Process(target=work)
            p.start(); p.join(60); print("exit code", p.exitcode)
        """)
    fileless = run(body)
    assert "Can't get attribute 'work' on <module '__main__'" in fileless.stderr, fileless
    assert "exit code 1" in fileless.stdout
    script = tmp_path / "script.py"
    script.write_text(body)
    from_file = run("", str(script))
    assert "child ran work()" in from_file.stdout and "exit code 0" in from_file.stdout, from_file


@pytest.mark.claim("C25.205", start_methods=("spawn", "forkserver"))
@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_an_unguarded_start_fails_in_the_child(tmp_path, method):
    script = tmp_path / "unguarded.py"
    script.write_text(textwrap.dedent(f"""
        import multiprocessing as mp
        def work():
            pass
        p = mp.get_context("{method}").Process(target=work)
        p.start(); p.join(60)
        """))
    out = run("", str(script))
    assert ("RuntimeError: \n        An attempt has been made to start a new process before the\n"
            "        current process has finished its bootstrapping phase.") in out.stderr, out


# --- Q4: the strategy per process ------------------------------------------------------------
STRATEGY_CHILD = """
import multiprocessing as mp, sys
import torch.multiprocessing as tmp

def report(q):
    q.put(tmp.get_sharing_strategy())

if __name__ == "__main__":
    tmp.set_sharing_strategy("file_system")
    for method in ("fork", "spawn"):
        ctx = mp.get_context(method)
        q = ctx.Queue()
        p = ctx.Process(target=report, args=(q,))
        p.start(); print(method, q.get(timeout=60)); p.join(60)
"""


@pytest.mark.claim("C25.118", start_methods=("fork", "spawn"))
def test_the_strategy_is_per_process(tmp_path):
    script = tmp_path / "strategy.py"
    script.write_text(STRATEGY_CHILD)
    out = run("", str(script))
    assert out.stdout.split("\n")[:2] == ["fork file_system", "spawn file_descriptor"], out


STRATEGY_TOP_LEVEL = """
import multiprocessing as mp
import torch.multiprocessing as tmp

tmp.set_sharing_strategy("file_system")  # top level: the child re-runs this line

def report(q):
    q.put(tmp.get_sharing_strategy())

if __name__ == "__main__":
    for method in ("spawn", "forkserver"):
        ctx = mp.get_context(method)
        q = ctx.Queue()
        p = ctx.Process(target=report, args=(q,))
        p.start(); print(method, q.get(timeout=60)); p.join(60)
"""


@pytest.mark.claim("C25.118", start_methods=("spawn", "forkserver"))
def test_a_top_level_strategy_call_is_re_run_in_the_child(tmp_path):
    script = tmp_path / "strategy_top.py"
    script.write_text(STRATEGY_TOP_LEVEL)
    out = run("", str(script), timeout=150)
    assert out.stdout.split("\n")[:2] == ["spawn file_system", "forkserver file_system"], out


# --- Q4: what torch makes in /dev/shm ----------------------------------------------------------
@pytest.mark.skipif(not shutil.which("strace"), reason="needs strace")
@pytest.mark.claim("C25.207")
def test_the_segment_is_created_sized_mapped_and_unlinked(tmp_path):
    log = tmp_path / "strace.txt"
    code = ("import os, torch; t = torch.zeros(1000); t.share_memory_(); "
            "fd, _ = t.untyped_storage()._share_fd_cpu_(); "
            "print(os.readlink(f'/proc/self/fd/{fd}'))")
    out = subprocess.run(["strace", "-f", "-e", "trace=openat,ftruncate,fallocate,mmap,unlink",
                          "-o", str(log), sys.executable, "-c", code],
                         capture_output=True, text=True, timeout=90)
    assert out.returncode == 0, out
    text = log.read_text()
    m = re.search(r'openat\(AT_FDCWD, "/dev/shm/(torch_\d+_\d+_\d+)", '
                  r"O_RDWR\|O_CREAT\|O_EXCL[^)]*, 0600\) = (\d+)", text)
    assert m, text[-3000:]
    name, fd = m.groups()
    after = text[m.end():]
    for call in (f"ftruncate({fd}, 4000)", f"fallocate({fd}, 0, 0, 4000)",
                 f"MAP_SHARED, {fd}, 0)", f'unlink("/dev/shm/{name}")'):
        assert call in after, call
    assert after.index(f"fallocate({fd}") < after.index(f'unlink("/dev/shm/{name}")')
    assert f"/dev/shm/{name} (deleted)" in out.stdout, out.stdout
    assert not os.path.exists(f"/dev/shm/{name}")


@pytest.mark.claim("C25.207", "C25.208")
def test_file_system_file_mode_size_and_refcount():
    out = run("""
        import os, re, stat, sys, torch, torch.multiprocessing as tmp
        from multiprocessing.reduction import ForkingPickler
        tmp.set_sharing_strategy("file_system")
        t = torch.zeros(1000)  # 4,000 bytes
        t.share_memory_()
        path = "/dev/shm/" + t.untyped_storage()._share_filename_cpu_()[1].decode().lstrip("/")
        assert re.fullmatch(r"/dev/shm/torch_\\d+_\\d+_\\d+", path), path
        st = os.stat(path)
        assert stat.S_IMODE(st.st_mode) == 0o600 and st.st_size == 4064, st

        def count():
            with open(path, "rb") as f:
                return int.from_bytes(f.read(4), sys.byteorder, signed=True)

        seen = [count()]                          # created: 1
        msg = ForkingPickler.dumps(t)
        seen.append(count())                      # +1 for the message in flight
        back = ForkingPickler.loads(msg)
        seen.append(count())                      # the receive gave it back (cached storage)
        assert back.untyped_storage().data_ptr() == t.untyped_storage().data_ptr()
        del back, t
        print(seen, os.path.exists(path))         # the last holder unlinked it
        """)
    assert out.stdout.strip() == "[1, 2, 1] False", out


# --- Q4: the receiver's cache under file_descriptor --------------------------------------------
@pytest.mark.claim("C25.306", "C25.109")
def test_the_fd_cache_is_keyed_by_inode_and_returns_the_senders_storage():
    t = torch.zeros(1000).share_memory_()
    fd, _ = t.untyped_storage()._share_fd_cpu_()
    msgs = [ForkingPickler.dumps(t) for _ in range(2)]
    back = [ForkingPickler.loads(m) for m in msgs]
    assert all(b.untyped_storage().data_ptr() == t.untyped_storage().data_ptr() for b in back)
    assert "return (stat.st_ino, stat.st_dev)" in inspect.getsource(reductions.fd_id)
    src = inspect.getsource(reductions.rebuild_storage_fd)
    assert "storage_from_cache(cls, fd_id(fd))" in src
    assert fd >= 0


# --- Q4: the fd limit in the sender --------------------------------------------------------
@pytest.mark.claim("C25.211")
def test_share_memory_at_the_fd_limit_says_too_many_open_files():
    out = run("""
        import resource, torch
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, hard))
        kept = []
        try:
            for _ in range(200):
                kept.append(torch.zeros(4).share_memory_())
        except RuntimeError as e:
            print("ERR", e)
        """)
    assert re.search(r"ERR unable to open shared memory object </torch_\d+_\d+_\d+> in read-write "
                     r"mode: Too many open files \(24\)", out.stdout), out


# --- Q4: the manager ----------------------------------------------------------------------
MANAGER = """
import multiprocessing as mp, os, sys, time
import torch, torch.multiprocessing as tmp

def managers():
    found = []
    for pid in os.listdir("/proc"):
        try:
            if pid.isdigit() and os.readlink(f"/proc/{pid}/exe").endswith("torch_shm_manager"):
                with open(f"/proc/{pid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                ppid, pgid, sid = int(fields[1]), int(fields[2]), int(fields[3])
                if ppid == os.getpid() or ppid in kids:
                    found.append((int(pid), pgid, sid))
        except OSError:
            pass
    return found

def child(q):
    torch.zeros(4).share_memory_()
    q.put(os.getpid())

kids = []
if __name__ == "__main__":
    print("import", len(managers()))
    torch.zeros(4).share_memory_()
    print("file_descriptor", len(managers()))
    tmp.set_sharing_strategy("file_system")
    t = torch.zeros(4).share_memory_()
    ((pid, pgid, sid),) = managers()
    print("file_system", 1, pid == pgid == sid)
    for method in ("fork", "spawn"):
        ctx = mp.get_context(method)
        q = ctx.Queue()
        p = ctx.Process(target=child, args=(q,))
        p.start(); kids[:] = [q.get(timeout=60)]
        print(method, len(managers()))
        p.join(60)
"""


@pytest.mark.claim("C25.209", start_methods=("fork", "spawn"))
def test_the_manager_starts_lazily_one_per_family_and_setsids(tmp_path):
    script = tmp_path / "manager.py"
    script.write_text(MANAGER)
    out = run("", str(script))
    # spawn children start with the default strategy: the fork child inherits file_system and
    # the parent's manager; the spawn child sets nothing, so it allocates under file_descriptor.
    assert out.stdout.split("\n")[:5] == ["import 0", "file_descriptor 0", "file_system 1 True",
                                          "fork 1", "spawn 1"], out


SPAWN_MANAGER = """
import multiprocessing as mp, os, time
import torch, torch.multiprocessing as tmp

def child(q):
    tmp.set_sharing_strategy("file_system")
    t = torch.zeros(4).share_memory_()
    mine = []
    for pid in os.listdir("/proc"):
        try:
            if pid.isdigit() and os.readlink(f"/proc/{pid}/exe").endswith("torch_shm_manager"):
                with open(f"/proc/{pid}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == os.getpid():
                        mine.append(pid)
        except OSError:
            pass
    q.put(len(mine))

if __name__ == "__main__":
    tmp.set_sharing_strategy("file_system")
    t = torch.zeros(4).share_memory_()
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=child, args=(q,))
    p.start(); print("spawn child's own managers", q.get(timeout=60)); p.join(60)
"""


@pytest.mark.claim("C25.209", start_methods=("spawn",))
def test_a_spawn_child_that_allocates_starts_its_own_manager(tmp_path):
    script = tmp_path / "spawn_manager.py"
    script.write_text(SPAWN_MANAGER)
    out = run("", str(script))
    assert "spawn child's own managers 1" in out.stdout, out


@pytest.mark.claim("C25.410")
def test_the_manager_never_touches_files_it_was_not_told_about():
    stray = Path(f"/dev/shm/torch_{os.getpid()}_424242_0")
    stray.write_bytes(b"\0" * 64)
    try:
        out = run("""
            import os, time, torch, torch.multiprocessing as tmp
            tmp.set_sharing_strategy("file_system")
            t = torch.zeros(4).share_memory_()
            print(t.untyped_storage()._share_filename_cpu_()[1].decode())
            os._exit(0)   # no destructor: the file is left for the manager
            """)
        leaked = Path("/dev/shm/" + out.stdout.strip().lstrip("/"))
        deadline = time.monotonic() + 30
        while leaked.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not leaked.exists(), "the manager did not reclaim its own client's file"
        assert stray.exists(), "the manager removed a file nobody registered with it"
    finally:
        stray.unlink(missing_ok=True)


# --- Q5: Hogwild ------------------------------------------------------------------------------
FORGET = """
import multiprocessing as mp
import torch

def step(model):
    with torch.no_grad():
        model.weight.add_(1.0)

if __name__ == "__main__":
    for method in ("fork", "spawn"):
        model = torch.nn.Linear(2, 1, bias=False)
        torch.nn.init.zeros_(model.weight)
        p = mp.get_context(method).Process(target=step, args=(model,))
        p.start(); p.join(60)
        print(method, p.exitcode, model.weight.is_shared(), float(model.weight.sum()))
"""


@pytest.mark.claim("C25.412", start_methods=("fork", "spawn"))
def test_without_share_memory_fork_trains_a_copy_spawn_shares_by_pickling(tmp_path):
    script = tmp_path / "forget.py"
    script.write_text(FORGET)
    out = run("", str(script))
    assert out.stdout.split("\n")[:2] == ["fork 0 False 0.0", "spawn 0 True 2.0"], out


@pytest.mark.claim("C25.3")
def test_share_memory_shares_the_buffers_too():
    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.BatchNorm1d(3))
    model.share_memory()
    buffers = dict(model.named_buffers())
    assert set(buffers) == {"1.running_mean", "1.running_var", "1.num_batches_tracked"}
    assert all(b.is_shared() for b in buffers.values())
    assert all(p.is_shared() for p in model.parameters())


RACE = """
import multiprocessing as mp
import torch

N = 200_000

def bump(t, lock):
    for _ in range(N):
        if lock is None:
            t += 1
        else:
            with lock:
                t += 1

if __name__ == "__main__":
    ctx = mp.get_context("fork")
    for locked in (False, True):
        lost = 0
        for attempt in range(5):
            t = torch.zeros(1).share_memory_()
            lock = ctx.Lock() if locked else None
            ps = [ctx.Process(target=bump, args=(t, lock)) for _ in range(2)]
            for p in ps: p.start()
            for p in ps: p.join(120)
            total = int(t.item())
            assert total <= 2 * N, total
            lost = 2 * N - total
            if locked or lost:
                break
        print("locked" if locked else "lock-free", lost)
"""


@pytest.mark.claim("C25.414", start_methods=("fork",))
def test_lock_free_updates_from_several_processes_lose_some(tmp_path):
    script = tmp_path / "race.py"
    script.write_text(RACE)
    out = run("", str(script), timeout=110)
    lines = dict(line.rsplit(" ", 1) for line in out.stdout.strip().split("\n"))
    assert int(lines["lock-free"]) > 0 and int(lines["locked"]) == 0, out
