"""At the open-file limit, an fd sent with SCM_RIGHTS is dropped by the kernel: `recvmsg`
succeeds, with no ancillary data and MSG_CTRUNC set, and multiprocessing's `recvfds` (what
torch's `rebuild_storage_fd` calls through `resource_sharer`) raises "received 0 items of
ancdata". Real sockets, a real lowered RLIMIT_NOFILE, in a forked child.

Mirrors: Lib/multiprocessing/reduction.py (sendfds, recvfds).
"""

import array
import json
import os
import resource
import socket
from multiprocessing import reduction

import pytest


def _receive_at_the_limit(sock: socket.socket, limit: bool) -> dict:
    """In the child: optionally fill the fd table up to a lowered soft limit, then receive."""
    if limit:
        open_now = len(os.listdir("/proc/self/fd"))
        resource.setrlimit(resource.RLIMIT_NOFILE,
                           (open_now + 2, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
        while True:  # take every free slot: the next fd to arrive has nowhere to go
            try:
                os.dup(0)
            except OSError:
                break
    fds = array.array("i")
    msg, ancdata, flags, _ = sock.recvmsg(1, socket.CMSG_SPACE(fds.itemsize))
    got = [fd for level, kind, data in ancdata if (level, kind) == (socket.SOL_SOCKET,
                                                                    socket.SCM_RIGHTS)
           for fd in array.array("i", data)]
    try:
        reduction.recvfds(sock, 1)
        error = None
    except Exception as e:  # noqa: BLE001 - reported to the parent as it is
        error = f"{type(e).__name__}: {e}"
    return {"bytes": len(msg), "ancdata": len(ancdata), "fds": len(got),
            "ctrunc": bool(flags & socket.MSG_CTRUNC), "recvfds": error}


def _run(limit: bool) -> dict:
    parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    report_r, report_w = os.pipe()
    r, w = os.pipe()  # the fd we send
    pid = os.fork()
    if pid == 0:
        try:
            parent.close()
            os.close(report_r)
            os.write(report_w, json.dumps(_receive_at_the_limit(child, limit)).encode())
        finally:
            os._exit(0)
    child.close()
    os.close(report_w)
    try:
        reduction.sendfds(parent, [r])  # read by recvmsg above
        reduction.sendfds(parent, [r])  # read by recvfds
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        with os.fdopen(report_r, "rb") as f:
            return json.loads(f.read())
    finally:
        parent.close()
        os.close(r)
        os.close(w)


@pytest.mark.timeout(60)
@pytest.mark.claim("C25.33")
def test_recvmsg_at_the_fd_limit_succeeds_with_msg_ctrunc_and_no_fd():
    below = _run(limit=False)
    assert below == {"bytes": 1, "ancdata": 1, "fds": 1, "ctrunc": False, "recvfds": None}, below
    at = _run(limit=True)
    # no EMFILE: the message arrives, the kernel dropped its fd and says so with MSG_CTRUNC
    assert at["bytes"] == 1 and at["ancdata"] == at["fds"] == 0 and at["ctrunc"], at
    assert at["recvfds"] == "RuntimeError: received 0 items of ancdata", at
