"""Wrong answers lose their marks, and every correct answer, however it is written, scores full.

Each lab gets three notebooks built from its instructor copy: two with a plausible wrong answer
in every exercise (the mistakes learners of this material make: no ``O_EXCL``, an fd leaked on a
failing path, a count read before the lock, a prefix match, a hard-coded grace period, a worker
that ignores ``epochs``...) and one written the way a learner might write a right answer that is
not the instructor's (split cells, helper cells, a helper shared between answers, ``display()``,
``ForkingPickler(buf).dump``, ``fcntl.lockf``, a ``FileNotFoundError`` subclass, an accuracy
computed by hand). Each exercise is graded with the instructor's answers to the others, so one
notebook carries a wrong answer for every exercise at once: the fifteen notebooks are graded in
one batch (module fixture), and the tests read its rows.
"""

from __future__ import annotations

import copy
from pathlib import Path

import nbformat
import pytest

from shmlab.labs import grade, release

# One worker takes the whole module: every worker that ran one of its tests graded the fifteen
# notebooks again for its own copy of the module fixture (4 batches of ~35 CPU s on 4 workers).
pytestmark = [pytest.mark.timeout(900), pytest.mark.xdist_group("grader-answers")]


def _meta(cell) -> dict:
    return cell.metadata.get("nbgrader", {})


# --- lab 1 -----------------------------------------------------------------------------------
LAB1_WRONG_A = {
    "ex1_point_reducer": """
import struct


def rebuild_point(packed):
    return Point(*struct.unpack("ff", packed))


def reduce_point(p):
    return (rebuild_point, (struct.pack("ff", p.x, p.y),))  # wrong: float32 loses digits


ForkingPickler.register(Point, reduce_point)
""",
    "ex2_tensor_reducer": """
def my_rebuild_tensor(storage, offset, n, step, dtype):
    return shmlab.Tensor(storage, offset, (n,), (step,), dtype)


def my_reduce_tensor(t):  # wrong: every view taken as 1-D
    return (my_rebuild_tensor,
            (t.untyped_storage(), t.storage_offset(), t.numel(), t.stride()[-1], t.dtype))
""",
    "ex3_pickle_size": """
import sys


def pickle_size(n):
    return sys.getsizeof(ForkingPickler.dumps(shmlab.zeros(n)))  # wrong: not len()
""",
}
LAB1_WRONG_B = {
    "ex1_point_reducer": """
_last = []


def rebuild_point(x, y):
    return _last[-1]  # wrong: the Point reduced last, not the one in the pickle


def reduce_point(p):
    _last.append(p)
    return (rebuild_point, (p.x, p.y))


ForkingPickler.register(Point, reduce_point)
""",
    "ex2_tensor_reducer": """
def my_rebuild_tensor(storage, offset, shape, strides, dtype):
    return shmlab.Tensor(storage, offset, shape, strides, np.float32)  # wrong: dtype dropped


def my_reduce_tensor(t):
    return (my_rebuild_tensor,
            (t.untyped_storage(), t.storage_offset(), t.shape, t.stride(), t.dtype))
""",
    "ex3_pickle_size": """
def pickle_size(n):
    return len(ForkingPickler.dumps(shmlab.zeros(10)))  # wrong: always 10 elements
""",
}
# Right, written otherwise: a helper cell above the answer, the answer split in two cells
# (JupyterLab copies the nbgrader metadata to both halves), a helper defined in exercise 1's
# answer and used in exercise 2's, display(), and ForkingPickler(buf).dump.
LAB1_RIGHT = {
    ("above", "ex1_point_reducer"): """
def _coords(p):
    return (p.x, p.y)
""",
    "ex1_point_reducer": ["""
def rebuild_point(x, y):
    return Point(x, y)
""", """
def reduce_point(p):
    return (rebuild_point, _coords(p))


def _view_of(t):  # used again in exercise 2
    return (t.storage_offset(), tuple(t.shape), tuple(t.stride()), t.dtype)


ForkingPickler.register(Point, reduce_point)
display(ForkingPickler.loads(ForkingPickler.dumps(Point(1, 2))).x)
"""],
    "ex2_tensor_reducer": """
def my_rebuild_tensor(storage, offset, shape, strides, dtype):
    return shmlab.Tensor(storage, offset, shape, strides, dtype)


def my_reduce_tensor(t):
    return (my_rebuild_tensor, (t.untyped_storage(), *_view_of(t)))
""",
    "ex3_pickle_size": """
import io


def pickle_size(n):
    buf = io.BytesIO()
    ForkingPickler(buf).dump(shmlab.zeros(n))
    return len(buf.getvalue())


display(pickle_size(10))
""",
}

# --- lab 2 -----------------------------------------------------------------------------------
LAB2_WRONG_A = {
    "ex1_unlinked_segment": """
def create_unlinked_segment(size):
    name = segment_name()
    fd = shm_open(name, os.O_RDWR | os.O_CREAT, 0o600)  # wrong: no O_EXCL
    try:
        os.ftruncate(fd, size)
    except BaseException:
        os.close(fd)
        raise
    finally:
        shm_unlink(name)
    return fd
""",
    "ex2_fd_passing": """
def send_fd(sock, fd):
    socket.send_fds(sock, [b"x"], [os.dup(fd)])  # wrong: the dup is never closed


def recv_fd(sock):
    _, fds, _, _ = socket.recv_fds(sock, 1, 1)
    return fds[0]
""",
    "ex3_rebuild_cache": """
def rebuild_storage_fd(fd, size, cache):
    key = os.fstat(fd).st_ino  # wrong: an inode number alone
    if key not in cache:
        cache[key] = shmlab.UntypedStorage._new_shared_fd_cpu(fd, size)
    return cache[key]
""",
    "ex4_fd_ledger": """
def receive_storage(sock, size, cache):
    return rebuild_storage_fd(recv_fd(sock), size, cache)  # wrong: the received fd leaks
""",
}
LAB2_WRONG_B = {
    "ex1_unlinked_segment": """
def create_unlinked_segment(size):
    name = segment_name()
    fd = shm_open(name, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.ftruncate(fd, size)  # wrong: the fd leaks when this raises
    finally:
        shm_unlink(name)
    return fd
""",
    "ex2_fd_passing": """
def send_fd(sock, fd):
    socket.send_fds(sock, [b"x"], [fd])


def recv_fd(sock):
    _, fds, _, _ = socket.recv_fds(sock, 1, 1)
    return os.dup(fds[0])  # wrong: the received fd stays open
""",
    "ex3_rebuild_cache": """
def rebuild_storage_fd(fd, size, cache):
    if fd not in cache:  # wrong: fd numbers are reused
        cache[fd] = shmlab.UntypedStorage._new_shared_fd_cpu(fd, size)
    return cache[fd]
""",
    "ex4_fd_ledger": """
def receive_storage(sock, size, cache):
    fd = recv_fd(sock)
    key = (os.fstat(fd).st_ino, os.fstat(fd).st_dev)
    if key in cache:
        return cache[key]  # wrong: a copy of a segment already held leaks its fd
    try:
        return rebuild_storage_fd(fd, size, cache)
    finally:
        os.close(fd)
""",
}
LAB2_RIGHT = {
    "ex1_unlinked_segment": """
def create_unlinked_segment(size):
    while True:
        name = segment_name()
        try:
            fd = shm_open(name, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            continue  # as torch does: the next name
        break
    try:
        shm_unlink(name)
        os.posix_fallocate(fd, 0, size)
    except BaseException:
        os.close(fd)
        raise
    return fd
""",
    "ex2_fd_passing": """
import array


def send_fd(sock, fd):
    sock.sendmsg([b"!"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fd]))])


def recv_fd(sock):
    _, ancillary, _, _ = sock.recvmsg(1, socket.CMSG_SPACE(4))
    fds = array.array("i")
    for _level, _kind, data in ancillary:
        fds.frombytes(data[:len(data) - len(data) % 4])
    return fds[0]
""",
    "ex3_rebuild_cache": """
def rebuild_storage_fd(fd, size, cache):
    st = os.fstat(fd)
    found = cache.get((st.st_ino, st.st_dev))
    if found is None:
        found = cache[st.st_ino, st.st_dev] = shmlab.UntypedStorage._new_shared_fd_cpu(fd, size)
    return found
""",
    "ex4_fd_ledger": """
import contextlib


def receive_storage(sock, size, cache):
    with contextlib.ExitStack() as stack:
        fd = recv_fd(sock)
        stack.callback(os.close, fd)
        storage = rebuild_storage_fd(fd, size, cache)
    display(storage.nbytes())
    return storage
""",
}

# --- lab 3 -----------------------------------------------------------------------------------
LAB3_CLOSE = """

def close(name, mapping):
    fd = shm_open(name, os.O_RDWR, 0o600)
    try:
        count = read_count(fd) - 1
        write_count(fd, count)
        if count == 0:
            shm_unlink(name)
    finally:
        os.close(fd)
    mapping.close()
"""
LAB3_INCREF = """
def incref(name):
    fd = shm_open(name, os.O_RDWR, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        write_count(fd, read_count(fd) + 1)
        fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
"""
LAB3_DECREF = """
def decref(name):
    fd = shm_open(name, os.O_RDWR, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        count = read_count(fd) - 1
        write_count(fd, count)
        if count == 0:
            shm_unlink(name)
        fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
"""
LAB3_WRONG_A = {
    "ex1_attach_close": """
def attach(name, size):
    fd = shm_open(name, os.O_RDWR, 0o600)
    try:
        write_count(fd, read_count(fd) + 1)  # wrong: counted before a map that may fail
        return mmap.mmap(fd, HEADER_SIZE + size)
    finally:
        os.close(fd)
""" + LAB3_CLOSE,
    "ex2_safe_updates": LAB3_INCREF + """

def decref(name):
    fd = shm_open(name, os.O_RDWR, 0o600)
    try:
        count = read_count(fd) - 1  # wrong: read before the lock is taken
        fcntl.flock(fd, fcntl.LOCK_EX)
        write_count(fd, count)
        if count == 0:
            shm_unlink(name)
        fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
""",
    "ex3_in_flight": """
def send_handle(name):
    incref(name)
    return name


def receive_handle(message, size):
    mapping = attach(message, size)
    decref(message)  # wrong: never reached when attach raises, and the segment leaks
    return mapping
""",
    "ex4_safe_attach": """
def safe_attach(name, size):
    fd = shm_open(name, os.O_RDWR, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            count = read_count(fd)
            if count <= 0:
                raise FileNotFoundError(name)
            write_count(fd, count + 1)  # wrong: counted before a map that may fail
            return mmap.mmap(fd, HEADER_SIZE + size)
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
""",
}
LAB3_WRONG_B = {
    "ex1_attach_close": """
def attach(name, size):
    fd = shm_open(name, os.O_RDWR, 0o600)
    mapping = mmap.mmap(fd, HEADER_SIZE + size)  # wrong: the fd leaks if this raises
    write_count(fd, read_count(fd) + 1)
    os.close(fd)
    return mapping
""" + LAB3_CLOSE,
    "ex2_safe_updates": """
def incref(name):
    fd = shm_open(name, os.O_RDWR, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        count = read_count(fd) + 1
        fcntl.flock(fd, fcntl.LOCK_UN)
        write_count(fd, count)  # wrong: written after the lock is gone
    finally:
        os.close(fd)

""" + LAB3_DECREF,
    "ex3_in_flight": """
def send_handle(name):
    incref(name)
    return name


def receive_handle(message, size):
    decref(message)  # wrong: the in-flight count is given back before attaching
    return attach(message, size)
""",
    "ex4_safe_attach": """
def safe_attach(name, size):
    fd = shm_open(name, os.O_RDWR, 0o600)
    try:
        count = read_count(fd)  # wrong: read before the lock is taken
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            if count <= 0:
                raise FileNotFoundError(name)
            mapping = mmap.mmap(fd, HEADER_SIZE + size)
            write_count(fd, count + 1)
            return mapping
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
""",
}
LAB3_RIGHT = {
    "ex1_attach_close": """
def attach(name, size):
    fd = os.open(f"/dev/shm{name}", os.O_RDWR)
    try:
        mapping = mmap.mmap(fd, HEADER_SIZE + size)
        write_count(fd, read_count(fd) + 1)
    finally:
        os.close(fd)
    return mapping
""" + LAB3_CLOSE,
    "ex2_safe_updates": """
def _update(name, delta):
    fd = shm_open(name, os.O_RDWR, 0o600)
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX)  # a POSIX record lock: /proc/locks lists it too
        try:
            count = read_count(fd) + delta
            write_count(fd, count)
            if count == 0:
                shm_unlink(name)
        finally:
            fcntl.lockf(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def incref(name):
    _update(name, +1)


def decref(name):
    _update(name, -1)
""",
    "ex4_safe_attach": """
class SegmentGone(FileNotFoundError):
    \"\"\"More precise than the check asks for, and still a FileNotFoundError.\"\"\"


def safe_attach(name, size):
    fd = shm_open(name, os.O_RDWR, 0o600)
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX)
        try:
            count = read_count(fd)
            if count <= 0:
                raise SegmentGone(f"{name} is being freed")
            mapping = mmap.mmap(fd, HEADER_SIZE + size)
            write_count(fd, count + 1)
            return mapping
        finally:
            fcntl.lockf(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
""",
}

# --- lab 4 -----------------------------------------------------------------------------------
LAB4_TRACKER = """
class Tracker:
    def __init__(self):
        self.clients = set()
        self.registered = set()
        self.seen_any = False

    def client_joined(self, client, now):
        self.clients.add(client)
        self.seen_any = True

    def client_left(self, client, now):
        self.clients.discard(client)

    def register(self, client, name):
        self.registered.add(name)

    def free(self, name):
        self.registered.{FREE}(name)

    def should_exit(self, now):
        return self.seen_any and not self.clients
"""
LAB4_SERVE_HEAD = """
def serve(server, tracker, reclaim, deadline):
    sel = selectors.DefaultSelector()
    sel.register(server, selectors.EVENT_READ)
    while time.monotonic() < deadline:
        now = time.monotonic()
        if tracker.should_exit(now):
            return reclaim(set(tracker.registered))
        for key, _ in sel.select(timeout=0.02):
            if key.fileobj is server:
                conn, _ = server.accept()
                sel.register(conn, selectors.EVENT_READ)
                tracker.client_joined(conn, now)
                continue
            data = key.fileobj.recv(4096)
            if not data:
                sel.unregister(key.fileobj)
"""
LAB4_SERVE_TAIL = """
                tracker.client_left(key.fileobj, now)
                continue
            for line in data.decode().splitlines():
                word, _, name = line.partition(" ")
                if word == "REGISTER":
                    tracker.register(key.fileobj, name)
                elif word == "FREE":
                    tracker.free(name)
    return None
"""
LAB4_WRONG_A = {
    "ex1_reclaim": """
def reclaim(registered):
    unlinked = []
    for file in os.listdir("/dev/shm"):
        if any(file.startswith(name) for name in registered):  # wrong: a prefix is no name
            os.unlink("/dev/shm/" + file)
            unlinked.append(file)
    return unlinked
""",
    "ex2_tracker": """
class Tracker:
    def __init__(self):
        self.clients = {}
        self.registered = set()
        self.seen_any = False

    def client_joined(self, client, now):
        self.clients[client] = set()
        self.seen_any = True

    def client_left(self, client, now):
        # wrong: a dead client's names are exactly the ones the manager must reclaim
        self.registered -= self.clients.pop(client, set())

    def register(self, client, name):
        self.clients.setdefault(client, set()).add(name)
        self.registered.add(name)

    def free(self, name):
        self.registered.discard(name)

    def should_exit(self, now):
        return self.seen_any and not self.clients
""",
    "ex3_grace": """
class GraceTracker(Tracker):
    def __init__(self, grace):
        super().__init__()
        self.grace = 0.5  # wrong: the argument is ignored
        self.last_left = None

    def client_joined(self, client, now):
        super().client_joined(client, now)
        self.last_left = None

    def client_left(self, client, now):
        super().client_left(client, now)
        if not self.clients:
            self.last_left = now

    def should_exit(self, now):
        return super().should_exit(now) and self.last_left is not None \\
            and now - self.last_left >= self.grace
""",
    "ex4_serve": """
import socket as _socket


def serve(server, tracker, reclaim, deadline):
    server.settimeout(0.02)
    while time.monotonic() < deadline:
        if tracker.should_exit(time.monotonic()):
            return reclaim(set(tracker.registered))
        try:
            conn, _ = server.accept()
        except _socket.timeout:
            continue
        tracker.client_joined(conn, time.monotonic())
        conn.settimeout(None)
        while data := conn.recv(4096):  # wrong: blocks on this one client until it is gone
            for line in data.decode().splitlines():
                word, _, name = line.partition(" ")
                if word == "REGISTER":
                    tracker.register(conn, name)
                elif word == "FREE":
                    tracker.free(name)
        conn.close()
        tracker.client_left(conn, time.monotonic())
    return None
""",
}
LAB4_WRONG_B = {
    "ex1_reclaim": """
import glob


def reclaim(registered):
    unlinked = []
    for path in glob.glob(f"/dev/shm/shmlab_{os.getpid()}_*"):  # wrong: everything of ours
        os.unlink(path)
        unlinked.append(os.path.basename(path))
    return unlinked
""",
    "ex2_tracker": LAB4_TRACKER.replace("{FREE}", "remove"),  # wrong: a second free raises
    "ex3_grace": """
class GraceTracker(Tracker):
    def __init__(self, grace):
        super().__init__()
        self.grace = grace
        self.first_left = None

    def client_left(self, client, now):
        super().client_left(client, now)
        if self.first_left is None:
            self.first_left = now  # wrong: counts from the first departure

    def should_exit(self, now):
        return super().should_exit(now) and now - self.first_left >= self.grace
""",
    "ex4_serve": "_kept = []\n" + LAB4_SERVE_HEAD + """
                _kept.append(key.fileobj)  # wrong: never closed
""" + LAB4_SERVE_TAIL,
}
LAB4_RIGHT = {
    "ex1_reclaim": """
def reclaim(registered):
    unlinked = []
    for name in sorted(registered):
        try:
            os.remove(os.path.join("/dev/shm", name))
        except FileNotFoundError:
            pass
        else:
            unlinked.append(name)
    display(unlinked)
    return unlinked
""",
    "ex2_tracker": LAB4_TRACKER.replace("{FREE}", "discard"),
    "ex4_serve": LAB4_SERVE_HEAD + """
                key.fileobj.close()
""" + LAB4_SERVE_TAIL,
}

# --- lab 5 -----------------------------------------------------------------------------------
LAB5_WORKER = """
def train_worker(rank, world, model, data, epochs):
    torch.set_num_threads(1)
    x, y = data.x_train[rank::world], data.y_train[rank::world]
    optimizer = torch.optim.SGD({PARAMS}, lr=0.05, momentum=0.5)
    gen = torch.Generator().manual_seed(rank)
    for _ in range({EPOCHS}):
        order = torch.randperm(len(x), generator=gen)
        for i in range(0, len(x), 32):
            idx = order[i:i + 32]
            optimizer.zero_grad()
            F.cross_entropy({MODEL}(x[idx]), y[idx]).backward()
            optimizer.step()
"""


def _worker(params="model.parameters()", epochs="epochs", model="model") -> str:
    return LAB5_WORKER.replace("{PARAMS}", params).replace(
        "{EPOCHS}", epochs).replace("{MODEL}", model)


LAB5_WRONG_A = {
    "ex1_worker": """
def train_worker(rank, world, model, data, epochs):
    torch.set_num_threads(1)
    x, y = data.x_train[rank::world], data.y_train[rank::world]
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for i in range(0, len(x), 16):  # wrong: one pass, whatever `epochs` says (fast enough
        optimizer.zero_grad()       # to reach 0.85 anyway)
        F.cross_entropy(model(x[i:i + 16]), y[i:i + 16]).backward()
        optimizer.step()
""",
    "ex2_baseline": """
def baseline():
    model = make_model(seed=0)
    start = time.perf_counter()
    train_worker(0, 1, model, data, 2)  # wrong: 2 epochs, not 5
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "accuracy": accuracy(model, data.x_test, data.y_test)}
""",
    "ex3_measure": """
def measure():
    single = baseline()
    shared = make_model(seed=0)
    shared.share_memory()
    start = time.process_time()  # wrong: this process's CPU time, not the workers'
    lab5._run(train_worker, shared, data, processes=2, epochs=5)
    hogwild_seconds = time.process_time() - start
    return {"single_seconds": single["seconds"], "single_accuracy": single["accuracy"],
            "hogwild_seconds": hogwild_seconds,
            "hogwild_accuracy": accuracy(shared, data.x_test, data.y_test)}
""",
    "ex4_identity": """
def storage_identity(p):
    fd, _ = p.untyped_storage()._share_fd_cpu_()
    return (fd, os.getpid())  # wrong: an fd number names nothing in another process
""",
}
LAB5_WRONG_B = {
    # wrong: the optimizer steps a private copy, the shared model never moves
    "ex1_worker": "import copy\n" + _worker(params="mine.parameters()", model="mine").replace(
        "    torch.set_num_threads(1)\n",
        "    torch.set_num_threads(1)\n    mine = copy.deepcopy(model)\n", 1),
    "ex2_baseline": """
def baseline():
    model = make_model(seed=0)
    start = time.perf_counter()
    train_worker(0, 2, model, data, 5)  # wrong: one shard of two
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "accuracy": accuracy(model, data.x_test, data.y_test)}
""",
    "ex3_measure": """
def measure():
    single = baseline()
    shared = make_model(seed=0)
    shared.share_memory()
    hogwild_seconds, _ = lab5._run(train_worker, shared, data, processes=2, epochs=0)  # wrong
    return {"single_seconds": single["seconds"], "single_accuracy": single["accuracy"],
            "hogwild_seconds": hogwild_seconds,
            "hogwild_accuracy": accuracy(shared, data.x_test, data.y_test)}
""",
    "ex4_identity": """
def storage_identity(p):
    fd, size = p.untyped_storage()._share_fd_cpu_()
    return (os.fstat(fd).st_ino, size)  # wrong: the size is no device
""",
}
LAB5_RIGHT = {
    "ex1_worker": """
def train_worker(rank, world, model, data, epochs):
    torch.set_num_threads(1)
    x, y = data.x_train[rank::world], data.y_train[rank::world]
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    for _epoch in range(epochs):
        for i in range(0, len(x), 64):
            loss = F.cross_entropy(model(x[i:i + 64]), y[i:i + 64])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
""",
    "ex2_baseline": """
def baseline():
    model = make_model(seed=0)
    start = time.perf_counter()
    train_worker(0, 1, model, data, 5)
    seconds = time.perf_counter() - start
    right = (model(data.x_test).argmax(dim=1) == data.y_test).sum().item()  # by hand
    result = {"seconds": seconds, "accuracy": right / len(data.y_test)}
    display(result)
    return result
""",
    "ex3_measure": """
def _accuracy_by_hand(model):
    with torch.no_grad():
        return (model(data.x_test).argmax(1) == data.y_test).double().mean().item()


def measure():
    single = baseline()
    shared = make_model(seed=0)
    shared.share_memory()
    hogwild_seconds, _ = lab5._run(train_worker, shared, data, processes=2, epochs=5)
    return {"single_seconds": single["seconds"], "single_accuracy": single["accuracy"],
            "hogwild_seconds": hogwild_seconds, "hogwild_accuracy": _accuracy_by_hand(shared)}
""",
}

LABS = {
    "lab1_reducers": (LAB1_WRONG_A, LAB1_WRONG_B, LAB1_RIGHT),
    "lab2_file_descriptors": (LAB2_WRONG_A, LAB2_WRONG_B, LAB2_RIGHT),
    "lab3_file_system_refcount": (LAB3_WRONG_A, LAB3_WRONG_B, LAB3_RIGHT),
    "lab4_shm_manager": (LAB4_WRONG_A, LAB4_WRONG_B, LAB4_RIGHT),
    "lab5_hogwild": (LAB5_WRONG_A, LAB5_WRONG_B, LAB5_RIGHT),
}
VARIANTS = ("wrong_a", "wrong_b", "right")


def build(lab: str, answers: dict, folder: Path) -> Path:
    """``lab``'s instructor copy with ``answers``: {grade_id: source, or [halves of a split
    cell]} and {("above", grade_id): a helper cell of the learner's put right above it}."""
    nb = release.read(release.SOURCE / f"{lab}.ipynb")
    cells = []
    for cell in nb.cells:
        gid = _meta(cell).get("grade_id")
        if ("above", gid) in answers:
            cells.append(nbformat.v4.new_code_cell(answers["above", gid].strip()))
        if gid in answers:
            parts = answers[gid] if isinstance(answers[gid], list) else [answers[gid]]
            for part in parts:
                half = copy.deepcopy(cell)
                half.source = part.strip()
                if len(parts) > 1:
                    half.id = nbformat.v4.new_code_cell().id
                cells.append(half)
        else:
            cells.append(cell)
    nb.cells = cells
    folder.mkdir(parents=True, exist_ok=True)
    out = folder / f"{lab}.ipynb"
    nbformat.write(nb, out)
    return out


@pytest.fixture(scope="module")
def graded(tmp_path_factory) -> dict[tuple[str, str], dict[str, grade.Exercise]]:
    """Every lab's three notebooks, graded in one batch: {(lab, variant): {grade_id: row}}."""
    root = tmp_path_factory.mktemp("answers")
    paths = {(lab, v): build(lab, answers, root / f"{lab}-{v}")
             for lab, sets in LABS.items() for v, answers in zip(VARIANTS, sets, strict=True)}
    results = grade.grade_batch(list(paths.values()), timeout=120)
    return {key: {e.grade_id: e for e in r.exercises}
            for key, r in zip(paths, results, strict=True)}


WRONG_CASES = [(lab, v, gid) for lab, sets in LABS.items()
               for v, answers in zip(VARIANTS[:2], sets[:2], strict=True) for gid in answers]


@pytest.mark.slow
@pytest.mark.parametrize(("lab", "variant", "gid"), WRONG_CASES,
                         ids=[f"{lab[:4]}-{v}-{gid}" for lab, v, gid in WRONG_CASES])
def test_a_wrong_answer_loses_its_marks(graded, lab, variant, gid):
    row = graded[lab, variant][f"test_{gid}"]
    assert row.score == 0, (row.grade_id, row.output[-3000:])
    assert row.error, row


@pytest.mark.slow
@pytest.mark.parametrize("lab", LABS)
def test_a_right_answer_written_otherwise_scores_full_marks(graded, lab):
    rows = graded[lab, "right"]
    lost = {gid: (r.error, r.output[-2000:]) for gid, r in rows.items() if r.score != r.points}
    assert not lost, lost
    assert set(rows) >= {f"test_{g}" for g in LABS[lab][2] if isinstance(g, str)}


def test_plan_merges_split_cells_and_keeps_the_learners_helpers(tmp_path):
    source = release.read(release.SOURCE / "lab1_reducers.ipynb")
    learner = release.read(build("lab1_reducers", LAB1_RIGHT, tmp_path))
    jobs = {j["grade_id"]: j for j in grade.plan(source, learner)}
    ex1 = jobs["test_ex1_point_reducer"]["cells"]
    (answer,) = [c for c in ex1 if c["role"] == "answer"]
    assert "def rebuild_point" in answer["source"] and "def reduce_point" in answer["source"]
    helpers = [c for c in ex1 if c["role"] == "helper"]
    assert any("def _coords" in c["source"] for c in helpers), ex1
    # Exercise 2 runs the instructor's exercise 1, and the learner's definitions from it.
    ex2 = jobs["test_ex2_tensor_reducer"]["cells"]
    defs = [c["source"] for c in ex2 if c["role"] == "helper"]
    assert any("def _view_of" in s and "display(" not in s for s in defs), ex2
    assert [c["role"] for c in ex2].index("helper") < [c["role"] for c in ex2].index("answer")

