"""The grader is a boundary: every cheat and wrong solution we know of loses its marks.

Each test builds a notebook from the instructor copy with one or more answer cells replaced by
the cheat (or the wrong solution) and grades it; ``only=`` grades just the exercise a case
targets, to keep the suite short. A correct solution's full marks are proven in test_labs.py.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import nbformat
import pytest

from shmlab.labs import grade, integrity, release, sandbox

pytestmark = pytest.mark.timeout(400)


def _meta(cell) -> dict:
    return cell.metadata.get("nbgrader", {})


def notebook(lab: str, answers: dict[str, str], tmp_path: Path, blank: bool = False) -> Path:
    """``lab``'s instructor copy (or its learner copy, ``blank``) with ``answers`` put in."""
    nb = release.read(release.SOURCE / f"{lab}.ipynb")
    if blank:
        nb = release.release_notebook(nb)
    for cell in nb.cells:
        gid = _meta(cell).get("grade_id")
        if gid in answers:
            cell.source = answers[gid].strip().replace("{STUB}", cell.source)
    out = tmp_path / f"{lab}.ipynb"
    nbformat.write(nb, out)
    return out


def scores(path, **kw) -> dict[str, float]:
    return {e.grade_id: e.score for e in grade.grade(path, **kw).exercises}


# --- cheats on a blank notebook: 0 marks ---------------------------------------------------------
IPYTHON_CHEATS = {
    "set_custom_exc": "get_ipython().set_custom_exc((BaseException,), lambda *a, **k: None)",
    "showtraceback": "get_ipython().showtraceback = lambda *a, **k: None",
    "input_transformers_post": "get_ipython().input_transformers_post.append("
                               "lambda lines: ['pass\\n'])",
    "IPython.get_ipython": "import IPython\nIPython.get_ipython().set_custom_exc("
                           "(BaseException,), lambda *a, **k: None)",
}


@pytest.mark.parametrize("cheat", IPYTHON_CHEATS, ids=list(IPYTHON_CHEATS))
def test_ipython_cheats_on_a_blank_lab2_score_zero(cheat, tmp_path):
    # The cheat sits in the first answer cell, as on the blank lab2 (7/7 before).
    path = notebook("lab2_file_descriptors",
                    {"ex1_unlinked_segment": IPYTHON_CHEATS[cheat] + "\n{STUB}"}, tmp_path,
                    blank=True)
    result = grade.grade(path)
    assert result.score == 0, result.as_dict()
    assert "NameError" in result.exercises[0].error or "AttributeError" in \
        result.exercises[0].error


PATCHES = {
    "Cases.check": "import shmlab.labs.report as r\n"
                   "r.Cases.check = lambda self, ok, what, hint='': True",
    "Cases.__exit__": "from shmlab.labs.report import Cases\n"
                      "Cases.__exit__ = lambda self, *exc: True",
    "Cases.__code__": "from shmlab.labs.report import Cases\n"
                      "def _ok(self, *exc):\n    return True\n"
                      "Cases.__exit__.__code__ = _ok.__code__",
    "rebind lab module": "import sys, types\n_fake = types.SimpleNamespace(**{n: (lambda *a: None)"
                         " for n in dir(lab{N}) if n.startswith('check')})\n"
                         "lab{N} = _fake\nsys.modules['shmlab.labs.lab{N}'] = _fake\n"
                         "import shmlab.labs\nshmlab.labs.lab{N} = _fake",
    "builtins": "import builtins\nbuiltins.isinstance = lambda *a: True\n"
                "builtins.AssertionError = KeyboardInterrupt",
    "settrace": "import sys\nsys.settrace(lambda *a: None)",
}
BLANK_LABS = {"lab3_file_system_refcount": 3, "lab4_shm_manager": 4, "lab5_hogwild": 5}


@pytest.mark.parametrize("patch", PATCHES, ids=list(PATCHES))
def test_patching_the_checks_scores_zero(patch, tmp_path):
    lab = "lab3_file_system_refcount"
    code = PATCHES[patch].replace("{N}", "3")
    result = grade.grade(notebook(lab, {"ex1_attach_close": code + "\n{STUB}"}, tmp_path,
                                  blank=True), only={"test_ex1_attach_close"})
    (ex,) = result.exercises
    assert ex.score == 0, ex
    # Rebinding `lab3` is undone and the stub then fails; a patched builtin may kill the runner.
    assert ex.error, ex


@pytest.mark.slow
@pytest.mark.parametrize("lab", BLANK_LABS)
def test_patching_cases_in_every_answer_of_a_blank_lab_scores_zero(lab, tmp_path):
    # The 8/8 on blank labs 3, 4 and 5: the patch at the top of every answer cell.
    code = PATCHES["Cases.check"] + "\n" + PATCHES["Cases.__exit__"] + "\n{STUB}"
    nb = release.read(release.SOURCE / f"{lab}.ipynb")
    ids = [_meta(c)["grade_id"] for c in nb.cells if _meta(c).get("solution")]
    result = grade.grade(notebook(lab, dict.fromkeys(ids, code), tmp_path, blank=True))
    assert result.score == 0, result.as_dict()


@pytest.mark.parametrize("sandboxed", [True, False], ids=["sandbox", "no sandbox"])
def test_writing_the_instructor_copy_voids_the_notebook_and_the_next_batch_refuses(
        sandboxed, tmp_path, monkeypatch):
    if not sandboxed:
        monkeypatch.setenv("SHMLAB_SANDBOX", "off")  # the fallback where namespaces are missing
    src = tmp_path / "source"
    shutil.copytree(release.SOURCE, src)
    lab = "lab1_reducers"
    forged = src / f"{lab}.ipynb"
    # The cheat rewrites the instructor copy so that every test cell is `pass`.
    cheat = (f"import json\n_p = {str(forged)!r}\n_nb = json.load(open(_p))\n"
             "for _c in _nb['cells']:\n"
             "    if _c.get('metadata', {}).get('nbgrader', {}).get('grade'):\n"
             "        _c['source'] = 'pass'\n"
             "json.dump(_nb, open(_p, 'w'))\n{STUB}")
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    cheater = notebook(lab, {"ex1_point_reducer": cheat}, tmp_path / "a", blank=True)
    honest_blank = notebook(lab, {}, tmp_path / "b", blank=True)
    first, second = grade.grade_batch([cheater, honest_blank], src)
    assert second.score == 0, second.as_dict()  # graded from the copies verified at the start
    assert first.score == 0, first.as_dict()
    if sandboxed and first.isolation == sandbox.FULL:
        # In the sandbox the write fails (read-only) or lands in a throwaway overlay (the copy
        # is under /tmp here): the copy is unchanged and the next batch grades as before.
        assert integrity.changed_sources(src, integrity.load_sources(release.SOURCE)) == []
        assert (grade.grade_batch([honest_blank], src)[0]).score == 0
        return
    assert "wrote" in first.problem, first.as_dict()
    with pytest.raises(integrity.IntegrityError, match="was modified"):
        grade.grade_batch([honest_blank], src)


def test_the_shipped_instructor_copies_match_their_recorded_hashes():
    assert set(integrity.load_sources(release.SOURCE)) == {p.name for p in release.sources()}


# --- wrong solutions: the targeted exercise loses its marks -------------------------------------
# lab3 ex1's close(), done right: the wrong attach()s below are graded with it.
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

WRONG = {
    "lab1 constant pickle_size": ("lab1_reducers", "ex3_pickle_size", """
_SIZE = len(ForkingPickler.dumps(shmlab.zeros(10)))


def pickle_size(n):
    return _SIZE  # wrong: measured once, never again
"""),
    "lab2 recv_fd leaks an fd": ("lab2_file_descriptors", "ex2_fd_passing", """
def send_fd(sock, fd):
    socket.send_fds(sock, [b"x"], [fd])


def recv_fd(sock):
    _, fds, _, _ = socket.recv_fds(sock, 1, 1)
    return os.dup(fds[0])  # wrong: the received fd stays open
"""),
    "lab3 attach never closes its fd": ("lab3_file_system_refcount", "ex1_attach_close", """
def attach(name, size):
    fd = shm_open(name, os.O_RDWR, 0o600)
    write_count(fd, read_count(fd) + 1)
    return mmap.mmap(fd, HEADER_SIZE + size)  # wrong: fd never closed


""" + LAB3_CLOSE),
    "lab3 attach writes the count as 8 bytes": ("lab3_file_system_refcount", "ex1_attach_close",
                                                """
def attach(name, size):
    fd = shm_open(name, os.O_RDWR, 0o600)
    try:
        count = struct.unpack("<q", os.pread(fd, 8, 0))[0] & 0xFFFFFFFF
        os.pwrite(fd, struct.pack("<q", count + 1), 0)  # wrong: 8 bytes, over shmlab's mark
        return mmap.mmap(fd, HEADER_SIZE + size)
    finally:
        os.close(fd)


""" + LAB3_CLOSE),
    "lab3 decref unlinks after LOCK_UN": ("lab3_file_system_refcount", "ex2_safe_updates", """
def incref(name):
    fd = shm_open(name, os.O_RDWR, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        write_count(fd, read_count(fd) + 1)
        fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def decref(name):
    fd = shm_open(name, os.O_RDWR, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        count = read_count(fd) - 1
        write_count(fd, count)
        fcntl.flock(fd, fcntl.LOCK_UN)
        if count == 0:
            shm_unlink(name)  # wrong: outside the lock
    finally:
        os.close(fd)
"""),
    "lab4 join during grace keeps the old countdown": ("lab4_shm_manager", "ex3_grace", """
class GraceTracker(Tracker):
    def __init__(self, grace):
        super().__init__()
        self.grace = grace
        self.last_left = None

    def client_joined(self, client, now):
        super().client_joined(client, now)  # wrong: the countdown is not reset

    def client_left(self, client, now):
        super().client_left(client, now)
        if not self.clients and self.last_left is None:
            self.last_left = now

    def should_exit(self, now):
        return super().should_exit(now) and self.last_left is not None \\
            and now - self.last_left >= self.grace
"""),
    "lab5 made-up numbers": ("lab5_hogwild", "ex3_measure", """
def measure():
    return {"single_seconds": 2.0, "single_accuracy": 0.93,
            "hogwild_seconds": 1.2, "hogwild_accuracy": 0.92}
"""),
    "lab5 reuses a trained model": ("lab5_hogwild", "ex3_measure", """
_trained = make_model(seed=0)
train_worker(0, 1, _trained, data, 5)


def measure():
    start = time.perf_counter()
    acc = accuracy(_trained, data.x_test, data.y_test)
    took = time.perf_counter() - start
    return {"single_seconds": took, "single_accuracy": acc,
            "hogwild_seconds": took, "hogwild_accuracy": acc}
"""),

    # The richer exercises: the most tempting mistake in each.
    "lab2 receive_storage never closes the received fd": ("lab2_file_descriptors",
                                                          "ex4_fd_ledger", """
def receive_storage(sock, size, cache):
    return rebuild_storage_fd(recv_fd(sock), size, cache)  # wrong: one fd per message
"""),
    "lab3 safe_attach reads the count before locking": ("lab3_file_system_refcount",
                                                        "ex4_safe_attach", """
def safe_attach(name, size):
    fd = shm_open(name, os.O_RDWR, 0o600)
    try:
        count = read_count(fd)  # wrong: read before the lock, stale once it is held
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
"""),
    "lab3 safe_attach relies on close() to unlock": ("lab3_file_system_refcount",
                                                     "ex4_safe_attach", """
def safe_attach(name, size):
    fd = shm_open(name, os.O_RDWR, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        count = read_count(fd)
        if count <= 0:
            raise FileNotFoundError(name)
        mapping = mmap.mmap(fd, HEADER_SIZE + size)  # wrong: it keeps the lock alive
        write_count(fd, count + 1)
        return mapping
    finally:
        os.close(fd)
"""),
    "lab4 tracker exits before any client came": ("lab4_shm_manager", "ex2_tracker", """
class Tracker:
    def __init__(self):
        self.clients = set()
        self.registered = set()

    def client_joined(self, client, now):
        self.clients.add(client)

    def client_left(self, client, now):
        self.clients.discard(client)

    def register(self, client, name):
        self.registered.add(name)

    def free(self, name):
        self.registered.discard(name)

    def should_exit(self, now):
        return not self.clients  # wrong: true at start-up too
"""),
    "lab4 serve keeps a closed socket in the selector": ("lab4_shm_manager", "ex4_serve", """
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
                key.fileobj.close()  # wrong: not unregistered; its fd number comes back
                tracker.client_left(key.fileobj, now)
                continue
            for line in data.decode().splitlines():
                word, _, name = line.partition(" ")
                if word == "REGISTER":
                    tracker.register(key.fileobj, name)
                elif word == "FREE":
                    tracker.free(name)
    return None
"""),
    "lab5 baseline times only the accuracy": ("lab5_hogwild", "ex2_baseline", """
_model = make_model(seed=0)
train_worker(0, 1, _model, data, 5)


def baseline():
    model = make_model(seed=0)
    model.load_state_dict(_model.state_dict())  # wrong: trained before baseline() ran
    start = time.perf_counter()
    acc = accuracy(model, data.x_test, data.y_test)
    return {"seconds": time.perf_counter() - start, "accuracy": acc}
"""),
    # Both honest models often reach the very same test accuracy (431/449 in about half the
    # runs), so a check that compares values alone cannot tell the two apart.
    "lab5 reports the baseline's accuracy twice": ("lab5_hogwild", "ex3_measure", """
def measure():
    single = baseline()
    shared = make_model(seed=0)
    shared.share_memory()
    hogwild_seconds, _ = lab5._run(train_worker, shared, data, processes=2, epochs=5)
    return {"single_seconds": single["seconds"], "single_accuracy": single["accuracy"],
            "hogwild_seconds": hogwild_seconds,
            "hogwild_accuracy": single["accuracy"]}  # wrong: the baseline's, twice
"""),
    "lab5 trains one model and reports it twice": ("lab5_hogwild", "ex3_measure", """
def measure():
    model, other = make_model(seed=0), make_model(seed=0)
    start = time.perf_counter()
    train_worker(0, 1, model, data, 5)
    seconds = time.perf_counter() - start
    other.load_state_dict(model.state_dict())  # wrong: no Hogwild run, a copy of the one model
    return {"single_seconds": seconds / 2,
            "single_accuracy": accuracy(model, data.x_test, data.y_test),
            "hogwild_seconds": seconds / 2,
            "hogwild_accuracy": accuracy(other, data.x_test, data.y_test)}
"""),
    "lab5 Hogwild with one worker": ("lab5_hogwild", "ex3_measure", """
def measure():
    single = baseline()
    shared = make_model(seed=0)
    shared.share_memory()
    hogwild_seconds, _ = lab5._run(train_worker, shared, data, processes=1, epochs=5)  # wrong
    return {"single_seconds": single["seconds"], "single_accuracy": single["accuracy"],
            "hogwild_seconds": hogwild_seconds,
            "hogwild_accuracy": accuracy(shared, data.x_test, data.y_test)}
"""),
    "lab5 baseline trains 2 epochs": ("lab5_hogwild", "ex2_baseline", """
def baseline():
    model = make_model(seed=0)
    start = time.perf_counter()
    train_worker(0, 1, model, data, 2)  # wrong: 2 epochs, not 5 (it still reaches 0.85)
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "accuracy": accuracy(model, data.x_test, data.y_test)}
"""),
    "lab5 baseline trains on half the rows": ("lab5_hogwild", "ex2_baseline", """
def baseline():
    model = make_model(seed=0)
    start = time.perf_counter()
    train_worker(0, 2, model, data, 5)  # wrong: one shard of two
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "accuracy": accuracy(model, data.x_test, data.y_test)}
"""),
}


@pytest.mark.parametrize("case", WRONG, ids=list(WRONG))
def test_a_wrong_solution_loses_the_marks_of_its_exercise(case, tmp_path):
    lab, grade_id, code = WRONG[case]
    target = f"test_{grade_id}"
    result = grade.grade(notebook(lab, {grade_id: code}, tmp_path), only={target})
    (ex,) = result.exercises
    assert ex.score == 0, ex
    assert "hint:" in ex.output, ex.output
