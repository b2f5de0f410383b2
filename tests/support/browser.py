"""The real-browser tests' shared parts: a JupyterLab server and Debian's headless Chromium.

JupyterLab runs on 127.0.0.1 with a random token in its own process group, with settings that
keep it quiet and leave the committed notebooks alone (no autosave, no news, every cell kept in
the DOM). Playwright (Python) drives /usr/bin/chromium, never a browser it downloads itself.
Without Chromium (or Playwright) a test skips, except under CI=true, where it fails.

Used by test_browser.py (the Dashboard), test_browser_drill.py (the Quiz) and
test_browser_diagrams.py (the Mermaid diagrams), test_browser_widgets.py (notebooks 00 and 04)
and test_browser_labs.py (a lab's check output). A test module imports the `lab` and `lab_root`
fixtures from here (pytest finds fixtures in the module's namespace; `lab` needs `lab_root`),
or defines its own `lab_root` to serve another folder. The helpers at the end switch the theme,
measure text contrast (WCAG) and look for widgets JupyterLab could not show.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
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
def lab_root():
    """The folder `lab` serves; a test module may override this fixture to serve another."""
    return REPO / "notebooks"


@pytest.fixture
def lab(tmp_path, lab_root):
    """A JupyterLab server on 127.0.0.1 serving `lab_root` (notebooks/); stopped with all it
    started."""
    for name, values in SETTINGS.items():
        path = tmp_path / "settings" / f"{name}.jupyterlab-settings"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values))
    port, token = free_port(), secrets.token_hex(16)
    # A TMPDIR of the server's own (short: the notebooks bind UNIX sockets in it), removed
    # with it: the kernels are SIGKILLed below, so multiprocessing's pymp-* directories
    # they made are never removed by them.
    tmpdir = tempfile.mkdtemp(prefix="lab-")
    env = dict(os.environ, JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime"), TMPDIR=tmpdir)
    cmd = [str(Path(sys.executable).with_name("jupyter")), "lab", "--no-browser",
           f"--port={port}", "--ServerApp.ip=127.0.0.1", f"--IdentityProvider.token={token}",
           f"--ServerApp.root_dir={lab_root}", "--LabApp.expose_app_in_browser=True",
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
        shutil.rmtree(tmpdir, ignore_errors=True)


@contextlib.contextmanager
def chromium(pw, tmp_path, width=1400, height=1000):
    """Headless Debian Chromium with a fresh profile; yields its first page, closes it after."""
    browser = pw.chromium.launch_persistent_context(
        str(tmp_path / "chromium-profile"), headless=True, executable_path=CHROMIUM,
        args=CHROMIUM_ARGS, viewport={"width": width, "height": height})
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


# --- what a learner sees: themes and text contrast ---------------------------------------------
IDLE = ("() => window.jupyterapp?.shell?.currentWidget?.sessionContext?.session?.kernel"
        "?.status === 'idle'")
RUN_ALL = "() => { window.jupyterapp.commands.execute('notebook:run-all-cells'); }"
# every cell of the current notebook has run (no "[*]" or "[ ]" prompt left), the kernel idles
ALL_RAN = r"""() => {
  const nb = window.jupyterapp.shell.currentWidget;
  const k = nb?.sessionContext?.session?.kernel;
  const prompts = [...nb.node.querySelectorAll('.jp-CodeCell .jp-InputPrompt')]
    .map(p => p.textContent.trim());
  return k?.status === 'idle' && prompts.some(p => /^\[\d+\]:$/.test(p))
    && !prompts.some(p => /^\[[ *]\]:$/.test(p));  // a collapsed input has no prompt
}"""
THEMES = {"light": "JupyterLab Light", "dark": "JupyterLab Dark"}
WIDGET_ERRORS = ("model not found", "Error displaying widget")
AA = 4.5  # WCAG 2 AA, normal text
# Each visible text of the elements matching `sel`: its colour against the background actually
# under it (the ancestors' backgrounds composited, opacity applied), as a WCAG contrast ratio.
# Disabled buttons are exempt (WCAG 1.4.3: inactive components), as are SVG <title> tooltips.
CONTRAST = r"""(sel) => {
  const parse = (c) => {
    const m = /rgba?\(([^)]+)\)/.exec(c || '');
    if (!m) return null;
    const p = m[1].split(/[\s,\/]+/).filter(Boolean).map(Number);
    return [p[0], p[1], p[2], p.length > 3 ? p[3] : 1];
  };
  const over = (top, base) => [0, 1, 2].map(i => top[i] * top[3] + base[i] * (1 - top[3]));
  const lin = (v) => { v /= 255; return v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4; };
  const lum = (c) => 0.2126 * lin(c[0]) + 0.7152 * lin(c[1]) + 0.0722 * lin(c[2]);
  const out = [];
  for (const root of document.querySelectorAll(sel)) {
    const walk = document.createTreeWalker(root, NodeFilter.SHOW_TEXT);
    const seen = new Set();
    while (walk.nextNode()) {
      const el = walk.currentNode.parentElement;
      if (!walk.currentNode.textContent.trim() || seen.has(el)) continue;
      seen.add(el);
      if (el.closest('button:disabled, style, title, script')) continue;
      const box = el.getBoundingClientRect();
      const cs = getComputedStyle(el);
      if (!box.width || !box.height || cs.visibility === 'hidden') continue;
      let fg = parse(el instanceof SVGElement ? cs.fill : cs.color);
      if (!fg) continue;
      let opacity = 1, bg = [255, 255, 255];
      const chain = [];
      for (let e = el; e; e = e.parentElement) {
        const s = getComputedStyle(e);
        opacity *= Number(s.opacity);
        chain.push(parse(s.backgroundColor));
      }
      for (const c of chain.reverse()) if (c && c[3] > 0) bg = over(c, bg);
      fg = over([fg[0], fg[1], fg[2], fg[3] * opacity], bg);
      const [hi, lo] = [lum(fg), lum(bg)].sort((a, b) => b - a);
      out.push({text: walk.currentNode.textContent.trim().slice(0, 50),
                ratio: Math.round((hi + 0.05) / (lo + 0.05) * 100) / 100,
                fg: fg.map(Math.round), bg: bg.map(Math.round)});
    }
  }
  return out;
}"""


def set_theme(page, theme: str) -> None:
    """Switch JupyterLab's theme ("light" or "dark") and wait until its colours apply."""
    page.evaluate("(t) => { window.jupyterapp.commands.execute('apputils:change-theme', "
                  "{theme: t}); }", THEMES[theme])
    page.wait_for_function("(light) => document.body.dataset.jpThemeLight === light",
                           arg=str(theme == "light").lower(), timeout=30_000)
    time.sleep(0.5)  # the theme's stylesheet is in; let the widgets restyle


def low_contrast(page, selector: str, minimum: float = AA) -> list[dict]:
    """The texts under `selector` whose contrast ratio is below `minimum` (and how many
    texts were measured, as the last item's "measured")."""
    texts = page.evaluate(CONTRAST, selector)
    assert texts, f"no visible text under {selector!r} to measure"
    return [t for t in texts if t["ratio"] < minimum]


def reads_in_both_themes(page, selector: str, what: str, themes=("light", "dark")) -> None:
    """Screenshot `selector` in each theme (test-artifacts/browser-<what>-<theme>.png) and fail
    if any of its texts reads below WCAG AA there. The theme left is the last one given."""
    ARTIFACTS.mkdir(exist_ok=True)
    for theme in themes:
        set_theme(page, theme)
        page.locator(selector).scroll_into_view_if_needed()
        page.locator(selector).screenshot(path=str(ARTIFACTS / f"browser-{what}-{theme}.png"))
        low = low_contrast(page, selector)
        assert not low, f"{what} text below 4.5:1 in the {theme} theme: {low}"


def widget_errors(page) -> list[str]:
    """Outputs where JupyterLab could not show a widget ("model not found")."""
    return page.evaluate("(needles) => [...document.querySelectorAll('.jp-OutputArea-output')]"
                         ".map(e => e.innerText).filter(t => needles.some(n => t.includes(n)))",
                         list(WIDGET_ERRORS))


def switch_tab_and_back(page) -> None:
    """Open a Launcher tab (the notebook is hidden), then bring the notebook back."""
    nb_id = page.evaluate("() => window.jupyterapp.shell.currentWidget.id")
    page.evaluate("() => { window.jupyterapp.commands.execute('launcher:create'); }")
    page.wait_for_function("(id) => window.jupyterapp.shell.currentWidget.id !== id",
                           arg=nb_id, timeout=20_000)
    time.sleep(0.5)
    page.evaluate("(id) => { window.jupyterapp.shell.activateById(id); }", nb_id)
    page.wait_for_function("(id) => window.jupyterapp.shell.currentWidget.id === id",
                           arg=nb_id, timeout=20_000)
    time.sleep(1.0)  # widget views re-render on attach


# --- the Chinese edition: Han characters drawn as glyphs, not tofu ---------------------------
# Characters of the notebook's own text, and one no font has (plane 16's last private-use
# code point): where a font lacks a glyph the browser draws its .notdef box, the same for all.
HAN = ["共", "享", "内", "存", "检", "查"]
# Draw each character alone in the font a rendered markdown cell uses; report its ink (pixels
# drawn) and a hash of the pixels. Tofu: every character the same box (or the .notdef's).
GLYPHS = r"""([chars, selector]) => {
  const el = document.querySelector(selector);
  const font = getComputedStyle(el).fontFamily;
  const canvas = document.createElement('canvas');
  canvas.width = canvas.height = 48;
  const ctx = canvas.getContext('2d', {willReadFrequently: true});
  const draw = (ch) => {
    ctx.clearRect(0, 0, 48, 48);
    ctx.fillStyle = '#000';
    ctx.font = `36px ${font}`;
    ctx.textBaseline = 'top';
    ctx.fillText(ch, 4, 4);
    const d = ctx.getImageData(0, 0, 48, 48).data;
    let ink = 0, hash = 0;
    for (let i = 3; i < d.length; i += 4) {
      if (d[i] > 0) ink++;
      hash = (Math.imul(hash, 31) + d[i]) >>> 0;
    }
    return {ch, ink, hash};
  };
  return {font, glyphs: chars.map(draw), notdef: draw(String.fromCodePoint(0x10FFFD))};
}"""


def assert_not_tofu(page, selector: str, what: str) -> None:
    """The Han characters of ``HAN`` draw as distinct glyphs with ink, none the .notdef box."""
    got = page.evaluate(GLYPHS, [HAN, selector])
    hashes = [g["hash"] for g in got["glyphs"]]
    assert all(g["ink"] > 40 for g in got["glyphs"]), f"{what}: blank glyphs: {got}"
    assert len(set(hashes)) == len(HAN), f"{what}: the same glyph for different characters " \
                                         f"(tofu: no CJK font?): {got}"
    assert got["notdef"]["hash"] not in hashes, f"{what}: drawn as .notdef boxes: {got}"
