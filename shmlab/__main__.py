"""``python -m shmlab <command>``: the package's commands, one table, one module each.

    python -m shmlab doctor [--json] [--clean [--yes]]   read this machine's shm health
    python -m shmlab drill [--cards N] [--export anki|csv FILE]   interview flashcards

A command is a module with ``main(argv) -> int``; add a row to COMMANDS for a new one.
"""

from __future__ import annotations

import importlib
import sys

# command -> (module with main(argv), one line of help)
COMMANDS = {
    "doctor": ("shmlab.tools.doctor", "read this machine's shared-memory health; fix leaks"),
    "drill": ("shmlab.drill.cli", "interview flashcards with spaced repetition; --export anki|csv"),
}


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
    module = importlib.import_module(COMMANDS[argv[0]][0])  # import only the command we run
    return module.main(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
