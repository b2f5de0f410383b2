"""Notebooks 00 and 04 after Run All, as a learner sees them in JupyterLab at 1,440 px and 1,024 px.

One server and one Chromium (tests/support/browser.py) for both notebooks:

* 00's DoctorReport: every finding is on screen without scrolling sideways, its buttons' labels
  are not cut, and its text reads in the light and the dark theme (WCAG AA, 4.5:1);
* 04's FdMonitor, which step 6 asks the learner to watch: after Run All (whose last cell stops
  every process of the notebook) it still shows its final chart and numbers, also after
  switching to another tab and back ("model not found" was what a closed widget left there).

Screenshots go to test-artifacts/. Without Chromium the test skips, except under CI=true.
"""

from __future__ import annotations

import hashlib
import time

import pytest
from support.browser import (  # noqa: F401 - `lab` and `lab_root` are fixtures
    ALL_RAN,
    ARTIFACTS,
    IDLE,
    REPO,
    RUN_ALL,
    chromium,
    lab,
    lab_root,
    need_chromium,
    reads_in_both_themes,
    set_theme,
    switch_tab_and_back,
    widget_errors,
)

DOCTOR = REPO / "notebooks" / "00_start_here.ipynb"
FD = REPO / "notebooks" / "04_file_descriptor_strategy.ipynb"
# Where each doctor finding and button ends, against the notebook's visible right edge.
DOCTOR_FIT = """() => {
  const panel = window.jupyterapp.shell.currentWidget.node.querySelector('.jp-Notebook')
    .getBoundingClientRect();
  const cells = [...document.querySelectorAll('.shmlab-doctor .shmlab-table tr')]
    .slice(1).map(tr => tr.children[3]);
  return {
    findings: cells.map(td => ({text: td.innerText.slice(0, 60),
                                right: td.getBoundingClientRect().right})),
    edge: panel.right,
    cut: [...document.querySelectorAll('.shmlab-doctor button')]
      .filter(b => b.scrollWidth > b.clientWidth + 1).map(b => b.innerText),
  };
}"""
PROMPTS = ("() => [...window.jupyterapp.shell.currentWidget.node.querySelectorAll("
           "'.jp-CodeCell .jp-InputPrompt')].map(p => p.textContent.trim()).join(' ')")
FD_STATE = """() => {
  const cell = [...document.querySelectorAll('.jp-CodeCell')].find(c =>
    c.querySelector('.jp-InputArea')?.innerText.includes('session.widget("FdMonitor")'));
  return {
    lines: document.querySelectorAll('.shmlab-fd-monitor .shmlab-fd-chart polyline').length,
    total: document.querySelector('.shmlab-fd-monitor .shmlab-fd-family-total')?.textContent,
    output: cell?.querySelector('.jp-OutputArea')?.innerText.slice(0, 500) ?? 'no such cell',
  };
}"""


@pytest.fixture
def browser_ok():
    need_chromium()  # skip (or fail under CI=true) before `lab` starts a server for nothing


def _run_all(page, base, token, path, timeout_s):
    page.goto(f"{base}/lab/tree/{path.name}?token={token}")
    page.wait_for_function("(name) => window.jupyterapp?.shell?.currentWidget?.context?.path"
                           " === name", arg=path.name, timeout=60_000)
    page.wait_for_function(IDLE, timeout=60_000)
    t0 = time.monotonic()
    page.evaluate(RUN_ALL)
    read = "() => [...document.querySelectorAll('.jp-OutputArea-output')].map(e => e.innerText)"
    while not page.evaluate(ALL_RAN):
        text = "\n".join(page.evaluate(read))
        assert "Traceback" not in text, f"a cell of {path.name} failed:\n{text[-3000:]}"
        assert time.monotonic() - t0 < timeout_s, (
            f"{path.name} did not finish in {timeout_s} s; prompts: "
            f"{page.evaluate(PROMPTS)}; last outputs:\n{text[-1500:]}")
        time.sleep(0.5)
    print(f"{path.name}: Run All took {time.monotonic() - t0:.1f} s")
    text = "\n".join(page.evaluate(read))
    assert "Traceback" not in text, f"a cell of {path.name} failed:\n{text[-3000:]}"


def _doctor_fits(page, width):
    page.set_viewport_size({"width": width, "height": 900})
    time.sleep(0.5)
    fit = page.evaluate(DOCTOR_FIT)
    assert fit["findings"], "the doctor table has no rows"
    off = [f for f in fit["findings"] if f["right"] > fit["edge"] + 1]
    assert not off, f"at {width} px these findings end past the notebook's edge " \
                    f"({fit['edge']:.0f} px): {off}"
    assert not fit["cut"], f"at {width} px these button labels are cut: {fit['cut']}"


@pytest.mark.browser
@pytest.mark.timeout(420)
def test_doctor_and_fd_monitor_after_run_all(browser_ok, lab, tmp_path):  # noqa: F811
    from playwright.sync_api import sync_playwright

    base, token = lab
    ARTIFACTS.mkdir(exist_ok=True)
    digests = {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in (DOCTOR, FD)}
    with sync_playwright() as pw, chromium(pw, tmp_path, width=1440, height=900) as page:
        _run_all(page, base, token, DOCTOR, 120)
        page.wait_for_selector(".shmlab-doctor .shmlab-table", timeout=30_000)
        for width in (1440, 1024):
            _doctor_fits(page, width)
        page.set_viewport_size({"width": 1440, "height": 900})
        reads_in_both_themes(page, ".shmlab-doctor", "doctor")
        set_theme(page, "light")

        _run_all(page, base, token, FD, 300)
        for moment in ("after Run All", "after a tab switch"):
            if moment == "after a tab switch":
                switch_tab_and_back(page)
            assert not widget_errors(page), f"{moment}: {widget_errors(page)}"
            state = page.evaluate(FD_STATE)
            assert state["lines"] >= 1 and state["total"], (
                f"{moment}: 04's FdMonitor lost its picture: {state}")
        page.locator(".shmlab-fd-monitor").scroll_into_view_if_needed()
        page.locator(".shmlab-fd-monitor").screenshot(
            path=str(ARTIFACTS / "browser-04-fdmonitor-after-run-all.png"))
    changed = [p.name for p, d in digests.items()
               if hashlib.sha256(p.read_bytes()).hexdigest() != d]
    assert not changed, f"the browser run wrote into committed notebooks: {changed}"
