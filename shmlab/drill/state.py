"""Where the drill keeps what you know: one JSON file in the user's data directory.

The file is ``<user data dir>/shmlab/drill.json`` (platformdirs: ~/.local/share/shmlab on Linux),
never inside the repository. Set SHMLAB_DRILL_DIR to use another folder (the tests do, with a
temporary one). Writes go to a temporary file first and are renamed into place, so a killed
session never leaves half a file.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import platformdirs

ENV = "SHMLAB_DRILL_DIR"
FILENAME = "drill.json"


def data_dir() -> Path:
    override = os.environ.get(ENV)
    return Path(override) if override else Path(platformdirs.user_data_dir("shmlab", False))


def path() -> Path:
    return data_dir() / FILENAME


def load() -> dict:
    """{"cards": {id: state}, "sessions": n}; empty if nothing was saved yet."""
    try:
        saved = json.loads(path().read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {"cards": {}, "sessions": 0}
    return {"cards": saved.get("cards", {}), "sessions": saved.get("sessions", 0)}


def save(cards: dict, sessions: int) -> Path:
    target = path()
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(".tmp")
    tmp.write_text(json.dumps({"cards": cards, "sessions": sessions}, indent=1,
                              ensure_ascii=False, sort_keys=True), encoding="utf-8")
    os.replace(tmp, target)
    return target
