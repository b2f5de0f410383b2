"""Each graded exercise in its own sandbox, and a checker process the learner's code cannot reach.

Mirrors: bubblewrap's ``bwrap --unshare-user --unshare-pid --unshare-ipc --ro-bind / /
--proc /proc --tmpfs /dev/shm --tmpfs $TMPDIR --die-with-parent`` (and nsjail's mount and pid
namespaces), written out with ``unshare(2)`` and ``mount(2)`` so nothing needs installing.

The grader starts this file as a script (``python -I -S sandbox.py CHANNEL TMPDIR``: stdlib
only, so no ``.pth``, ``sitecustomize`` or package file is read before the sandbox stands) with
the runner's command line as JSON on argv[3], the paths to protect on argv[4] and the two lines
it may print, in the graded notebook's language, on argv[5] (``LEFTOVERS``). Three processes,
outside in:

* **the launcher** enters a new user, mount, pid and IPC namespace (``unshare``; the user
  namespace maps the grader's own uid, so no privilege is needed) and forks the checker, which
  is pid 1 there; it waits for it and exits with its status.
* **the checker** (pid 1) builds the sandbox: every mount read-only (the package, the venv's
  site-packages, the instructor copies: the whole tree), ``/tmp`` and the notebook's folder
  writable through overlays whose writes vanish with the sandbox (read-only where the kernel
  refuses an overlay), a fresh
  ``/proc`` that shows only the sandbox's processes, a private ``/dev/shm`` and a private
  ``TMPDIR`` (tmpfs on a folder the grader made for this run). It then leaves itself no
  power over those mounts (a nested user namespace: the mounts stay locked read-only even for
  "root" in there) and marks itself not dumpable (``PR_SET_DUMPABLE`` 0: no ``ptrace``, no
  ``/proc/1/fd`` or ``/proc/1/mem`` for the processes it starts), and starts the runner.
  The checker runs none of the learner's code and holds the only fd to the grader; the runner
  gets a pipe to the checker and nothing else of it. When the runner exits, the checker
  decides the verdict (``decide``), sends it and exits: the kernel then kills every process
  left in the pid namespace, ``setsid`` daemons and double forks included, and the private
  mounts vanish with it. As pid 1 it also ignores every signal its own processes send it.
* **the runner** (``shmlab.labs.runner``) runs the cells and the check, and streams each
  failed case to the checker the moment it fails. It shares two fds with the grader, both
  text only: stdin (the job) and stdout (what the cells print, shown to the learner); the
  verdict travels only on the checker's fd.

Where namespaces are unavailable (a kernel or container that forbids unprivileged user
namespaces, ``EPERM``), the launcher is the checker itself: a private ``TMPDIR`` still, the
same verdict rules, not dumpable, but the files stay writable and a ``setsid`` daemon can
outlive the run (``SHMLAB_SANDBOX=off`` in the grader's environment chooses this on purpose).
The first message says which (``{"sandbox": ...}``) and the grader's report says so.
"""

from __future__ import annotations

import ctypes
import json
import os
import select
import signal
import subprocess
import sys
import time

# <sched.h>, <sys/mount.h>, <sys/prctl.h>
CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWIPC = 0x20000, 0x10000000, 0x20000000, 0x08000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_NOATIME, MS_NODIRATIME, MS_BIND = 32, 1024, 2048, 4096
MS_REC, MS_PRIVATE, MS_RELATIME, MS_STRICTATIME = 16384, 1 << 18, 1 << 21, 1 << 24
PR_SET_PDEATHSIG, PR_SET_DUMPABLE = 1, 4
# A remount inside a user namespace must keep the flags the mount was locked with.
_KEEP = {"nosuid": MS_NOSUID, "nodev": MS_NODEV, "noexec": MS_NOEXEC, "noatime": MS_NOATIME,
         "nodiratime": MS_NODIRATIME, "relatime": MS_RELATIME, "strictatime": MS_STRICTATIME}
FULL = ("namespaces (user, mount, pid, ipc): read-only files (throwaway overlays on /tmp and "
        "the notebook's folder), private /dev/shm and TMPDIR")
_MAX_LINE = 4 << 20  # a verdict with a long traceback fits; a flood does not

_libc = ctypes.CDLL(None, use_errno=True)


def _call(name: str, *args) -> None:
    if getattr(_libc, name)(*args) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{name}: {os.strerror(err)}")


def _mount(source, target, fstype, flags, data=None) -> None:
    enc = (lambda s: s.encode() if isinstance(s, str) else s)
    _call("mount", enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data))


def _map_ids(uid: int, gid: int) -> None:
    """Map uid and gid 0 of the user namespace just entered to the ones outside."""
    with open("/proc/self/setgroups", "w") as f:
        f.write("deny")
    with open("/proc/self/uid_map", "w") as f:
        f.write(f"0 {uid} 1")
    with open("/proc/self/gid_map", "w") as f:
        f.write(f"0 {gid} 1")


def _mounts() -> list[tuple[str, int]]:
    """(mount point, the flags a remount must keep) of every mount this namespace sees."""
    found = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            point = fields[4].encode().decode("unicode_escape")  # \040 is a space
            flags = 0
            for opt in fields[5].split(","):
                flags |= _KEEP.get(opt, 0)
            found.append((point, flags))
    return found


def _build(tmpdir: str) -> tuple[list[str], list[str]]:
    """The mounts of the sandbox: (what could not be done, for the report; the overlaid dirs).

    The private tmpfs mounts come first and are left out of the read-only pass, so a kernel
    that refuses one of them leaves that folder shared but usable, never read-only.
    """
    _mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing below propagates out
    missing, own = [], set()
    for target, mode in (("/dev/shm", "mode=1777"), (tmpdir, "mode=700")):
        own.add(target)
        try:
            _mount("tmpfs", target, "tmpfs", MS_NOSUID | MS_NODEV, mode)
        except OSError as err:
            missing.append(f"a private {target} ({err.strerror})")
    overlaid = _scratch_overlays(tmpdir) if not missing else []
    own.update(overlaid)
    for point, flags in _mounts():
        if point in own or point.startswith(("/proc", "/sys")):
            continue
        try:
            _mount(None, point, None, MS_BIND | MS_REMOUNT | MS_RDONLY | flags)
        except OSError as err:
            missing.append(f"read-only {point} ({err.strerror})")
    try:
        _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    except OSError as err:
        missing.append(f"a /proc of its own ({err.strerror})")
    return missing, overlaid


def _scratch_overlays(tmpdir: str) -> list[str]:
    """``/tmp`` and the notebook's folder, writable through overlays whose writes vanish.

    An answer may write a scratch file next to itself or under a hard-coded ``/tmp``, as it
    could in Jupyter; the real folders (other notebooks may sit there) stay untouched. The
    layers live in the tmpfs on ``tmpdir``, which a fresh tmpfs then covers, so TMPDIR starts
    empty. A folder with other mounts below it is left read-only (an overlay would hide them),
    and so is any folder where the kernel refuses an overlay. Returns the overlaid folders.
    """
    cwd = os.getcwd()
    below = [p for p, _ in _mounts()]
    targets = [d for d in (cwd, "/tmp") if os.path.isdir(d) and d != "/"
               and not any(c in d for c in ",:\\")  # overlay's option syntax cannot name it
               and not any(p.startswith(d + "/") and not p.startswith(tmpdir) for p in below)]
    if "/tmp" in targets and (cwd + "/").startswith("/tmp/"):
        targets.remove(cwd)  # the /tmp overlay covers it
    done = []
    for n, target in enumerate(targets):
        os.mkdir(f"{tmpdir}/upper{n}")
        os.mkdir(f"{tmpdir}/work{n}")
        try:
            _mount("overlay", target, "overlay", MS_NOSUID | MS_NODEV,
                   f"lowerdir={target},upperdir={tmpdir}/upper{n},workdir={tmpdir}/work{n}")
            done.append(target)
        except OSError:
            pass
    _mount("tmpfs", tmpdir, "tmpfs", MS_NOSUID | MS_NODEV, "mode=700")
    os.chdir(cwd)  # into its overlay: our old cwd is the folder beneath it
    return done


def _writable(paths, overlaid: list[str]) -> list[str]:
    """The paths still writable for real: under an overlay, writes vanish with the sandbox."""
    return [p for p in paths if os.path.exists(p) and os.access(p, os.W_OK)
            and not any(os.path.commonpath([p, d]) == d for d in overlaid)]


def _send(fd: int, message: dict) -> None:
    data = (json.dumps(message) + "\n").encode()
    while data:
        data = data[os.write(fd, data):]


def decide(verdicts: list, failed_cases: list[str], saw_test: bool, garbled: int):
    """The verdict the grader gets, from what the runner sent; None if it sent none.

    The runner's own verdict is believed only when nothing contradicts it: one verdict, sent
    after the check started, no failed case streamed before it, no line that is not the
    runner's. A learner's code that writes a passing verdict line, or empties the ``Cases``
    record from a thread, runs into one of these.
    """
    if not verdicts:
        return None
    verdict = verdicts[0] if isinstance(verdicts[0], dict) else {}
    verdict = {"passed": verdict.get("passed") is True, "reason": str(verdict.get("reason", "")),
               "traceback": str(verdict.get("traceback", ""))}
    if not verdict["passed"]:
        return verdict
    doubt = ""
    if len(verdicts) > 1:
        doubt = f"the runner sent {len(verdicts)} verdicts, not one"
    elif not saw_test:
        doubt = "a verdict came before the check started"
    elif failed_cases:
        doubt = (f"the check failed a case ({failed_cases[0][:120]}) but the verdict said "
                 "passed")
    elif garbled:
        doubt = f"{garbled} line(s) on the runner's channel were not the runner's"
    if doubt:
        return {"passed": False, "traceback": "",
                "reason": f"{doubt}: something in your code wrote to the grader's channel or "
                          "changed the check's record, so this check proves nothing"}
    return verdict


def check(runner: list[str], channel: int, env: dict) -> int:
    """Run the runner, relay its progress to ``channel``, then send the checker's verdict."""
    rfd, wfd = os.pipe()
    proc = subprocess.Popen([*runner, str(wfd)], pass_fds=(wfd,), env=env)
    os.close(wfd)
    verdicts, failed, saw_test, garbled, buf = [], [], False, 0, b""
    os.set_blocking(rfd, False)
    # Until the runner exits, not until the pipe closes: a process the learner forked may hold
    # the pipe's write end for as long as it likes.
    exited_at = None
    while True:
        if exited_at is None and proc.poll() is not None:
            exited_at = time.monotonic()
        exited = exited_at is not None
        if exited and time.monotonic() > exited_at + 0.5:
            break  # what the runner wrote is read by now; the rest is somebody else's
        ready, _, _ = select.select([rfd], [], [], 0 if exited else 0.05)
        try:
            data = os.read(rfd, 65536) if ready else None
        except BlockingIOError:
            data = None
        if data == b"" or (data is None and exited):
            break  # every writer closed it, or the runner is gone and nothing is left to read
        if data is None:
            continue
        buf += data
        *lines, buf = buf.split(b"\n")
        if len(buf) > _MAX_LINE:
            garbled, buf = garbled + 1, b""
        for line in lines:
            try:
                msg = json.loads(line)
            except ValueError:
                msg = None
            if not isinstance(msg, dict) or len(msg) != 1:
                garbled += 1
                continue
            kind = next(iter(msg))
            if kind == "cell":
                saw_test = saw_test or msg["cell"] == "test"
                _send(channel, {"cell": str(msg["cell"])[:200]})
            elif kind == "case":
                failed.append(str(msg["case"]))
            elif kind == "verdict":
                verdicts.append(msg["verdict"])
            else:
                garbled += 1
    os.close(rfd)
    status = proc.wait()
    _report_leftovers()
    verdict = decide(verdicts, failed, saw_test, garbled)
    if verdict is not None:
        _send(channel, {"verdict": verdict})
    return 0 if status == 0 else 1


# What ``_report_leftovers`` prints. This script reads no catalog (stdlib only): the grader
# passes these lines translated (argv[5]; the same English is its msgid in ``grade``).
LEFTOVERS = {"alive": "grader: {n} process(es) your code started were still running when the "
                      "check ended; the sandbox killed them",
             "shm": "grader: {n} file(s) left in /dev/shm after the check; the sandbox removed "
                    "them"}


def _report_leftovers() -> None:
    """Say what the learner's code left behind; the sandbox's end removes it all the same."""
    if os.getpid() != 1:
        return
    alive = [p for p in os.listdir("/proc") if p.isdigit() and p != "1"]
    shm = os.listdir("/dev/shm")
    if alive:
        print(LEFTOVERS["alive"].format(n=len(alive)), flush=True)
    if shm:
        print(LEFTOVERS["shm"].format(n=len(shm)), flush=True)


def _checker(channel: int, tmpdir: str, runner: list[str], protect: list[str]) -> int:
    """pid 1 of the sandbox: build it, give up power over it, run the runner, decide."""
    _call("prctl", PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # the launcher killed: all go
    try:
        missing, overlaid = _build(tmpdir)
    except OSError as err:  # the namespaces stand (daemons still die); the files stay open
        missing, overlaid = [f"any mount of its own ({err.strerror})"], []
    uid, gid = os.getuid(), os.getgid()
    try:
        _call("unshare", CLONE_NEWUSER)  # the mounts now belong to a namespace we have no say in
        _map_ids(uid, gid)
    except OSError as err:  # the learner's code could remount them writable
        missing.append(f"locked mounts ({err.strerror})")
    _call("prctl", PR_SET_DUMPABLE, 0, 0, 0, 0)
    open_ = _writable(protect, overlaid)
    level = FULL if not (open_ or missing) else (
        f"partial: no {'; no '.join(missing) or 'failure reported'}"
        + (f"; still writable: {', '.join(open_)}" if open_ else ""))
    _send(channel, {"sandbox": level})
    env = dict(os.environ, TMPDIR=tmpdir)
    return check(runner, channel, env)


def own_user_namespace() -> str:
    """Enter a user namespace of one's own, keeping the uid: "" if done, else why not.

    The learner's process calls it first thing (``remote.Learner``), before any import could
    start a thread (``unshare`` refuses a threaded caller): it then holds no capability in the
    namespace of the check process that started it (Note [The verdict outside the learner's
    process], in ``outside``).
    """
    _call("prctl", PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # its check process gone: so is it
    uid, gid = os.getuid(), os.getgid()
    try:
        _call("unshare", CLONE_NEWUSER)
        _map_ids(uid, gid)
    except OSError as err:
        return err.strerror or str(err)
    return ""


def main(argv: list[str]) -> int:
    channel, tmpdir, runner = int(argv[1]), argv[2], json.loads(argv[3])
    protect = json.loads(argv[4]) if len(argv) > 4 else []
    LEFTOVERS.update(json.loads(argv[5]) if len(argv) > 5 else {})
    uid, gid = os.getuid(), os.getgid()
    try:
        if os.environ.get("SHMLAB_SANDBOX") == "off":  # the fallback, on purpose (tests)
            raise OSError(0, "SHMLAB_SANDBOX=off")
        _call("unshare", CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC)
        _map_ids(uid, gid)
    except OSError as err:
        # No namespaces here: the best left is a private TMPDIR and a checker nobody can ptrace.
        _call("prctl", PR_SET_DUMPABLE, 0, 0, 0, 0)
        _send(channel, {"sandbox": f"off: user namespaces unavailable ({err.strerror}); "
                                   "files stay writable and daemons can outlive the run"})
        return check(runner, channel, dict(os.environ, TMPDIR=tmpdir))
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            code = _checker(channel, tmpdir, runner, protect)
        except BaseException as exc:  # say why, and grade nothing
            _send(channel, {"sandbox": f"broken: {type(exc).__name__}: {exc}"})
        finally:
            os._exit(code)
    os.close(channel)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) & 0xFF


if __name__ == "__main__":
    sys.exit(main(sys.argv))
