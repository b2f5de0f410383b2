"""The demo notebook's Dashboard in a real JupyterLab, driven in Debian's headless Chromium.

JupyterLab runs on 127.0.0.1 with a random token in its own process group, with settings that
keep it quiet and leave the committed notebook alone (no autosave, no news, every cell kept in
the DOM). Playwright (Python) drives /usr/bin/chromium, never a browser it downloads itself.
We run all cells, read the rendered fd count and file table while the scenario runs, and save
screenshots to test-artifacts/. Without Chromium the test skips, except under CI=true.
"""

from __future__ import annotations

import hashlib
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

REPO = Path(__file__).resolve().parents[1]
NOTEBOOK = REPO / "notebooks" / "09_live_dashboard.ipynb"
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
READ_DOM = """() => {
  const q = (s) => document.querySelector(s);
  const rows = document.querySelectorAll('.shmlab-shm-table tr');
  const out = [...document.querySelectorAll('.jp-OutputArea-output')].map(e => e.innerText);
  return {
    fd: q('.shmlab-fd-family-total')?.textContent ?? null,
    rows: Math.max(0, rows.length - 1),
    leaked: document.querySelectorAll('.shmlab-shm-table tr.shmlab-leaked').length,
    chart: document.querySelectorAll('.shmlab-fd-chart polyline').length,
    done: out.some(t => t.includes('nothing left behind')),
    error: out.filter(t => t.includes('Traceback') || t.includes('Error')).join('\\n'),
  };
}"""


def _need_chromium():
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


def _free_port() -> int:
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
    port, token = _free_port(), secrets.token_hex(16)
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


@pytest.mark.browser
@pytest.mark.timeout(200)
def test_dashboard_renders_and_follows_the_scenario(lab, tmp_path):
    _need_chromium()
    from playwright.sync_api import sync_playwright

    base, token = lab
    ARTIFACTS.mkdir(exist_ok=True)
    digest = hashlib.sha256(NOTEBOOK.read_bytes()).hexdigest()
    seen = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch_persistent_context(
            str(tmp_path / "chromium-profile"), headless=True,  # a fresh profile every run
            executable_path=CHROMIUM, args=CHROMIUM_ARGS, viewport={"width": 1400, "height": 1000})
        try:
            page = browser.pages[0] if browser.pages else browser.new_page()
            t0 = time.monotonic()
            page.goto(f"{base}/lab/tree/{NOTEBOOK.name}?token={token}")
            page.wait_for_function(
                "() => window.jupyterapp?.shell?.currentWidget?.sessionContext?.session?.kernel"
                "?.status === 'idle'", timeout=60_000)
            page.evaluate("() => { window.jupyterapp.commands.execute('notebook:run-all-cells'); }")
            page.wait_for_selector(".shmlab-dashboard .shmlab-fd-family-total", timeout=60_000)
            print(f"dashboard rendered {time.monotonic() - t0:.1f} s after opening the page")
            deadline, mid_shot = time.monotonic() + 110, False
            while time.monotonic() < deadline:
                state = page.evaluate(READ_DOM)
                seen.append(state)
                if state["error"]:
                    (ARTIFACTS / "browser-error.txt").write_text(state["error"])
                assert not state["error"], "a cell failed in the browser:\n" + state["error"]
                if state["leaked"] and not mid_shot:  # files leaked, not yet reclaimed
                    page.locator(".shmlab-dashboard").screenshot(
                        path=str(ARTIFACTS / "browser-dashboard-leaked.png"))
                    mid_shot = True
                if state["done"]:
                    print(f"notebook done {time.monotonic() - t0:.1f} s after opening the page")
                    break
                time.sleep(0.1)
            page.locator(".shmlab-dashboard").screenshot(
                path=str(ARTIFACTS / "browser-dashboard-end.png"))
            page.screenshot(path=str(ARTIFACTS / "browser-notebook.png"))
            outputs = page.evaluate("() => [...document.querySelectorAll("
                                    "'.jp-OutputArea-output')].map(e => e.innerText).join('\\n')")
        finally:
            browser.close()
    changed = hashlib.sha256(NOTEBOOK.read_bytes()).hexdigest() != digest
    assert not changed, "the browser run wrote into the committed notebook"
    assert seen and seen[-1]["done"], (
        f"the notebook did not finish; last state {seen[-1:]}; outputs:\n{outputs[-3000:]}")
    fds = [int(s["fd"]) for s in seen if s["fd"] is not None]
    assert len(set(fds)) > 2 and max(fds) - min(fds) >= 50, f"fd count hardly moved: {fds[::10]}"
    assert max(s["rows"] for s in seen) >= 50 and max(s["leaked"] for s in seen) >= 50
    # ... and were reclaimed (other users' files may come and go in the same table)
    assert max(s["leaked"] for s in seen) - seen[-1]["leaked"] >= 50
    assert max(s["chart"] for s in seen) >= 1
