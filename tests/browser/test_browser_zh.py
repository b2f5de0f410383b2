"""The Chinese edition in a real browser: notebooks/zh/00_start_here.ipynb after Run All, with
JupyterLab's own interface in Chinese (jupyterlab-language-pack-zh-cn), and its text drawn with
real glyphs, not the boxes a browser draws without a CJK font (the quiz's 中文 mode gets the
same pixel check in test_browser_drill.py).

Screenshots go to test-artifacts/. Without Chromium the test skips, except under CI=true.
"""

from __future__ import annotations

import hashlib
import json
import os
import time

import pytest
from support.browser import (  # noqa: F401 - `lab` and `lab_root` are fixtures
    ALL_RAN,
    ARTIFACTS,
    IDLE,
    REPO,
    RUN_ALL,
    assert_not_tofu,
    chromium,
    lab,
    lab_root,
    need_chromium,
)

ZH_START = REPO / "notebooks" / "zh" / "00_start_here.ipynb"
MENU = "() => [...document.querySelectorAll('.lm-MenuBar-itemLabel')].map(e => e.textContent)"


@pytest.fixture
def browser_ok():
    need_chromium()  # skip (or fail under CI=true) before `lab` starts a server for nothing


@pytest.mark.browser
@pytest.mark.timeout(300)
def test_the_chinese_start_here_in_a_chinese_jupyterlab(browser_ok, lab, tmp_path):  # noqa: F811
    from playwright.sync_api import sync_playwright

    base, token = lab
    # what `make lab LANG=zh` sets: the interface language, a user setting (read on page load)
    setting = tmp_path / "settings" / "@jupyterlab" / "translation-extension" / \
        "plugin.jupyterlab-settings"
    setting.parent.mkdir(parents=True, exist_ok=True)
    setting.write_text(json.dumps({"locale": "zh_CN"}))
    ARTIFACTS.mkdir(exist_ok=True)
    digest = hashlib.sha256(ZH_START.read_bytes()).hexdigest()
    rel = "zh/00_start_here.ipynb"
    with sync_playwright() as pw, chromium(pw, tmp_path, width=1440, height=900) as page:
        page.goto(f"{base}/lab/tree/{rel}?token={token}")
        page.wait_for_function("(p) => window.jupyterapp?.shell?.currentWidget?.context?.path"
                               " === p", arg=rel, timeout=60_000)
        page.wait_for_function(IDLE, timeout=60_000)
        menu = page.evaluate(MENU)
        assert "文件" in menu, f"JupyterLab's menus are not in Chinese: {menu}"
        page.evaluate(RUN_ALL)
        deadline = time.monotonic() + 120
        while not page.evaluate(ALL_RAN):
            assert time.monotonic() < deadline, "Run All did not finish in 120 s"
            time.sleep(0.5)
        text = "\n".join(page.evaluate(
            "() => [...document.querySelectorAll('.jp-OutputArea-output')]"
            ".map(e => e.innerText)"))
        assert "Traceback" not in text, text[-3000:]
        assert "默认共享策略" in text and "这台机器准备好了" in text or "需要留意" in text, text
        page.screenshot(path=str(ARTIFACTS / "browser-zh-00-start-here.png"))
        assert_not_tofu(page, ".jp-RenderedMarkdown", "notebooks/zh/00_start_here")
    assert hashlib.sha256(ZH_START.read_bytes()).hexdigest() == digest, \
        "the browser run wrote into the committed notebook"


@pytest.mark.browser
@pytest.mark.timeout(60)
def test_the_glyph_check_sees_tofu_without_a_cjk_font(browser_ok, tmp_path):
    """The same check in a Chromium whose fontconfig knows no CJK font fails: it can fail."""
    from playwright.sync_api import sync_playwright
    from support.browser import CHROMIUM, CHROMIUM_ARGS

    conf = tmp_path / "fonts.conf"  # DejaVu only: Latin, no Han
    conf.write_text('<?xml version="1.0"?><!DOCTYPE fontconfig SYSTEM "fonts.dtd">'
                    "<fontconfig><dir>/usr/share/fonts/truetype/dejavu</dir>"
                    f"<cachedir>{tmp_path / 'fc-cache'}</cachedir></fontconfig>")
    with sync_playwright() as pw:
        browser = pw.chromium.launch(headless=True, executable_path=CHROMIUM,
                                     args=CHROMIUM_ARGS, env={**os.environ,
                                                              "FONTCONFIG_FILE": str(conf)})
        try:
            page = browser.new_page()
            page.set_content("<p class='han'>共享内存检查</p>")
            with pytest.raises(AssertionError, match="tofu"):
                assert_not_tofu(page, ".han", "no CJK font")
        finally:
            browser.close()
