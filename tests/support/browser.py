"""The real-browser tests' shared parts: a JupyterLab server and Debian's headless Chromium.

JupyterLab runs on 127.0.0.1 with a random token in its own process group, with settings that
keep it quiet and leave the committed notebooks alone (no autosave, no news, every cell kept in
the DOM). Playwright (Python) drives /usr/bin/chromium, never a browser it downloads itself.
Without Chromium (or Playwright) a test skips, except under CI=true, where it fails.

Used by test_browser.py (the Dashboard), test_browser_drill.py (the Quiz) and
test_browser_diagrams.py (the Mermaid diagrams). A test module imports the `lab` fixture from
here (pytest finds fixtures in the module's namespace).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import psutil
import pytest

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "test-artifacts"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--no-first-run", "--disable-sync"]
SETTINGS = {  # user settings overrides, one file per plugin
    "@jupyterlab/notebook-extension/tracker": {"windowingMode": "none"},
    "@jupyterlab/docmanager-extension/plugin": {"autosave": False},
    "@jupyterlab/apputils-extension/notification": {"fetchNews": "false",
                                                    "checkForUpdates": False},
}


def need_chromium():
    """Skip (or, under CI=true, fail) unless Chromium and Playwright are both there."""
    why = None
    if not os.access(CHROMIUM, os.X_OK):
        why = f"{CHROMIUM} not found: install Debian's chromium (apt-get install chromium)"
    else:
        try:
            import playwright.sync_api  # noqa: F401
        except ImportError:
            why = "the playwright Python package is not installed (pip install playwright)"
    if why and os.environ.get("CI") == "true":
        pytest.fail(f"CI=true but the browser test cannot run: {why}", pytrace=False)
    if why:
        pytest.skip(why)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str, timeout: float = 2.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as reply:  # noqa: S310 - localhost only
        return reply.read()


@pytest.fixture
def lab(tmp_path):
    """A JupyterLab server on 127.0.0.1 serving notebooks/; stopped with all it started."""
    for name, values in SETTINGS.items():
        path = tmp_path / "settings" / f"{name}.jupyterlab-settings"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values))
    port, token = free_port(), secrets.token_hex(16)
    env = dict(os.environ, JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime"))
    cmd = [str(Path(sys.executable).with_name("jupyter")), "lab", "--no-browser",
           f"--port={port}", "--ServerApp.ip=127.0.0.1", f"--IdentityProvider.token={token}",
           f"--ServerApp.root_dir={REPO / 'notebooks'}", "--LabApp.expose_app_in_browser=True",
           f"--LabApp.user_settings_dir={tmp_path / 'settings'}",
           f"--LabApp.workspaces_dir={tmp_path / 'workspaces'}", "--allow-root"]
    log = open(tmp_path / "lab.log", "wb")
    server = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                              start_new_session=True, cwd=REPO)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                _get(f"{base}/api/status?token={token}")
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("JupyterLab did not start:\n" + (
                        tmp_path / "lab.log").read_text()[-3000:]) from None
                time.sleep(0.2)
        yield base, token
    finally:  # the notebook cleaned up after itself; whatever is left of ours is killed
        _kill(server, _descendants(server.pid))  # the kernel runs in a session of its own
        log.close()


@contextlib.contextmanager
def chromium(pw, tmp_path):
    """Headless Debian Chromium with a fresh profile; yields its first page, closes it after."""
    browser = pw.chromium.launch_persistent_context(
        str(tmp_path / "chromium-profile"), headless=True, executable_path=CHROMIUM,
        args=CHROMIUM_ARGS, viewport={"width": 1400, "height": 1000})
    try:
        yield browser.pages[0] if browser.pages else browser.new_page()
    finally:
        browser.close()


def _descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def _kill(server: subprocess.Popen, started: list[psutil.Process]) -> None:
    try:
        os.killpg(server.pid, signal.SIGKILL)  # its own group: only what it started
    except ProcessLookupError:
        pass
    server.wait(10)
    for proc in started:  # by pid, each one we saw it start (kernels leave the group)
        try:
            proc.kill()
            proc.wait(5)
        except (psutil.NoSuchProcess, psutil.TimeoutExpired):
            pass
