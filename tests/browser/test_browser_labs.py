"""Lab 2's first check with its answer unfilled, as a learner sees it in JupyterLab.

The server serves a temporary copy of labs/lab2_file_descriptors.ipynb (`lab_root`), so the
committed lab is never touched. Run All stops at the first check, whose answer still raises
NotImplementedError: its output must be the hint, in at most MAX_LINES lines, with no
traceback (a 39-line chained one through shmlab/labs/report.py used to bury it). The kernel-
level cases (a check run before its answer cell, an answer that raises) are
tests/labs/test_check_output.py's. Without Chromium the test skips, except under CI=true.
"""

from __future__ import annotations

import shutil
import time

import pytest
from support.browser import ARTIFACTS, IDLE, REPO, RUN_ALL, chromium, lab, need_chromium  # noqa: F401

LAB = REPO / "labs" / "lab2_file_descriptors.ipynb"
MAX_LINES = 10
FIRST_CHECK = """() => {
  const cells = [...document.querySelectorAll('.jp-CodeCell')];
  const errored = cells.find(c => c.querySelector('.jp-OutputArea-output')
    && /not implemented yet|Error/.test(c.querySelector('.jp-OutputArea').innerText));
  return errored ? errored.querySelector('.jp-OutputArea').innerText : null;
}"""


@pytest.fixture
def lab_root(tmp_path):
    need_chromium()  # skip (or fail under CI=true) before `lab` starts a server for nothing
    root = tmp_path / "labs"
    root.mkdir()
    shutil.copy(LAB, root / LAB.name)
    return root


@pytest.mark.browser
@pytest.mark.timeout(180)
def test_an_unfinished_answer_shows_the_hint_without_a_traceback(lab, tmp_path):  # noqa: F811
    from playwright.sync_api import sync_playwright

    base, token = lab
    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as pw, chromium(pw, tmp_path, width=1440, height=900) as page:
        page.goto(f"{base}/lab/tree/{LAB.name}?token={token}")
        page.wait_for_function(IDLE, timeout=60_000)
        page.evaluate(RUN_ALL)
        deadline, text = time.monotonic() + 90, None
        while text is None and time.monotonic() < deadline:
            text = page.evaluate(FIRST_CHECK)
            time.sleep(0.25)
        assert text is not None, "no check cell showed an output"
        page.wait_for_function(IDLE, timeout=60_000)
        time.sleep(0.5)
        text = page.evaluate(FIRST_CHECK)
        area = page.locator(".jp-CodeCell .jp-OutputArea", has_text="not implemented yet").first
        area.scroll_into_view_if_needed()
        area.screenshot(path=str(ARTIFACTS / "browser-lab2-unfinished.png"))
    lines = [line for line in text.splitlines() if line.strip()]
    assert "not implemented yet" in text and "Traceback" not in text, text
    assert len(lines) <= MAX_LINES, f"{len(lines)} lines:\n{text}"
