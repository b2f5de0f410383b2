"""Every Mermaid diagram of the notebooks renders in a real JupyterLab, in headless Chromium.

One server (tests/support/browser.py) and one page for all the notebooks that have ```mermaid
fences: each notebook is opened without a kernel (Markdown renders without running code), and we
wait until each of its fences became a ``div.jp-RenderedMermaid``: either a diagram (an ``<img>``
whose data URL is an SVG) or, for a syntax error, the warning box with mermaid's message. The test
wants as many SVG diagrams as fences and no warning. Without Chromium it skips, except under
CI=true (then it fails), as every browser test does. A screenshot of each diagram goes to
test-artifacts/.
"""

from __future__ import annotations

import hashlib
import time

import pytest
from support import mermaid
from support.browser import ARTIFACTS, chromium, lab, lab_root, need_chromium  # noqa: F401

NOTEBOOKS = mermaid.notebooks_with_diagrams()
APP_READY = "() => window.jupyterapp?.commands?.hasCommand('docmanager:open') === true"
OPEN = """async (path) => {
  const w = await window.jupyterapp.commands.execute('docmanager:open', {
    path, factory: 'Notebook', kernelPreference: {shouldStart: false, canStart: false}});
  await w.context.ready;
  (window.shmlabOpened ??= {})[path] = w;
  return w.id;
}"""
READ = """(id) => {
  const node = document.getElementById(id);
  const all = [...node.querySelectorAll('.jp-MarkdownCell .jp-RenderedMermaid')];
  const svg = (d) => [...d.querySelectorAll('figure > img')].some(img =>
    img.src.startsWith('data:image/svg+xml,')
    && decodeURIComponent(img.src.slice('data:image/svg+xml,'.length)).includes('<svg'));
  return {
    rendered: all.filter(d => !d.classList.contains('jp-mod-warning') && svg(d)).length,
    errors: all.filter(d => d.classList.contains('jp-mod-warning')).map(d =>  // mermaid's words
      (d.querySelector('details > pre')?.textContent || d.innerText).slice(0, 600)),
  };
}"""
CLOSE = "(path) => { window.shmlabOpened[path].dispose(); delete window.shmlabOpened[path]; }"


@pytest.fixture
def browser_ok():
    """Skips (or fails under CI=true) before `lab` starts a server for nothing."""
    need_chromium()


@pytest.mark.browser
@pytest.mark.timeout(240)
def test_every_mermaid_diagram_renders_as_an_svg(browser_ok, lab, tmp_path):  # noqa: F811
    from playwright.sync_api import sync_playwright

    assert NOTEBOOKS, "no notebook has a ```mermaid diagram"
    base, token = lab
    ARTIFACTS.mkdir(exist_ok=True)
    digests = {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in NOTEBOOKS}
    results, t0 = {}, time.monotonic()
    with sync_playwright() as pw, chromium(pw, tmp_path) as page:
        page.goto(f"{base}/lab?token={token}")
        page.wait_for_function(APP_READY, timeout=60_000)
        print(f"JupyterLab ready {time.monotonic() - t0:.1f} s after opening the page")
        for path, fences in NOTEBOOKS.items():  # one at a time: a closed one costs nothing
            widget_id = page.evaluate(OPEN, path.name)
            deadline = time.monotonic() + 30
            while True:  # mermaid is loaded on first use, and each diagram renders on its own
                state = page.evaluate(READ, widget_id)
                if (state["rendered"] + len(state["errors"]) >= len(fences)
                        or time.monotonic() > deadline):
                    break
                time.sleep(0.1)
            results[path.name] = (len(fences), state)
            print(f"{path.name}: {state['rendered']}/{len(fences)} after "
                  f"{time.monotonic() - t0:.1f} s")
            shown = page.locator(f"#{widget_id} .jp-MarkdownCell .jp-RenderedMermaid")
            for i in range(min(shown.count(), len(fences))):  # each diagram, scrolled into view
                shown.nth(i).screenshot(path=str(ARTIFACTS / f"diagram-{path.stem[:2]}-{i}.png"))
            page.evaluate(CLOSE, path.name)
    elapsed = time.monotonic() - t0
    print(f"{sum(len(f) for f in NOTEBOOKS.values())} diagrams in {len(NOTEBOOKS)} notebooks "
          f"checked in {elapsed:.1f} s after the page opened")
    problems = [f"{name}: {n} fence(s), {s['rendered']} SVG diagram(s), errors: {s['errors']}"
                for name, (n, s) in results.items() if s["rendered"] != n or s["errors"]]
    assert not problems, "\n".join(problems)
    changed = [p.name for p, d in digests.items()
               if hashlib.sha256(p.read_bytes()).hexdigest() != d]
    assert not changed, f"the browser run wrote into committed notebooks: {changed}"
