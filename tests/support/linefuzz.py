"""Fuzz the shm manager's line protocol: a seeded corpus of hostile lines over many connections.

Run as a script by its path, in a process of its own (test_manager_scale.py does), because a
valid REGISTER in the corpus makes the sender a member that the manager keeps while it lives:

    python tests/support/linefuzz.py SOCKET_PATH SEED CASES

Cases: random bytes, lines split across sends, huge and odd numbers in every numeric field,
unknown verbs, valid verbs with bad arguments, NULs, CRLF, lines longer than MAX_LINE, WATCH
out of place. They go in batches of at most 30 lines (under MAX_BAD_LINES, so most batches are
read to the end), each batch on a connection of its own, sent in random chunks; 4 threads send
batches at once. Every connection must end (the manager closes it after our SHUT_WR) within
10 s. Prints one JSON line: cases, connections, replies by kind, connections cut.
Names registered here are `shmlab_fuzz<token>_*`, which no real segment is ever called.
"""

from __future__ import annotations

import json
import random
import secrets
import socket
import sys
import threading

TOKEN = secrets.token_hex(6)
HUGE = ["99999999999999999999", str(2**63), str(2**63 - 1), str(2**64), "1" * 40, "9" * 4000,
        "-1", "-0", "+5", "0x10", "1e9", "1_000", "\u0663", "\u00b2", " ", "0" * 30 + "5",
        str(2**22), str(2**18 + 1), str(2**31), "4294967296", "nan", "inf", "", "0"]
VERBS = ["REGISTER", "FREE", "STATUS", "WATCH", "BYE"]


def case(rng: random.Random) -> tuple[bytes, bool]:
    """One hostile line (with its line end) and whether it must end its batch."""
    kind = rng.randrange(12)
    name = f"shmlab_fuzz{TOKEN}_{rng.randrange(10**6)}"
    num = rng.choice(HUGE)
    if kind == 0:
        return rng.randbytes(rng.randrange(120)) + b"\n", False
    if kind == 1:
        return f"STATUS {num} {rng.choice(HUGE)}\n".encode(), False
    if kind == 2:
        return f"STATUS {num}\n".encode(), False
    if kind == 3:
        verb = rng.choice(["REGISTER", "FREE"])
        pid = rng.choice([num, str(rng.randrange(1, 2**22))])
        return f"{verb} {pid} {rng.choice([name, '/' + name, '../' + name, name * 5, ''])}\n" \
            .encode(), False
    if kind == 4:
        word = "".join(rng.choice("ABCDEFGHIJKLMNOPQRSTUVWXYZ")
                       for _ in range(rng.randrange(1, 12)))
        return f"{word} {num}\n".encode(), False
    if kind == 5:
        verb = rng.choice(VERBS)
        args = " ".join(rng.choice(HUGE + [name, "x", "\t"]) for _ in range(rng.randrange(5)))
        return f"{verb} {args}\n".encode(errors="surrogateescape"), False
    if kind == 6:
        line = rng.choice([b"STATUS\x00 1", b"\x00" * rng.randrange(1, 50),
                           f"REGISTER 1\x00 {name}".encode(), b"BYE\x00", b"ST\x00ATUS"])
        return line + b"\n", False
    if kind == 7:
        return rng.choice([b"STATUS 0 1\r\n", b"\r\r\n", b"\r\n", b"BYE\r\n", b"\n", b" \n",
                           f"REGISTER 1 {name}\r\n".encode()]), False
    if kind == 8:
        return b"A" * rng.randrange(4097, 9000) + rng.choice([b"\n", b""]), True
    if kind == 9:
        return rng.choice([b"WATCH\n", b"WATCH 1\n", b"WATCH\r\n"]), False
    if kind == 10:  # non-ASCII and invalid UTF-8 inside otherwise valid lines
        return rng.choice(["STATUS \uff10\n".encode(), b"STATUS \xff\xfe\n",
                           f"REGISTER 5 {name}\xe9\n".encode("latin-1"),
                           "FREE \u0661 x\n".encode()]), False
    return f"{rng.choice(VERBS)}\n".encode(), False  # plain, valid or harmless


def batches(rng: random.Random, cases: int) -> list[bytes]:
    out, left = [], cases
    while left > 0:
        size = min(left, rng.choice([1, 5, 15, 30, 40]))  # 40: past MAX_BAD_LINES, cut
        lines = []
        for _ in range(size):
            line, last = case(rng)
            lines.append(line)
            if last:
                break
        left -= len(lines)
        blob = b"".join(lines)
        if rng.random() < 0.2:  # end in the middle of a line
            blob += rng.choice([b"STATUS 1", b"REGIS", b"\x00\x01"])
        out.append(blob)
    return out


def send_batch(path: str, blob: bytes, rng: random.Random, counts: dict) -> None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(10)
    sock.connect(path)
    got = b""
    try:
        at = 0
        while at < len(blob):  # random chunks: lines split across sends
            step = rng.choice([1, 7, 64, 4096, len(blob)])
            sock.sendall(blob[at:at + step])
            at += step
        sock.shutdown(socket.SHUT_WR)
        while chunk := sock.recv(65536):
            got += chunk
    except (BrokenPipeError, ConnectionResetError):
        counts["cut"] += 1
    finally:
        sock.close()
    for reply in got.split(b"\n")[:-1]:
        key = reply[:3].decode("ascii", "replace")
        counts[key] = counts.get(key, 0) + 1


def main(path: str, seed: int, cases: int) -> dict:
    rng = random.Random(seed)
    work = batches(rng, cases)
    counts = {"cut": 0}
    lock = threading.Lock()
    errors: list[str] = []

    def worker(i: int) -> None:
        mine = random.Random(seed * 100 + i)
        for blob in work[i::4]:
            local = {"cut": 0}
            try:
                send_batch(path, blob, mine, local)
            except OSError as exc:  # a timeout: the manager stopped answering
                errors.append(repr(exc))
                return
            with lock:
                for k, v in local.items():
                    counts[k] = counts.get(k, 0) + v

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return {"cases": cases, "connections": len(work), "replies": counts, "errors": errors}


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))), flush=True)
