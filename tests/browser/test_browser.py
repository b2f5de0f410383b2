"""The demo notebook's Dashboard in a real JupyterLab, driven in Debian's headless Chromium.

The server and the browser are tests/support/browser.py's (JupyterLab on 127.0.0.1 with a
random token, no autosave; Playwright drives /usr/bin/chromium, never a browser it downloads).
We run all cells, read the rendered fd count and file table while the scenario runs, and save
screenshots to test-artifacts/. Without Chromium the test skips, except under CI=true.

What a learner sees, checked on the way: while the table shows leaked (red) rows the leak panel
says so too (it used to say "no leak seen yet" until the first reclaim); the fd table never runs
past the output's right edge; after Run All and a tab switch the widgets still show their final
state; every text of the dashboard reads at WCAG AA (4.5:1) in the light and the dark theme.
"""

from __future__ import annotations

import hashlib
import time

import pytest
from support.browser import (  # noqa: F401 - `lab` and `lab_root` are fixtures
    ARTIFACTS,
    CHROMIUM,
    CHROMIUM_ARGS,
    REPO,
    lab,
    lab_root,
    low_contrast,
    need_chromium,
    reads_in_both_themes,
    switch_tab_and_back,
    widget_errors,
)

NOTEBOOK = REPO / "notebooks" / "09_live_dashboard.ipynb"
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
    panelOpen: Number(q('.shmlab-leak-open-count')?.textContent ?? 0),
    panelNone: (q('.shmlab-leak-summary')?.innerText ?? '').includes('no leak seen yet'),
    fdOverflow: (() => {  // how far the fd table runs past its output's right edge, in px
      const t = q('.shmlab-fd-numbers table'), o = t?.closest('.jp-OutputArea-output');
      return t && o ? t.getBoundingClientRect().right - o.getBoundingClientRect().right : 0;
    })(),
    error: out.filter(t => t.includes('Traceback') || t.includes('Error')).join('\\n'),
  };
}"""


@pytest.mark.browser
@pytest.mark.timeout(200)
def test_dashboard_renders_and_follows_the_scenario(lab, tmp_path):  # noqa: F811
    need_chromium()
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
                if state["leaked"] >= 50 and not mid_shot:  # files leaked, not yet reclaimed
                    page.locator(".shmlab-dashboard").screenshot(
                        path=str(ARTIFACTS / "browser-dashboard-leaked.png"))
                    low = low_contrast(page, ".shmlab-dashboard")  # the red rows included
                    assert not low, f"dashboard text below 4.5:1 (light, leaked rows): {low}"
                    mid_shot = True
                if state["done"]:
                    print(f"notebook done {time.monotonic() - t0:.1f} s after opening the page")
                    break
                time.sleep(0.1)
            page.locator(".shmlab-dashboard").screenshot(
                path=str(ARTIFACTS / "browser-dashboard-end.png"))
            page.screenshot(path=str(ARTIFACTS / "browser-notebook.png"))
            switch_tab_and_back(page)  # the stopped dashboard keeps its last picture
            assert not widget_errors(page), widget_errors(page)
            assert page.evaluate(READ_DOM)["chart"] >= 1, "the dashboard lost its chart"
            reads_in_both_themes(page, ".shmlab-dashboard", "dashboard", ("dark", "light"))
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
    # the leak panel agrees with the table: a sample may fall between the two widgets' updates
    # (one snapshot, two messages), never two in a row
    silent = [i for i, s in enumerate(seen) if s["leaked"] >= 50 and not s["panelOpen"]]
    assert not [i for i in silent if i - 1 in silent], (
        f"the table showed leaked rows while the leak panel showed none: "
        f"{[seen[i] for i in silent][:3]}")
    assert not any(s["panelNone"] for s in seen if s["leaked"] >= 50 and s["panelOpen"])
    assert max(s["fdOverflow"] for s in seen) <= 1, "the fd table ran past the output's edge"
