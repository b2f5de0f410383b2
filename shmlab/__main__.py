"""``python -m shmlab <command>``: the package's commands, one table, one module each.

    python -m shmlab doctor [--json] [--clean [--yes]]   read this machine's shm health
    python -m shmlab drill [--cards N] [--export anki|csv FILE]   interview flashcards
    python -m shmlab bench handoff [--plot FILE]          the hand-off benchmark against torch
    python -m shmlab stress [--trials N] [--faults]       kill families, check what they leave
    python -m shmlab stress --clients 1100,2000           N clients on one manager, vs torch
    python -m shmlab stress interrupt [--trials 500]      Ctrl-C at random points, vs torch
    python -m shmlab labs release|grade|hash|...          the labs' instructor commands
    python -m shmlab manager [--grace S]                  run a manager daemon in the foreground
    python -m shmlab facts render|merge|check             the fact base behind docs/CLAIMS.md
    python -m shmlab trace [--json F] -- python SCRIPT    every hop and system call of a handoff

Each command's ``--help`` says the rest. ``python -m shmlab.labs`` and ``python -m
shmlab.manager`` still work (the client starts its daemon with the latter).

A command is a module with ``main(argv) -> int``; add a row to COMMANDS for a new one.
"""

from __future__ import annotations

import importlib
import os
import sys

# command -> (module with main(argv), one line of help)
COMMANDS = {
    "doctor": ("shmlab.tools.doctor", "read this machine's shared-memory health; fix leaks"),
    "drill": ("shmlab.drill.cli", "interview flashcards with spaced repetition; --export anki|csv"),
    "bench": ("shmlab.tools.bench", "the hand-off benchmark against torch (--plot FILE)"),
    "stress": ("shmlab.testing.stress", "families killed at random points: leaks and stuck runs"),
    "labs": ("shmlab.labs.__main__", "the labs: release, grade, hash, nbgrader-course"),
    "manager": ("shmlab.manager", "the shm manager daemon, exactly as the client starts it"),
    "facts": ("shmlab.facts.__main__", "the fact base: render docs/CLAIMS.md, merge, check"),
    "trace": ("shmlab.trace.cli", "trace a tensor's hops and system calls across processes"),
}
# Run as ``python -m MODULE`` in place of this process: a daemon is known by that command line
# (introspect and the doctor look for ``shmlab.manager`` in it, DAEMON_MODULE).
EXEC = {"manager"}


def usage() -> str:
    rows = "\n".join(f"  {name:<8} {about}" for name, (_, about) in COMMANDS.items())
    return f"usage: python -m shmlab <command> [options]\n\ncommands:\n{rows}\n"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0 if argv else 2
    if argv[0] not in COMMANDS:
        print(f"unknown command {argv[0]!r}\n\n{usage()}", file=sys.stderr)
        return 2
    if argv[0] in EXEC:
        os.execv(sys.executable, [sys.executable, "-m", COMMANDS[argv[0]][0], *argv[1:]])
    module = importlib.import_module(COMMANDS[argv[0]][0])  # import only the command we run
    return module.main(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
