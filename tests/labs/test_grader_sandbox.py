"""Nothing one notebook does changes another's grade: the sandbox (shmlab/labs/sandbox.py).

One cheating notebook per attack of issue 27 (a ``.pth`` in site-packages, an edit to
``shmlab/__init__.py``, a ``.pyc`` with a module's mtime and size, the instructor copies
rewritten together with ``SHA256SUMS``, a write delayed until the grader exits, a ``setsid``
daemon writing verdicts into later runners through ``/proc/PID/fd``), then an honest notebook, in
one batch; then a second batch with honest notebooks only. Their marks must be the ones they get
alone.

The attacks never touch the real venv or checkout, whatever the sandbox does: the grader runs
from a throwaway venv (its own site-packages, which finds the real packages through a path
line) and a copy of the ``shmlab`` package, and the attacks aim at those. Their daemons act
only on processes carrying this run's token, and the test kills what is left of them.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
import uuid
from pathlib import Path

import pytest
from test_grader_cheats import notebook

import shmlab
from shmlab.labs import sandbox

pytestmark = [pytest.mark.timeout(400), pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="namespaces are Linux's")]

LAB = "lab1_reducers"
TOKEN_VAR = "SHMLAB_TEST_ATTACK"

# What every attack plants: in a runner of this test's grader, the check is skipped and a
# passing verdict sent (after a {"cell": "test"} line, as the real runner would).
PAYLOAD = f"""
import os as _os
if _os.environ.get({TOKEN_VAR!r}):
    import shmlab.labs.runner as _r
    def _run(job, out, _r=_r):
        _r._send(out, {{"cell": "test"}})
        return {{"passed": True, "reason": "", "traceback": ""}}
    _r.run = _run
"""
PTH_LINE = "import os; exec(open({payload!r}).read()) if os.path.exists({payload!r}) else None\n"


def _try(name: str, body: str) -> str:
    """An answer cell that runs ``body`` and prints what happened, then the blank stub."""
    indented = "\n".join("    " + line for line in body.strip().splitlines())
    return (f"import os\ntry:\n{indented}\n    print('ATTACK {name} done')\n"
            f"except OSError as _e:\n    print('ATTACK {name} blocked:', _e)\n{{STUB}}")


def _daemon(name: str, body: str) -> str:
    """An answer cell that leaves a ``setsid`` grandchild running ``body``, then the stub."""
    indented = "\n".join("            " + line for line in body.strip().splitlines())
    return (f"import os, time\n_grader = os.getppid()\nif os.fork() == 0:\n    os.setsid()\n"
            f"    if os.fork() == 0:\n        try:\n{indented}\n        finally:\n"
            f"            os._exit(0)\n    os._exit(0)\nprint('ATTACK {name} started')\n"
            "{STUB}")


def attacks(copy: Path, site: Path, token: str) -> dict[str, str]:
    pkg = copy / "shmlab"
    payload = site / "zz_payload.py"
    pth = PTH_LINE.format(payload=str(payload))
    source = pkg / "labs" / "source"
    runner = pkg / "labs" / "runner.py"
    pyc = pkg / "labs" / "__pycache__" / f"runner.{sys.implementation.cache_tag}.pyc"
    forged = json.dumps({"cell": "test"}) + "\n" + json.dumps(
        {"verdict": {"passed": True, "reason": "", "traceback": ""}}) + "\n"
    return {
        "pth": _try("pth", f"open({str(payload)!r}, 'w').write({PAYLOAD!r})\n"
                           f"open({str(site / 'zz_cheat.pth')!r}, 'w').write({pth!r})"),
        "package edit": _try("package edit",
                             f"open({str(pkg / '__init__.py')!r}, 'a').write({PAYLOAD!r})"),
        "pyc": _try("pyc", f"""
import importlib._bootstrap_external as _be
_st = os.stat({str(runner)!r})
_code = compile(open({str(runner)!r}).read() + {PAYLOAD!r}, {str(runner)!r}, 'exec')
os.makedirs({str(pyc.parent)!r}, exist_ok=True)
open({str(pyc)!r}, 'wb').write(_be._code_to_timestamp_pyc(_code, int(_st.st_mtime), _st.st_size))
"""),
        "sources with sums": _try("sources with sums", f"""
import hashlib, json
_src = {str(source)!r}
_p = _src + '/{LAB}.ipynb'
_nb = json.load(open(_p))
for _c in _nb['cells']:
    _m = _c.get('metadata', {{}}).get('nbgrader', {{}})
    if _m.get('grade'):
        _c['source'] = 'pass'
    _m.pop('solution', None)
open(_p, 'w').write(json.dumps(_nb))
_sums = [l.split('  ') for l in open(_src + '/SHA256SUMS').read().split(chr(10)) if l]
open(_src + '/SHA256SUMS', 'w').write(''.join(
    (hashlib.sha256(open(_p, 'rb').read()).hexdigest() if n == '{LAB}.ipynb' else h)
    + '  ' + n + chr(10) for h, n in _sums))
"""),
        "delayed write": _daemon("delayed write", f"""
_until = time.monotonic() + 120
while os.path.exists(f'/proc/{{_grader}}') and time.monotonic() < _until:
    time.sleep(0.01)
open({str(payload)!r}, 'w').write({PAYLOAD!r})
open({str(site / 'zz_delayed.pth')!r}, 'w').write({pth!r})
"""),
        "setsid daemon": _daemon("setsid daemon", f"""
_seen, _until = set(), time.monotonic() + 120
while time.monotonic() < _until:
    for _pid in [p for p in os.listdir('/proc') if p.isdigit()]:
        try:
            _argv = open(f'/proc/{{_pid}}/cmdline', 'rb').read().split(b'\\0')
            _env = open(f'/proc/{{_pid}}/environ', 'rb').read()
            if _pid in _seen or b'shmlab.labs.runner' not in b' '.join(_argv) \\
                    or b'{TOKEN_VAR}={token}' not in _env:
                continue
            _seen.add(_pid)
            with open(f'/proc/{{_pid}}/fd/' + _argv[-2].decode(), 'w') as _f:
                _f.write({forged!r})
        except (OSError, IndexError):
            pass
    time.sleep(0.005)
"""),
    }


# In-process forgeries of one's own grade: each meets a rule of the checker (sandbox.decide) or
# of the runner's integrity checks.
FORGE_VERDICT = ("import os, sys, json\nos.write(int(sys.argv[1]), (json.dumps({'verdict': "
                 "{'passed': True, 'reason': '', 'traceback': ''}}) + chr(10)).encode())\n"
                 "os._exit(0)")
EMPTY_THE_RECORD = """
import sys


class _Forgets(list):
    def append(self, item):
        pass  # the case is never recorded as failed


def pickle_size(n):
    frame = sys._getframe(1)
    while frame is not None:
        for value in list(frame.f_locals.values()):
            if type(value).__name__ == "Cases" and not isinstance(value.failed, _Forgets):
                value.failed = _Forgets()
                try:
                    value.check = lambda ok, what, hint="": True  # every case passes
                except AttributeError:
                    pass
        frame = frame.f_back
    return 354  # wrong: a canned number
"""

# A stand-in for the module Cases counts /dev/shm with, put in sys.modules before the check
# imports it; the answer (right otherwise) leaves a segment the stand-in hides.
HIDE_THE_LEAK = f"""
import os, sys, types
_fake = types.ModuleType("shmlab.introspect")
_fake.shm_segments = lambda *a, **k: []
sys.modules["shmlab.introspect"] = _fake


def my_rebuild_tensor(storage, offset, shape, strides, dtype):
    return shmlab.Tensor(storage, offset, shape, strides, dtype)


def my_reduce_tensor(t):
    tag = os.environ["{TOKEN_VAR}"][:8]
    open(f"/dev/shm/shmlab_{{os.getpid()}}_{{tag}}_0", "w").close()  # wrong: a leak
    return (my_rebuild_tensor,
            (t.untyped_storage(), t.storage_offset(), t.shape, t.stride(), t.dtype))
"""


def _tree(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def _kill_token_holders(token: str) -> None:
    """SIGKILL what is left of this test's daemons (they carry its token), by pid; remove the
    segments its cheats left where no sandbox stopped them."""
    for leak in Path("/dev/shm").glob(f"shmlab_*_{token[:8]}_0"):
        leak.unlink(missing_ok=True)
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue
        if f"{TOKEN_VAR}={token}".encode() in env and int(pid) != os.getpid():
            try:
                os.kill(int(pid), signal.SIGKILL)
            except ProcessLookupError:
                pass


@pytest.fixture
def throwaway(tmp_path):
    """(python, package copy, its site-packages, env): a venv and shmlab the attacks may ruin."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                   timeout=120)
    python = venv / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig."
                                "get_paths()['purelib'])"], capture_output=True, text=True,
                               check=True).stdout.strip())
    (site / "real.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    copy = tmp_path / "copy"
    shutil.copytree(Path(shmlab.__file__).parent, copy / "shmlab",
                    ignore=shutil.ignore_patterns("__pycache__"))
    token = uuid.uuid4().hex
    # No .pyc written by honest imports: a .pyc in the copy is the attack's.
    env = dict(os.environ, PYTHONPATH=str(copy), PYTHONDONTWRITEBYTECODE="1",
               **{TOKEN_VAR: token})
    try:
        yield python, copy, site, env
    finally:
        _kill_token_holders(token)


def _grade(python, env, paths, cwd) -> dict[str, dict]:
    out = subprocess.run([str(python), "-m", "shmlab.labs", "grade", "--json", "--timeout", "60",
                          *map(str, paths)], capture_output=True, text=True, env=env, cwd=cwd,
                         timeout=300)
    assert out.stdout.startswith("["), out.stderr[-3000:]
    return {r["notebook"]: r for r in json.loads(out.stdout)}


@pytest.mark.slow
def test_no_notebook_changes_the_grade_of_the_next(throwaway, tmp_path):
    python, copy, site, env = throwaway
    before = {"package": _tree(copy), "site": _tree(site)}
    cheats = attacks(copy, site, env[TOKEN_VAR])
    folders = {}
    for n, (name, code) in enumerate(cheats.items()):
        (tmp_path / f"c{n}").mkdir()
        folders[name] = notebook(LAB, {"ex1_point_reducer": code}, tmp_path / f"c{n}",
                                 blank=True)
    (tmp_path / "forge").mkdir()
    forger = notebook(LAB, {"ex1_point_reducer": FORGE_VERDICT, "ex2_tensor_reducer":
                            HIDE_THE_LEAK, "ex3_pickle_size": EMPTY_THE_RECORD},
                      tmp_path / "forge")
    victims = {}
    for kind in ("blank", "full"):
        (tmp_path / kind).mkdir()
        victims[kind] = notebook(LAB, {}, tmp_path / kind, blank=kind == "blank")

    first = _grade(python, env, [*folders.values(), forger, victims["blank"]], tmp_path)
    time.sleep(1.0)  # the delayed write's moment: the grader has exited
    second = _grade(python, env, [victims["blank"], victims["full"]], tmp_path)

    isolation = first[str(victims["blank"])].get("isolation", "")
    if isolation.startswith("off"):
        pytest.skip(f"no namespaces here, the grader says: {isolation}")
    blank_alone = {"test_ex1_point_reducer": 0, "test_ex2_tensor_reducer": 0,
                   "test_ex3_pickle_size": 0}
    for batch in (first, second):
        row = batch[str(victims["blank"])]
        assert {e["grade_id"]: e["score"] for e in row["exercises"]} == blank_alone, row
        assert all("not implemented" in e["error"] for e in row["exercises"]), row
    assert second[str(victims["full"])]["score"] == 6, second[str(victims["full"])]
    # Full, or partial where this kernel refused a piece (the row names it): never none.
    assert second[str(victims["full"])]["isolation"].startswith((sandbox.FULL, "partial"))
    # Each attack ran (in the sandbox: a read-only file, or a write to a throwaway overlay
    # over /tmp, where the copies are), and the copies it aimed at are as they were.
    for name, path in folders.items():
        out = first[str(path)]["exercises"][0]["output"]
        assert f"ATTACK {name}" in out, (name, out)
        assert first[str(path)]["score"] == 0, first[str(path)]
    assert {"package": _tree(copy), "site": _tree(site)} == before

    forged = {e["grade_id"]: e for e in first[str(forger)]["exercises"]}
    assert forged["test_ex1_point_reducer"]["score"] == 0, forged
    # Lab 1 is graded outside the learner's process (shmlab.labs.outside): its argv[1] is its
    # own request pipe's read end, not the checker's channel, and the check's Cases is not in
    # its frames, so the case fails as it is.
    assert "raised OSError" in forged["test_ex1_point_reducer"]["error"], forged
    assert forged["test_ex3_pickle_size"]["score"] == 0, forged
    assert "case(s) failed" in forged["test_ex3_pickle_size"]["error"], forged
    assert forged["test_ex2_tensor_reducer"]["score"] == 0, forged
    assert "shmlab.introspect" in forged["test_ex2_tensor_reducer"]["error"], forged


@pytest.mark.timeout(120)
def test_each_row_says_how_it_was_isolated_and_the_fallback_still_grades(tmp_path, monkeypatch,
                                                                         capsys):
    from shmlab.labs import grade

    path = notebook(LAB, {}, tmp_path)
    only = {"test_ex3_pickle_size"}
    sandboxed = grade.grade(path, only=only)
    monkeypatch.setenv("SHMLAB_SANDBOX", "off")  # as where user namespaces are forbidden
    fallback = grade.grade(path, only=only)
    assert sandboxed.score == fallback.score == 1, (sandboxed.as_dict(), fallback.as_dict())
    if not sandboxed.isolation.startswith("off"):
        assert sandboxed.isolation == sandbox.FULL, sandboxed.as_dict()
    assert fallback.isolation.startswith("off: user namespaces unavailable"), fallback.as_dict()
    assert fallback.as_dict()["isolation"] == fallback.isolation
    grade.print_table(fallback)
    assert "⚠️ sandbox off" in capsys.readouterr().out
