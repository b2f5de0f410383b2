"""shmlab installs and runs on the supported Pythons found on this machine.

Which interpreters: of the Makefile's PYTHONS, those found here (pyenv's versions, `python3.N` on
PATH, `/usr/bin/python3`). SHMLAB_PYTHONS says which of them run:

* unset (what `make test` and CI do): the cheapest set that still covers the range, `select()`:
  the oldest and the newest supported minor version found, and the distribution's own
  `/usr/bin/python3` (built differently: Debian's has no ensurepip without python3-venv, and its
  pip is older). The suite's own interpreter is left out (the whole suite just ran on it). Under
  CI=true at least three must run.
* `all` (`make test-pythons`): every one found. `none`: none (a quick local `make test`).
* paths separated by `:`: exactly those.

For each, one test runs `make setup PYTHON=<it> VENV=<throwaway>` as a learner would, then a smoke
set in that venv: import, the pins are what got installed, one torch-vs-shmlab parity test per
sharing strategy, `python -m shmlab.labs grade` on a lab's instructor copy (full marks),
00_start_here headless, the version-specific facts the notebooks teach, and pip's choice of the
CPU torch build when a CPU index sits beside PyPI. Interpreters not found or not selected are
skipped with the reason.

Cost: without a CPU index for its Python, pip installs PyPI's CUDA build of torch (about 5 GB
installed). The machine's proxy sends no caching headers, so pip's HTTP cache stores nothing:
the big wheels (torch and, for the CUDA build, its NVIDIA wheels) are kept in a wheelhouse
instead (SHMLAB_WHEELHOUSE, default ~/.cache/shmlab-wheelhouse; `off` to go to the network every
time), filled by the interpreter's own `pip download` and handed to `make setup` as
`PIP_ARGS=--find-links`, like a learner's pip cache. `--no-compile` is passed too: compiling
every module of torch to bytecode in a venv that is deleted a minute later is pure waste (the
modules the smoke set imports are compiled when imported). Each venv is deleted right after its
test. Each test prints its install and smoke times.
"""

from __future__ import annotations

import fcntl
import glob
import json
import os
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest
from packaging.version import Version
from support.nbutil import REPO
from test_packaging import constraints, makefile_pythons, pinned_lines

SUPPORTED = makefile_pythons()
CHOICE = os.environ.get("SHMLAB_PYTHONS", "")
MIN_UNDER_CI = 3
PYENV_ROOT = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv"))
WHEELHOUSE = os.environ.get("SHMLAB_WHEELHOUSE", str(Path.home() / ".cache/shmlab-wheelhouse"))
INSTALL_TIMEOUT = 1800  # a cold CUDA-build install on 2 busy cores took 341 s
SMOKE_TIMEOUT = 600
SMOKE_TESTS = [
    "tests/pythons/test_packaging.py::test_constraints_agree_with_what_is_installed",
    # one parity test per sharing strategy
    "tests/core/test_reductions_parity.py::test_fd_strategy_leaves_dev_shm_empty_like_torch",
    "tests/core/test_file_system.py::test_segment_layout_refcounts_and_the_last_closer_unlinks_like_torch",
    # one notebook headless, and the kernel it ran in is the venv's
    "tests/notebooks/test_notebooks.py::test_notebook_runs_headless[notebooks/00_start_here.ipynb]",
    "tests/notebooks/test_notebooks.py::test_start_here_reports_every_check",
    "tests/notebooks/test_notebooks.py::test_kernel_is_this_interpreter",
]
LAB = "shmlab/labs/source/lab1_reducers.ipynb"
# What the notebooks teach that depends on the Python version, asked of the interpreter itself.
PROBE = r"""
import inspect, json, mmap, multiprocessing, os, sys, threading, warnings
import multiprocessing.forkserver, multiprocessing.resource_tracker, multiprocessing.shared_memory
import torch, torch.multiprocessing
import shmlab

facts = {
    "python": sys.version.split()[0], "prefix": sys.prefix,
    "torch": torch.__version__, "cuda_build": torch.version.cuda, "shmlab": shmlab.__version__,
    "start_method": multiprocessing.get_start_method(),
    "sharing_strategy": torch.multiprocessing.get_sharing_strategy(),
    "sharing_strategies": sorted(torch.multiprocessing.get_all_sharing_strategies()),
    "shared_memory_track": "track" in inspect.signature(
        multiprocessing.shared_memory.SharedMemory).parameters,
    "resource_tracker_pid": hasattr(multiprocessing.resource_tracker._resource_tracker, "_pid"),
    "forkserver_pid": hasattr(multiprocessing.forkserver._forkserver, "_forkserver_pid"),
}
try:
    mmap.mmap(-1, 4096, trackfd=False).close()
    facts["mmap_trackfd"] = True
except TypeError:
    facts["mmap_trackfd"] = False
stop = threading.Event()
thread = threading.Thread(target=stop.wait)
thread.start()
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
stop.set()
thread.join()
facts["fork_warns_when_threaded"] = any(
    issubclass(w.category, DeprecationWarning) and "fork" in str(w.message) for w in caught)
# Scripts run as a real main module (python main.py): which processes run its top level, and
# what a fork of a threaded process prints under the default warning filters.
import subprocess, tempfile
MAIN = '''
import json, multiprocessing, os, sys, threading
with open(os.environ["TOPLEVEL_LOG"], "a") as f:
    f.write(str(os.getpid()) + "\\n")
def child(q):
    q.put(os.getpid())
def nothing():
    pass
if __name__ == "__main__":
    if sys.argv[1] == "forkserver":
        ctx = multiprocessing.get_context("forkserver")
        q = ctx.Queue()
        p = ctx.Process(target=child, args=(q,))
        p.start()
        pid = q.get(timeout=60)
        p.join(60)
        print(json.dumps([pid, multiprocessing.forkserver._forkserver._forkserver_pid]))
    else:
        stop = threading.Event()
        thread = threading.Thread(target=stop.wait)
        thread.start()
        p = multiprocessing.get_context("fork").Process(target=nothing)
        p.start()
        p.join()
        stop.set()
        thread.join()
'''
with tempfile.TemporaryDirectory() as folder:
    script, log = os.path.join(folder, "main.py"), os.path.join(folder, "toplevel.log")
    with open(script, "w") as f:
        f.write(MAIN)
    env = {**os.environ, "TOPLEVEL_LOG": log}
    out = subprocess.run([sys.executable, script, "forkserver"], env=env, capture_output=True,
                         text=True, timeout=120, check=True)
    child, server = json.loads(out.stdout.splitlines()[-1])
    with open(log) as f:
        ran = {int(line) for line in f}
    # CPython gh-126631: the server looked for "main_path", spawn sets "init_main_from_path"
    facts["forkserver_preload_fixed"] = "init_main_from" in inspect.getsource(
        multiprocessing.forkserver.ForkServer.ensure_running)
    facts["forkserver_server_runs_main"] = server in ran
    facts["forkserver_child_runs_main"] = child in ran
    out = subprocess.run([sys.executable, script, "fork"], env=env, capture_output=True,
                         text=True, timeout=120, check=True)
    facts["mp_fork_warns_by_default"] = "use of fork() may lead to deadlocks" in out.stderr
print(json.dumps(facts))
"""


def _ask(python: str) -> tuple[str, str] | None:
    """(full version, real path of the interpreter) or None if it does not run."""
    try:
        out = subprocess.run(
            [python, "-c", "import os, sys; print('%d.%d.%d' % sys.version_info[:3]);"
                           "print(os.path.realpath(sys.executable))"],
            capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0 or len(out.stdout.split()) != 2:
        return None  # e.g. a pyenv shim of a version that is not selected
    version, real = out.stdout.split()
    return version, real


def find_interpreters() -> dict[str, list[tuple[str, str]]]:
    """Supported minor -> [(path, full version)], one entry per distinct interpreter."""
    if CHOICE not in ("", "all", "none"):
        paths = CHOICE.split(":")
    else:
        paths = []
        for minor in SUPPORTED:
            paths += sorted(glob.glob(str(PYENV_ROOT / "versions" / f"{minor}.*" / "bin" /
                                          f"python{minor}")))
            paths += [shutil.which(f"python{minor}"), f"/usr/bin/python{minor}"]
        paths += [shutil.which("python3"), "/usr/bin/python3"]
    found: dict[str, list[tuple[str, str]]] = {minor: [] for minor in SUPPORTED}
    seen = set()
    shims = str(PYENV_ROOT / "shims")
    for path in filter(None, paths):
        if path.startswith(shims) and CHOICE in ("", "all", "none"):
            continue  # slow to start; pyenv's versions are listed directly above
        answer = _ask(path)
        if answer is None or answer[1] in seen:
            continue
        seen.add(answer[1])
        version, _ = answer
        minor = version.rsplit(".", 1)[0]
        if minor in found:
            found[minor].append((path, version))
    return found


FOUND = find_interpreters()


def _is_system(path: str) -> bool:
    return path.startswith(("/usr/", "/bin/"))


def select(found: dict[str, list[tuple[str, str]]], own: str) -> set[str]:
    """The paths of the cheapest set that covers the range (see the module's docstring)."""
    minors = [m for m in SUPPORTED if found[m]]
    candidates = [(p, v) for m in minors for p, v in found[m]
                  if os.path.realpath(p) != own]
    chosen: list[str] = []
    system = [p for p, _ in candidates if _is_system(p)]
    if system:
        chosen.append(system[0])
    for minor in (minors[:1] + minors[-1:]) if minors else []:
        # that minor's first non-system interpreter (pyenv's), else whatever there is
        ranked = sorted((p for p, v in candidates if v.startswith(minor + ".")),
                        key=_is_system)
        if ranked and not any(c for c in chosen if c in ranked):
            chosen.append(ranked[0])
    for path, _ in candidates:  # fewer than three minors here: fill up with the others
        if len(chosen) >= MIN_UNDER_CI:
            break
        if path not in chosen:
            chosen.append(path)
    return set(chosen)


OWN = os.path.realpath(getattr(sys, "_base_executable", sys.executable))
if CHOICE == "none":
    SELECTED: set[str] = set()
elif CHOICE == "":
    SELECTED = select(FOUND, OWN)
else:  # all, or the paths named
    SELECTED = {p for interpreters in FOUND.values() for p, _ in interpreters}


def _params():
    for minor, interpreters in FOUND.items():
        if not interpreters:
            where = ("SHMLAB_PYTHONS" if CHOICE not in ("", "all", "none") else
                     f"{PYENV_ROOT}/versions, python{minor} on PATH, /usr/bin")
            yield pytest.param(None, None, id=f"{minor}-absent", marks=pytest.mark.skip(
                reason=f"no Python {minor} on this machine (looked in {where})"))
        for path, version in interpreters:
            kind = "system" if _is_system(path) else "pyenv" if (
                str(PYENV_ROOT) in path) else "other"
            marks = () if path in SELECTED else pytest.mark.skip(
                reason=f"{path} is not in the {'CI ' if CHOICE == '' else ''}selection "
                       f"(SHMLAB_PYTHONS={CHOICE or 'unset'}): `make test-pythons` runs it")
            yield pytest.param(path, version, id=f"{version}-{kind}", marks=marks)


def _env() -> dict[str, str]:
    """The caller's environment, less what would leak an outer make, venv or checkout in."""
    drop = {"MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES", "VIRTUAL_ENV", "PYTHONPATH",
            "PYTHONHOME", "PYTHON", "VENV"}
    return {k: v for k, v in os.environ.items() if k not in drop}


def _run(cmd, timeout, env=None, **kwargs) -> subprocess.CompletedProcess:
    out = subprocess.run(cmd, cwd=REPO, env=env or _env(), capture_output=True, text=True,
                         timeout=timeout, **kwargs)
    assert out.returncode == 0, (
        f"{' '.join(map(str, cmd))} exited {out.returncode}:\n{out.stdout[-4000:]}\n"
        f"{out.stderr[-4000:]}")
    return out


def _fake_torch_wheel(folder: Path, version: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    info = f"torch-{version}.dist-info"
    with zipfile.ZipFile(folder / f"torch-{version}-py3-none-any.whl", "w") as whl:
        whl.writestr(f"{info}/METADATA",
                     f"Metadata-Version: 2.1\nName: torch\nVersion: {version}\n")
        whl.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: shmlab-tests\n"
                                      "Root-Is-Purelib: true\nTag: py3-none-any\n")
        whl.writestr(f"{info}/RECORD", "")
    name = f"torch-{version}-py3-none-any.whl"
    (folder / "index.html").write_text(f'<html><body><a href="{name}">{name}</a></body></html>\n')


def pip_picks_cpu_torch(python: Path, pins: Path, torch: str, tmp: Path) -> str:
    """The torch version this pip installs with these pins from PyPI plus a CPU index.

    Two local indexes stand in for the two the README's advice combines: the default index with
    the public `torch-X` (PyPI's, the CUDA build) and PIP_EXTRA_INDEX_URL with `torch-X+cpu`.
    """
    _fake_torch_wheel(tmp / "pypi" / "torch", torch)
    _fake_torch_wheel(tmp / "cpu" / "torch", f"{torch}+cpu")
    env = {k: v for k, v in _env().items() if not k.startswith("PIP_")}
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_INDEX_URL=(tmp / "pypi").as_uri(),
               PIP_EXTRA_INDEX_URL=(tmp / "cpu").as_uri(), PIP_DISABLE_PIP_VERSION_CHECK="1")
    report = tmp / "report.json"
    _run([python, "-m", "pip", "install", "--dry-run", "--quiet", "--ignore-installed",
          "--no-deps", "--report", report, "-c", pins, "torch"], timeout=120, env=env)
    (install,) = json.loads(report.read_text())["install"]
    return install["metadata"]["version"]


def _big_pins(minor: str, version: str) -> tuple[str, list[str]]:
    """torch's pin, and the pins of the CUDA build's own packages, for this interpreter."""
    env = {"python_version": minor, "python_full_version": version}
    pins = [f"{r.name}=={next(iter(r.specifier)).version}" for r in pinned_lines(minor)
            if r.marker is None or r.marker.evaluate(env)]
    torch = next(p for p in pins if p.startswith("torch=="))
    cuda = [p for p in pins if p.startswith(("nvidia-", "cuda-", "triton=="))]
    return torch, cuda


def _fill_wheelhouse(python: str, minor: str, version: str) -> float:
    """Keep torch's wheel (and, for the CUDA build, its NVIDIA wheels: 3 GB) in the wheelhouse.

    Only these, fetched with --no-deps so pip resolves nothing: a full `pip download` of the
    project costs as long as the install's own resolution. Returns the seconds taken.
    """
    if WHEELHOUSE == "off":
        return 0.0
    started = time.monotonic()
    if subprocess.run([python, "-m", "pip", "--version"], capture_output=True,
                      timeout=60).returncode != 0:
        return 0.0  # a system Python without pip: make setup downloads on its own
    Path(WHEELHOUSE).mkdir(parents=True, exist_ok=True)
    torch, cuda = _big_pins(minor, version)
    fetch = [python, "-m", "pip", "download", "--no-deps", "-d", WHEELHOUSE,
             "--find-links", WHEELHOUSE]
    # One download at a time: under pytest-xdist the interpreters install side by side, and
    # their CUDA builds share the NVIDIA wheels, which two pips must not write at once (nor
    # one install read half-written). The installs themselves run in parallel.
    with open(Path(WHEELHOUSE) / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        got = _run([*fetch, torch], timeout=INSTALL_TIMEOUT).stdout
        if "+cpu" not in got:  # the CUDA build (no CPU index here for this Python)
            _run([*fetch, *cuda], timeout=INSTALL_TIMEOUT)
    return time.monotonic() - started


@pytest.mark.claim("C25.309", pythons="all")
@pytest.mark.slow
@pytest.mark.timeout(INSTALL_TIMEOUT + SMOKE_TIMEOUT + 300)
@pytest.mark.parametrize("python, version", list(_params()))
@pytest.mark.claim("C12.3", start_methods=("forkserver",), pythons="all")
@pytest.mark.claim("C12.9", start_methods=("forkserver",), pythons="all")
@pytest.mark.claim("C25.30", start_methods=("forkserver",), pythons="all")
@pytest.mark.claim("C25.32", start_methods=("fork",), pythons="all")
def test_installs_and_runs(python, version, tmp_path_factory, capsys):
    minor = version.rsplit(".", 1)[0]
    pins = REPO / "requirements" / f"constraints-py{minor}.txt"
    venv = tmp_path_factory.mktemp(f"venv{minor}")
    shutil.rmtree(venv)  # make setup creates it, as on a learner's machine
    try:
        started = time.monotonic()
        download = _fill_wheelhouse(python, minor, version)
        make = ["make", "setup", f"PYTHON={python}", f"VENV={venv}"]
        if WHEELHOUSE != "off":
            make.append(f"PIP_ARGS=--no-compile --find-links {WHEELHOUSE}")
        else:
            make.append("PIP_ARGS=--no-compile")
        _run(make, timeout=INSTALL_TIMEOUT)
        install = time.monotonic() - started

        started = time.monotonic()
        vpy = venv / "bin" / "python"
        # The install skipped compiling (--no-compile) and this machine may set
        # PYTHONDONTWRITEBYTECODE: then every import of torch below would compile it again
        # (30 s and more on a busy box, past a smoke test's own timeout). The probe imports
        # torch, numpy and shmlab once with bytecode writing on, as pip's default install would.
        writes = {k: v for k, v in _env().items() if k != "PYTHONDONTWRITEBYTECODE"}
        facts = json.loads(_run([vpy, "-c", PROBE], timeout=300, env=writes).stdout)
        _run([vpy, "-m", "pytest", "-p", "no:cacheprovider", "-q", *SMOKE_TESTS],
             timeout=SMOKE_TIMEOUT)
        graded = _run([vpy, "-m", "shmlab.labs", "grade", "--json", LAB], timeout=SMOKE_TIMEOUT)
        (row,) = json.loads(graded.stdout)
        cpu_pick = pip_picks_cpu_torch(vpy, pins, str(constraints(minor)["torch"]),
                                       tmp_path_factory.mktemp(f"cpuindex{minor}"))
        smoke = time.monotonic() - started
    finally:
        shutil.rmtree(venv, ignore_errors=True)  # a CUDA-build venv is 5 GB

    with capsys.disabled():
        build = f"CUDA {facts['cuda_build']}" if facts["cuda_build"] else "CPU"
        print(f"\n[pythons] {version} ({python}): install {install:.0f} s (wheelhouse download "
              f"{download:.0f} s), smoke {smoke:.0f} s; torch {facts['torch']} ({build} build); "
              f"start method {facts['start_method']!r}; fork warns with threads: "
              f"{facts['fork_warns_when_threaded']}; mmap trackfd: {facts['mmap_trackfd']}; "
              f"SharedMemory(track=): {facts['shared_memory_track']}; fork server runs __main__: "
              f"{facts['forkserver_server_runs_main']}")

    py = tuple(int(x) for x in version.split(".")[:2])
    assert facts["python"] == version and Path(facts["prefix"]) == venv
    assert Version(facts["torch"]).public == str(constraints(minor)["torch"])
    assert row["score"] == row["max_score"] > 0, row
    assert cpu_pick == f"{constraints(minor)['torch']}+cpu", (
        f"with the CPU index beside PyPI this pip took torch {cpu_pick}, not the CPU build")
    # What the notebooks teach, on this interpreter:
    # 00/01/02/03/06/08: Linux's default start method is fork up to 3.13, forkserver from 3.14.
    assert facts["start_method"] == ("forkserver" if py >= (3, 14) else "fork"), facts
    # 03: from Python 3.12 forking a multi-threaded process raises a DeprecationWarning.
    assert facts["fork_warns_when_threaded"] == (py >= (3, 12)), facts
    # 02/04: torch's default strategy on Linux is file_descriptor; file_system is the other one.
    assert facts["sharing_strategy"] == "file_descriptor", facts
    assert facts["sharing_strategies"] == ["file_descriptor", "file_system"], facts
    # 03/08/09 read these private attributes to tell multiprocessing's helpers from leaks.
    assert facts["resource_tracker_pid"] and facts["forkserver_pid"], facts
    # 03: ... a DeprecationWarning: the default filters hide it when multiprocessing forks.
    assert facts["mp_fork_warns_by_default"] is False, facts
    # 00/02/03/11, C12.3, C12.9: the fork server runs the main script's top level only where
    # gh-126631 is fixed (never up to 3.12; 3.13.0 not yet); otherwise each child runs it.
    assert facts["forkserver_server_runs_main"] == facts["forkserver_preload_fixed"], facts
    if py <= (3, 12) or version == "3.13.0":
        assert not facts["forkserver_preload_fixed"], facts
    if not facts["forkserver_preload_fixed"]:
        assert facts["forkserver_child_runs_main"], facts
    # Python 3.13 added mmap(trackfd=) and SharedMemory(track=).
    assert facts["mmap_trackfd"] == facts["shared_memory_track"] == (py >= (3, 13)), facts


def test_enough_pythons_under_ci():
    chosen = {v: p for interpreters in FOUND.values() for p, v in interpreters if p in SELECTED}
    if os.environ.get("CI") != "true":
        pytest.skip(f"not CI; {len(chosen)} supported interpreters selected: {chosen}")
    assert len(chosen) >= MIN_UNDER_CI, (
        f"CI must install on at least {MIN_UNDER_CI} of Python {', '.join(SUPPORTED)}; "
        f"selected only {chosen} (SHMLAB_PYTHONS={CHOICE or 'unset'}; found {FOUND})")


def test_the_ci_selection_covers_the_range():
    """Oldest and newest minor found, and the system Python; never the suite's own."""
    found = {m: [] for m in SUPPORTED}
    found["3.10"] = [("/p/3.10.13/bin/python3.10", "3.10.13")]
    found["3.11"] = [("/p/3.11.7/bin/python3.11", "3.11.7"), ("/usr/bin/python3", "3.11.2")]
    found["3.12"] = [("/p/3.12.1/bin/python3.12", "3.12.1")]
    found["3.13"] = [("/p/3.13.0/bin/python3.13", "3.13.0")]
    assert select(found, own="/p/3.11.7/bin/python3.11") == {
        "/usr/bin/python3", "/p/3.10.13/bin/python3.10", "/p/3.13.0/bin/python3.13"}
    only = {m: [] for m in SUPPORTED}
    only["3.12"] = [("/p/3.12.1/bin/python3.12", "3.12.1"), ("/usr/bin/python3", "3.12.3")]
    assert select(only, own="/p/3.12.1/bin/python3.12") == {"/usr/bin/python3"}
