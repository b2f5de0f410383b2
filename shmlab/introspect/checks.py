"""The doctor's machine checks: versions, start method, sharing strategy, fd limit, /dev/shm,
and a CJK font for the Chinese edition.

Each check reads the machine and returns Findings; none changes anything. The leak checks
(segments, managers, fds) are in ``leaks``, the report in ``doctor``; the command line is
``shmlab.tools.doctor``.
"""

from __future__ import annotations

import multiprocessing
import os
import platform
import resource
import shutil
import subprocess
import sys
from dataclasses import dataclass, field

from .. import introspect
from ..messages import N_, tr

SEVERITIES = ("ok", "info", "warn", "error")  # warn and error need action: exit status 1
LOW_FD_LIMIT = 4096  # the same line notebook 00 draws: a DataLoader with workers needs more
SMALL_SHM = 1 << 30  # 1 GiB; Docker gives a container 64 MiB unless told otherwise
DOCKER_DEFAULT_SHM = 64 << 20
LOW_FREE_FRACTION = 0.10
LOW_FREE_INODES = 1000  # every named segment is one inode: a tiny nr_inodes= fills first


@dataclass
class Finding:
    """One line of the report: what was checked, how bad it is, what it found, the fix."""

    check: str  # versions | start_method | sharing_strategy | fd_limit | dev_shm | segment | ...
    severity: str  # one of SEVERITIES
    message: str
    fix: str | None = None  # a command or a line of code the reader can run, or None
    details: dict = field(default_factory=dict)  # machine-readable facts (the JSON report)

    def __post_init__(self):
        if self.severity not in SEVERITIES:
            raise ValueError(f"severity {self.severity!r} is not one of {SEVERITIES}")

    @property
    def needs_action(self) -> bool:
        return self.severity in ("warn", "error")


def mib(nbytes: int) -> str:
    return f"{nbytes / 2**30:.1f} GiB" if nbytes >= 2**30 else f"{nbytes / 2**20:.1f} MiB"


def versions() -> list[Finding]:
    """Python, torch (and whether it is a CUDA build) and numpy."""
    found = {"python": platform.python_version()}
    try:
        import numpy
        import torch
    except ImportError as exc:  # the doctor must still run to say what is missing
        return [Finding("versions", "error", tr("cannot import {name}", name=exc.name),
                        tr("pip install -e . (in the repository), or pip install {name}",
                           name=exc.name))]
    found.update(torch=torch.__version__, cuda=torch.version.cuda, numpy=numpy.__version__)
    build = (tr("CUDA {cuda} build", cuda=torch.version.cuda) if torch.version.cuda
             else tr("CPU-only build"))
    return [Finding("versions", "ok" if sys.version_info >= (3, 10) else "warn",
                    tr("Python {python}, torch {torch} ({build}), numpy {numpy}",
                       python=found["python"], torch=found["torch"], build=build,
                       numpy=found["numpy"]),
                    None if sys.version_info >= (3, 10) else tr("use Python 3.10 or newer"),
                    found)]


def _start_why(method: str) -> str:
    if sys.platform == "darwin":
        return tr("macOS defaults to spawn since Python 3.8 (fork is unsafe with its system "
                  "libraries)")
    if method == "forkserver":
        return tr("Python 3.14 made forkserver Linux's default: fork copies the parent's "
                  "threads' locks in whatever state they were in")
    return tr("fork is Linux's default before Python 3.14: quick, but CUDA cannot be used in a "
              "forked child")


def start_method() -> list[Finding]:
    """The default start method and why (read without setting it)."""
    default = multiprocessing.get_all_start_methods()[0]  # documented: the first is the default
    chosen = multiprocessing.get_start_method(allow_none=True)  # None: nobody set one yet
    now = chosen or default
    text = tr("start method {method}", method=now) + (
        "" if chosen is None else tr(" (set; default {default})", default=default))
    return [Finding("start_method", "ok", tr("{text}: {why}", text=text, why=_start_why(default)),
                    details={"default": default, "set": chosen, "python": platform.python_version(),
                             "platform": sys.platform})]


def sharing_strategy() -> list[Finding]:
    """torch's sharing strategy for CPU tensors, and why it is the default here."""
    try:
        import torch.multiprocessing as torch_mp
    except ImportError:
        return []  # versions() already said torch is missing
    strategy = torch_mp.get_sharing_strategy()
    why = (tr("file_descriptor: each shared storage is an fd, freed with the last one (nothing "
              "to leak in /dev/shm, but one fd per received tensor)")
           if strategy == "file_descriptor"
           else tr("file_system: each shared storage is a named /dev/shm file that "
                   "torch_shm_manager unlinks after a crash"))
    return [Finding("sharing_strategy", "ok", tr("sharing strategy {why}", why=why),
                    details={"strategy": strategy,
                             "available": sorted(torch_mp.get_all_sharing_strategies())})]


def _nr_open() -> int:
    """The kernel's ceiling for RLIMIT_NOFILE (an 'unlimited' hard limit means this)."""
    try:
        with open("/proc/sys/fs/nr_open") as f:
            return int(f.read())
    except (OSError, ValueError):
        return 1 << 20


def fd_limit(limits: introspect.Limits | None = None) -> list[Finding]:
    """RLIMIT_NOFILE, with the line that raises it as far as an unprivileged user may."""
    limits = introspect.limits() if limits is None else limits
    soft, hard = limits.nofile_soft, limits.nofile_hard
    inf = resource.RLIM_INFINITY
    details = {"soft": soft, "hard": hard, "recommended": LOW_FD_LIMIT}
    shown = tr("ulimit -n is {soft} (hard limit {hard})",
               soft=tr("unlimited") if soft == inf else f"{soft:,}",
               hard=tr("unlimited") if hard == inf else f"{hard:,}")
    if soft == inf or soft >= LOW_FD_LIMIT:
        return [Finding("fd_limit", "ok", shown, details=details)]
    # Anyone may raise the soft limit up to the hard one; only root may raise the hard one.
    # (An "unlimited" hard limit still stops at fs.nr_open: `ulimit -n unlimited` fails.)
    target = _nr_open() if hard == inf else hard
    if target > soft:
        details["fix_to"] = target
        # The line goes in the shell (or job script) that starts Python: limits are inherited.
        # From inside Python the same is resource.setrlimit(RLIMIT_NOFILE, (target, hard)).
        details["python_fix"] = (f"resource.setrlimit(resource.RLIMIT_NOFILE, ({target}, "
                                 f"{'resource.RLIM_INFINITY' if hard == inf else hard}))")
        return [Finding("fd_limit", "warn",
                        tr("{shown}: with file_descriptor each received tensor holds one fd, "
                           "so ~{soft:,} tensors in flight end in 'Too many open files'; raise "
                           "it in the shell that starts Python", shown=shown, soft=soft),
                        f"ulimit -n {target}", details)]
    return [Finding("fd_limit", "warn",
                    tr("{shown}: the hard limit is no higher, so only root can raise it",
                       shown=shown),
                    tr("as root: /etc/security/limits.conf `nofile`, `docker run --ulimit "
                       "nofile=65536:65536`, systemd LimitNOFILE=; or torch.multiprocessing."
                       "set_sharing_strategy('file_system')"), details)]


def container() -> str | None:
    """'docker', 'podman', 'kubernetes', 'lxc', 'containerd' or None: are we in a container?"""
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        return "kubernetes"
    if os.path.exists("/.dockerenv"):
        return "docker"
    if os.path.exists("/run/.containerenv"):
        return "podman"
    try:
        with open("/proc/1/cgroup") as f:
            cgroup = f.read()
    except OSError:
        return None
    for word, kind in (("kubepods", "kubernetes"), ("docker", "docker"), ("libpod", "podman"),
                       ("lxc", "lxc"), ("containerd", "containerd")):
        if word in cgroup:
            return kind
    return None


def _shm_fix(kind: str | None) -> str:
    if kind is None:
        return tr("as root: mount -o remount,size=8G {path}", path=introspect.SHM_DIR)
    return tr("restart the container with a larger /dev/shm: docker run --shm-size=8g (or "
              "--ipc=host; compose: shm_size: 8gb); Kubernetes: mount an emptyDir with medium: "
              "Memory (and a sizeLimit) at /dev/shm")


def dev_shm(shm_dir: str = introspect.SHM_DIR) -> list[Finding]:
    """Size, free bytes and free inodes of /dev/shm, and whether it is a container's default."""
    try:
        st = os.statvfs(shm_dir)
    except FileNotFoundError:
        return [Finding("dev_shm", "error",
                        tr("{path} does not exist: POSIX shared memory (shm_open) has nowhere "
                           "to live", path=shm_dir),
                        tr("as root: mount -t tmpfs tmpfs /dev/shm"))]
    total, free = st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize
    kind = container()
    details = {"path": shm_dir, "total": total, "free": free, "inodes": st.f_files,
               "inodes_free": st.f_favail, "container": kind}
    where = tr(" in a {kind} container", kind=kind) if kind else ""
    text = tr("{path}: {total}, {free} free, {inodes:,} free inodes{where}", path=shm_dir,
              total=mib(total), free=mib(free), inodes=st.f_favail, where=where)
    if total == DOCKER_DEFAULT_SHM or total < SMALL_SHM:
        note = tr(" (Docker's default)") if total == DOCKER_DEFAULT_SHM else ""
        return [Finding("dev_shm", "warn",
                        tr("{text}: small{note}; DataLoader workers die with 'Bus error' or "
                           "'No space left on device'", text=text, note=note),
                        _shm_fix(kind), details)]
    if free < total * LOW_FREE_FRACTION:
        return [Finding("dev_shm", "warn", tr("{text}: nearly full", text=text),
                        tr("look at the segments below (python -m shmlab doctor --clean removes "
                           "the leaked ones), then ") + _shm_fix(kind), details)]
    if 0 < st.f_files and st.f_favail < LOW_FREE_INODES:
        return [Finding("dev_shm", "warn",
                        tr("{text}: nearly out of inodes (one per segment)", text=text),
                        tr("remove leaked segments (--clean), or remount with a larger "
                           "nr_inodes="), details)]
    return [Finding("dev_shm", "ok", text, details=details)]


CJK_FONT_FIX = N_("sudo apt-get install fonts-noto-cjk (Debian, Ubuntu); sudo dnf install "
                   "google-noto-sans-cjk-fonts (Fedora); brew install --cask font-noto-sans-cjk "
                   "(macOS)")


def cjk_fonts() -> list[str] | None:
    """The families ``fc-list :lang=zh`` lists (None: no fontconfig to ask)."""
    if shutil.which("fc-list") is None:
        return None
    try:
        out = subprocess.run(["fc-list", ":lang=zh", "family"], capture_output=True,
                             text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    return sorted({line.split(",")[0].strip() for line in out.splitlines() if line.strip()})


def cjk_font() -> list[Finding]:
    """A font with Chinese glyphs: without one a browser on this machine draws the Chinese
    edition (notebooks/zh/, the quiz's 中文 mode) as boxes. Info, not a warning: the English
    edition needs none, and a browser on another machine uses that machine's fonts."""
    fonts = cjk_fonts()
    if fonts is None:
        return [Finding("cjk_font", "info",
                        tr("cannot tell whether a CJK font is installed (no fc-list); the "
                           "Chinese edition needs one in the browser's machine"),
                        tr(CJK_FONT_FIX), {"fonts": None})]
    if not fonts:
        return [Finding("cjk_font", "info",
                        tr("no CJK font installed (fc-list :lang=zh is empty): a browser on "
                           "this machine shows the Chinese edition's text as boxes"),
                        tr(CJK_FONT_FIX), {"fonts": []})]
    return [Finding("cjk_font", "ok", tr("CJK font: {font}", font=fonts[0])
                    + (tr(" (+{n} more)", n=len(fonts) - 1) if len(fonts) > 1 else ""),
                    details={"fonts": fonts})]


def machine(shm_dir: str = introspect.SHM_DIR) -> list[Finding]:
    """Every machine check, in report order."""
    return [*versions(), *start_method(), *sharing_strategy(), *fd_limit(), *dev_shm(shm_dir),
            *cjk_font()]
