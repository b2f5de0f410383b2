"""The interview drill's Quiz in a real JupyterLab, driven in headless Chromium.

Uses the shared server fixture (tests/support/browser.py: JupyterLab on 127.0.0.1, a random token,
its own settings, no autosave) with SHMLAB_DRILL_DIR pointing at a temporary folder, which the
kernel inherits: we run notebook 10, click Reveal, grade the card "easy", check the state file,
switch the language to 中文, reload the page, run the cells again and read the progress chart,
which must count the card as known. On the way, what a learner sees: the revealed card read in
the light and the dark theme, every text at WCAG AA (4.5:1); no stray horizontal scrollbar;
Chinese *italics* rendered, not shown as asterisks. Screenshots go to test-artifacts/. Without
Chromium the test skips, except under CI=true (then it fails), as every browser test does.
"""

from __future__ import annotations

import hashlib
import json
import re
import time

import pytest
from support.browser import (  # noqa: F401 - `lab` and `lab_root` are fixtures
    ARTIFACTS,
    CHROMIUM,
    CHROMIUM_ARGS,
    REPO,
    assert_not_tofu,
    lab,
    lab_root,
    low_contrast,
    set_theme,
)
from support.browser import need_chromium as _need_chromium

NOTEBOOK = REPO / "notebooks" / "10_interview_drill.ipynb"
IDLE = ("() => window.jupyterapp?.shell?.currentWidget?.sessionContext?.session?.kernel"
        "?.status === 'idle'")
RUN_ALL = "() => { window.jupyterapp.commands.execute('notebook:run-all-cells'); }"
# how far the quiz's output scrolls sideways (a stray scrollbar), in px
SIDEWAYS = """() => {
  const quiz = document.querySelector('.shmlab-drill');
  const out = [];
  for (let e = quiz; e && !e.classList.contains('jp-Notebook'); e = e.parentElement) {
    if (e.scrollWidth > e.clientWidth + 1 && getComputedStyle(e).overflowX !== 'visible')
      out.push(`${e.className.toString().slice(0, 60)}: ${e.scrollWidth - e.clientWidth}px`);
  }
  return out;
}"""
ASTERISK_HAN = r"\*[\u4e00-\u9fff]|[\u4e00-\u9fff]\*"
READ = """() => ({
  question: document.querySelector('.shmlab-drill-question')?.innerText ?? null,
  answer: document.querySelector('.shmlab-drill-answer')?.innerText ?? '',
  bars: [...document.querySelectorAll('.shmlab-drill-bar')].map(b => ({...b.dataset})),
  error: [...document.querySelectorAll('.jp-OutputArea-output')].map(e => e.innerText)
           .filter(t => t.includes('Traceback') || t.includes('Error')).join('\\n'),
})"""


@pytest.fixture
def drill_dir(tmp_path, monkeypatch):
    """Set before `lab` starts, so the server and its kernels save progress here. Skips (or
    fails under CI=true) first, so that no server is started for nothing."""
    _need_chromium()
    path = tmp_path / "drill-data"
    monkeypatch.setenv("SHMLAB_DRILL_DIR", str(path))
    return path


def _open_and_run(page, url):
    page.goto(url)
    page.wait_for_function(IDLE, timeout=60_000)
    page.evaluate(RUN_ALL)
    page.wait_for_selector(".shmlab-drill .shmlab-drill-reveal", timeout=60_000)
    page.wait_for_function(IDLE, timeout=60_000)


def _wait_for(page, predicate, timeout=20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = page.evaluate(READ)
        assert not state["error"], "a cell failed in the browser:\n" + state["error"]
        if predicate(state):
            return state
        time.sleep(0.1)
    raise AssertionError(f"timed out; last state: {state}")


@pytest.mark.browser
@pytest.mark.timeout(200)
def test_quiz_reveals_grades_saves_and_shows_progress_after_a_reload(
        drill_dir, lab, tmp_path):  # noqa: F811 - `lab` is test_browser's fixture
    from playwright.sync_api import sync_playwright

    base, token = lab
    ARTIFACTS.mkdir(exist_ok=True)
    digest = hashlib.sha256(NOTEBOOK.read_bytes()).hexdigest()
    url = f"{base}/lab/tree/{NOTEBOOK.name}?token={token}"
    with sync_playwright() as pw:
        browser = pw.chromium.launch_persistent_context(
            str(tmp_path / "chromium-profile"), headless=True, executable_path=CHROMIUM,
            args=CHROMIUM_ARGS, viewport={"width": 1400, "height": 1000})
        try:
            page = browser.pages[0] if browser.pages else browser.new_page()
            _open_and_run(page, url)
            first = _wait_for(page, lambda s: s["question"])
            page.locator(".shmlab-drill-reveal").click()
            _wait_for(page, lambda s: "✗" in s["answer"])
            page.locator(".shmlab-drill").screenshot(path=str(ARTIFACTS / "drill-revealed.png"))
            assert not page.evaluate(SIDEWAYS), f"the quiz scrolls sideways: " \
                                                f"{page.evaluate(SIDEWAYS)}"
            for theme in ("light", "dark"):
                set_theme(page, theme)
                page.locator(".shmlab-drill").screenshot(
                    path=str(ARTIFACTS / f"drill-revealed-{theme}.png"))
                low = low_contrast(page, ".shmlab-drill")
                assert not low, f"quiz text below 4.5:1 in the {theme} theme: {low}"
            set_theme(page, "light")
            page.locator(".shmlab-drill-grade-easy").click()
            second = _wait_for(page, lambda s: s["question"] != first["question"])
            saved = json.loads((drill_dir / "drill.json").read_text())["cards"]
            assert [s["last"] for s in saved.values()] == ["easy"]
            (graded,) = saved
            question = graded.split("-")[0].upper().replace("BEYOND", "beyond")
            # the chart is redrawn just after the next card is shown: wait for it
            second = _wait_for(page, lambda s: any(
                b["question"] == question and b["known"] == "1" for b in s["bars"]))
            page.locator(".shmlab-drill-lang button", has_text="中文").click()
            zh = _wait_for(page, lambda s: s["question"] != second["question"]  # "both" had Han too
                      and re.search(r"[\u4e00-\u9fff]", s["question"] or ""))
            assert zh["question"] != second["question"]  # the same card, now in Chinese only
            page.locator(".shmlab-drill-reveal").click()  # the Chinese answer, rendered
            zh = _wait_for(page, lambda s: "✗" in s["answer"])
            assert not re.search(ASTERISK_HAN, zh["question"] + zh["answer"]), zh
            page.locator(".shmlab-drill").screenshot(path=str(ARTIFACTS / "drill-zh.png"))
            # 中文 mode: the buttons speak Chinese, and the Chinese is drawn, not boxes
            assert page.locator(".shmlab-drill-grade-easy").inner_text().strip() == "简单"
            assert_not_tofu(page, ".shmlab-drill-question", "the quiz in 中文 mode")
            _open_and_run(page, url)  # a reload: a fresh Quiz reads the saved state
            again = _wait_for(page, lambda s: s["bars"])
            bar = next(b for b in again["bars"] if b["question"] == question)
            assert bar["known"] == "1" and bar["seen"] == "1", again["bars"]
            page.screenshot(path=str(ARTIFACTS / "drill-after-reload.png"))
        finally:
            browser.close()
    assert hashlib.sha256(NOTEBOOK.read_bytes()).hexdigest() == digest, \
        "the browser run wrote into the committed notebook"
