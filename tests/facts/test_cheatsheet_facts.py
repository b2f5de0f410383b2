"""The cheat sheets' facts that no notebook cell asserts, each shown on the installed torch.

Every experiment runs in a Python subprocess of its own (a script in tmp_path), so the pytest
process shares nothing, keeps no resource_sharer dup and starts no shm manager; each script
prints one JSON line that the test reads.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
from support.waiting import alive

PY = sys.executable


def run(tmp_path, code: str, timeout: float = 60) -> dict:
    script = tmp_path / "experiment.py"
    script.write_text(code, encoding="utf-8")
    out = subprocess.run([PY, str(script)], capture_output=True, text=True, timeout=timeout,
                         cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.claim("C25.101")
@pytest.mark.timeout(60)
def test_a_pickled_cpu_tensor_is_a_small_handle_made_by_one_move_into_shared_memory(tmp_path):
    r = run(tmp_path, '''
import json, torch
from multiprocessing.reduction import ForkingPickler
out = {}
for n in (10, 1_000_000):
    t = torch.zeros(n)
    before, shared_before = t.data_ptr(), t.is_shared()
    first = len(ForkingPickler.dumps(t))
    moved = t.data_ptr()
    second = len(ForkingPickler.dumps(t))
    out[n] = [shared_before, before != moved, t.is_shared(), first, second, moved == t.data_ptr()]
print(json.dumps(out))
''')
    for n, (shared_before, moved, shared, first, second, stayed) in r.items():
        assert not shared_before and moved and shared and stayed, (n, r)
        assert 300 <= first == second <= 400, (n, r)   # ~340 bytes, pickling again copies nothing
    assert abs(r["10"][3] - r["1000000"][3]) < 10, r     # whatever the tensor's size


@pytest.mark.claim("C25.301", start_methods=("fork", "spawn"))
@pytest.mark.timeout(120)
def test_import_torch_registers_the_reducers_and_a_stdlib_queue_shares(tmp_path):
    r = run(tmp_path, '''
import json, multiprocessing, sys
from multiprocessing.reduction import ForkingPickler

def child(q, done):
    t = q.get()
    t.fill_(7.0)
    done.put(t.is_shared())
    del t

if __name__ == "__main__":
    before = dict(ForkingPickler._extra_reducers)
    import torch  # only torch: torch.multiprocessing is never imported here
    out = {"before": [k.__name__ for k in before],
           "registered": [k.__name__ for k in (torch.Tensor, torch.UntypedStorage)
                          if k in ForkingPickler._extra_reducers],
           "tmp imported": "torch.multiprocessing" in sys.modules}
    for method in ("fork", "spawn"):
        ctx = multiprocessing.get_context(method)        # the standard library's own
        q, done = ctx.Queue(), ctx.Queue()
        t = torch.zeros(4)
        p = ctx.Process(target=child, args=(q, done))
        p.start()
        q.put(t)
        child_shared = done.get(timeout=60)
        p.join(60)
        out[method] = [child_shared, t.tolist(), p.exitcode]
    print(json.dumps(out))
''', timeout=100)
    assert not {"Tensor", "UntypedStorage"} & set(r["before"]), r
    assert r["registered"] == ["Tensor", "UntypedStorage"], r
    assert r["tmp imported"], r
    for method in ("fork", "spawn"):
        assert r[method] == [True, [7.0] * 4, 0], (method, r)


@pytest.mark.claim("C25.107", start_methods=("fork",))
@pytest.mark.timeout(60)
def test_fork_process_arguments_are_copied_on_write_not_shared(tmp_path):
    r = run(tmp_path, '''
import json, torch, torch.multiprocessing as mp

def child(t, done):
    done.put(t.is_shared())
    t.fill_(7.0)

if __name__ == "__main__":
    ctx = mp.get_context("fork")
    t, done = torch.zeros(4), ctx.Queue()
    p = ctx.Process(target=child, args=(t, done))
    p.start()
    seen = done.get(timeout=30)
    p.join(30)
    print(json.dumps([seen, t.is_shared(), t.tolist(), p.exitcode]))
''')
    assert r == [False, False, [0.0] * 4, 0], r


def _ppid(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


@pytest.mark.claim("C25.113", "C25.114", start_methods=("fork", "spawn"))
@pytest.mark.timeout(120)
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_a_parent_killed_by_a_signal_leaves_its_children_running(tmp_path, sig):
    script = tmp_path / "parent.py"
    script.write_text('''
import multiprocessing, time
if __name__ == "__main__":
    p = multiprocessing.get_context("fork").Process(target=time.sleep, args=(60,), daemon=True)
    p.start()
    print(p.pid, flush=True)
    time.sleep(60)
''', encoding="utf-8")
    parent = subprocess.Popen([PY, str(script)], stdout=subprocess.PIPE, text=True)
    child = int(parent.stdout.readline())
    try:
        parent.send_signal(sig)
        assert parent.wait(30) == -sig               # no Python code ran: no atexit clean-up
        time.sleep(0.5)
        assert alive(child) and _ppid(child) != parent.pid   # an orphan, re-parented
    finally:
        parent.stdout.close()
        if alive(child):
            os.kill(child, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
    assert not alive(child)


@pytest.mark.claim("C25.113", "C25.114", start_methods=("spawn",))
@pytest.mark.timeout(120)
def test_torch_multiprocessing_spawn_sets_pdeathsig_sigint_in_its_children(tmp_path):
    r = run(tmp_path, '''
import ctypes, json, os, signal, sys
import torch.multiprocessing as mp

def child(rank, path):
    sig = ctypes.c_int(-1)
    ctypes.CDLL(None, use_errno=True).prctl(2, ctypes.byref(sig), 0, 0, 0)  # PR_GET_PDEATHSIG
    with open(path, "w") as f:
        f.write(str(sig.value))

if __name__ == "__main__":
    path = os.path.join(os.getcwd(), "sig.txt")
    mp.spawn(child, args=(path,), nprocs=1)
    with open(path) as f:
        print(json.dumps({"pdeathsig": int(f.read()), "SIGINT": int(signal.SIGINT)}))
''', timeout=100)
    assert r["pdeathsig"] == r["SIGINT"], r


@pytest.mark.claim("C25.122", "C25.120")
@pytest.mark.timeout(60)
def test_the_strategy_api_on_linux(tmp_path):
    r = run(tmp_path, '''
import inspect, json, sys
import torch.multiprocessing as mp
out = {"platform": sys.platform, "all": sorted(mp.get_all_sharing_strategies()),
       "default": mp.get_sharing_strategy()}
try:
    mp.set_sharing_strategy("shared_memory")
    out["bad"] = None
except AssertionError as e:
    out["bad"] = str(e)
out["after"] = mp.get_sharing_strategy()
out["source"] = inspect.getsource(mp)
print(json.dumps(out))
''')
    assert r["platform"] == "linux", r["platform"]
    assert r["all"] == ["file_descriptor", "file_system"] and r["default"] == "file_descriptor"
    assert r["bad"] and "invalid sharing strategy" in r["bad"] and r["after"] == "file_descriptor"
    # macOS and Windows: read in the installed source (no such machine runs the suite)
    src = r["source"]
    branch = src.split('if sys.platform == "darwin" or sys.platform == "win32":', 1)[1]
    assert branch.split("else:", 1)[0].split() == [
        "_sharing_strategy", "=", '"file_system"', "_all_sharing_strategies", "=",
        '{"file_system"}'], branch[:200]
    # a raise, not an assert statement: python -O keeps the check
    assert "raise AssertionError(" in src.split("def set_sharing_strategy", 1)[1][:600]


@pytest.mark.claim("C25.118", "C25.117", start_methods=("fork", "spawn"))
@pytest.mark.timeout(120)
def test_the_senders_strategy_decides_and_only_fork_children_inherit_it(tmp_path):
    r = run(tmp_path, '''
import json, re, torch, torch.multiprocessing as mp
from multiprocessing.reduction import ForkingPickler

def report(q):
    q.put(mp.get_sharing_strategy())

def receive(q, done):
    mp.set_sharing_strategy("file_descriptor")       # the receiver's own setting
    t = q.get()
    t.fill_(7.0)
    done.put(mp.get_sharing_strategy())
    del t

if __name__ == "__main__":
    mp.set_sharing_strategy("file_system")
    out = {"names": {}}
    for s in ("file_descriptor", "file_system"):
        mp.set_sharing_strategy(s)
        b = ForkingPickler.dumps(torch.zeros(2))
        out["names"][s] = sorted(set(re.findall(rb"rebuild_storage_\\w+", b)))[0].decode()
    for method in ("fork", "spawn"):
        ctx = mp.get_context(method)
        q = ctx.Queue()
        p = ctx.Process(target=report, args=(q,))
        p.start()
        out[method] = q.get(timeout=60)
        p.join(60)
    ctx = mp.get_context("fork")
    q, done = ctx.Queue(), ctx.Queue()
    t = torch.zeros(4)
    p = ctx.Process(target=receive, args=(q, done))
    p.start()
    q.put(t)                                           # pickled under file_system
    out["receiver"] = done.get(timeout=60)
    p.join(60)
    out["seen"] = t.tolist()
    del t
    print(json.dumps(out))
''', timeout=100)
    assert r["names"] == {"file_descriptor": "rebuild_storage_fd",
                          "file_system": "rebuild_storage_filename"}, r
    assert r["fork"] == "file_system" and r["spawn"] == "file_descriptor", r
    assert r["receiver"] == "file_descriptor" and r["seen"] == [7.0] * 4, r


@pytest.mark.claim("C25.306", start_methods=("fork",))
@pytest.mark.timeout(60)
def test_file_descriptor_unlinks_at_once_and_the_receiver_maps_a_storage_once(tmp_path):
    r = run(tmp_path, '''
import json, os, torch, torch.multiprocessing as mp

def links():
    out = []
    for fd in list(os.listdir("/proc/self/fd")):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
            mode = os.stat(f"/proc/self/fd/{fd}").st_mode & 0o777
        except FileNotFoundError:
            continue
        if target.startswith("/dev/shm/torch_"):
            out.append([target, oct(mode)])
    return out

def child(q, done):
    inherited = links()                                # fork copied the parent's fd
    a, b = q.get(), q.get()
    done.put([a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr(),
              len(links()) - len(inherited)])
    del a, b

if __name__ == "__main__":
    t = torch.zeros(1000).share_memory_()
    mine = links()
    name = mine[0][0].split("/dev/shm/")[1].split(" ")[0]
    ctx = mp.get_context("fork")
    q, done = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=child, args=(q, done))
    p.start()
    q.put(t)
    q.put(t)
    same, theirs = done.get(timeout=30)
    p.join(30)
    print(json.dumps({"mine": mine, "in /dev/shm": name in os.listdir("/dev/shm"),
                      "same": same, "received": theirs}))
''')
    (target, mode), = r["mine"]
    assert target.endswith(" (deleted)") and mode == "0o600" and not r["in /dev/shm"], r
    assert r["same"] and r["received"] == 1, r   # one mapping, one fd for two messages


@pytest.mark.claim("C25.207")
@pytest.mark.timeout(60)
def test_file_system_names_mode_and_header(tmp_path):
    r = run(tmp_path, '''
import json, os, torch, torch.multiprocessing as mp
mp.set_sharing_strategy("file_system")
t = torch.zeros(1000).share_memory_()                 # 4,000 bytes
names = [n for n in os.listdir("/dev/shm") if n.startswith(f"torch_{os.getpid()}_")]
st = os.stat(f"/dev/shm/{names[0]}")
with open(f"/dev/shm/{names[0]}", "rb") as f:
    header = f.read(64)
print(json.dumps({"pid": os.getpid(), "names": names, "mode": oct(st.st_mode & 0o777),
                  "size": st.st_size, "refcount": int.from_bytes(header[:4], "little"),
                  "rest": header[4:].hex()}))
del t
''')
    (name,), pid = r["names"], r["pid"]
    parts = name.split("_")
    assert parts[:2] == ["torch", str(pid)] and len(parts) == 4, name
    assert parts[2].isdigit() and parts[3].isdigit(), name
    assert r["mode"] == "0o600" and r["size"] == 4064 and r["refcount"] == 1, r
    assert r["rest"] == "00" * 60, r


@pytest.mark.claim("C25.310")
@pytest.mark.timeout(90)
def test_a_file_system_allocation_registers_with_one_68_byte_message(tmp_path):
    if shutil.which("strace") is None:
        pytest.skip("strace is not installed")
    script = tmp_path / "alloc.py"
    script.write_text('''
import torch, torch.multiprocessing as mp
mp.set_sharing_strategy("file_system")
t = torch.zeros(1000).share_memory_()
del t
''', encoding="utf-8")
    out = subprocess.run(["strace", "-f", "-qq", "-e", "trace=write,sendto,sendmsg", "-e",
                          "signal=none", "-s", "100", "-xx", PY, str(script)],
                         capture_output=True, text=True, timeout=80)
    if "ptrace" in out.stderr and "Operation not permitted" in out.stderr:
        pytest.skip("ptrace is not permitted here")
    assert out.returncode == 0, out.stderr[-2000:]
    # -xx prints every byte as \\xNN; the name follows the pid (4 bytes) and the free flag (1)
    name = b"/torch_".hex()
    writes = [line for line in out.stderr.splitlines()
              if line.lstrip("[pid0123456789] ").startswith("write(")
              and "".join(line.split('"')[1].split("\\x"))[10:10 + len(name)] == name]
    assert writes, out.stderr[-3000:]
    for line in writes:
        assert line.rstrip().endswith(", 68) = 68"), line


@pytest.mark.claim("C25.211")
@pytest.mark.timeout(60)
def test_file_descriptor_at_the_fd_limit_cannot_share_another_tensor(tmp_path):
    r = run(tmp_path, '''
import json, os, resource, torch
resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
keep, error = [], None
for i in range(200):
    try:
        keep.append(torch.zeros(10).share_memory_())
    except RuntimeError as e:
        error = str(e)
        break
n = len(keep)
del keep
print(json.dumps({"kept": n, "error": error}))
os._exit(0)   # the interpreter's own exit would need fds too
''')
    assert 0 < r["kept"] < 64 and r["error"], r
    assert r["error"].startswith("unable to open shared memory object </torch_"), r
    assert r["error"].endswith("Too many open files (24)"), r


@pytest.mark.claim("C25.42")
@pytest.mark.timeout(60)
def test_file_system_holds_one_socket_per_manager_not_one_per_storage(tmp_path):
    r = run(tmp_path, '''
import json, os, torch, torch.multiprocessing as mp
def sockets():
    links = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            links.append(os.readlink(f"/proc/self/fd/{fd}"))
        except FileNotFoundError:  # the fd listdir itself had open
            pass
    return sum(link.startswith("socket:") for link in links)
mp.set_sharing_strategy("file_system")
before = sockets()
kept = [torch.zeros(10).share_memory_() for _ in range(25)]
print(json.dumps({"before": before, "after": sockets(), "kept": len(kept)}))
''')
    assert r["kept"] == 25 and r["after"] - r["before"] == 1, r
