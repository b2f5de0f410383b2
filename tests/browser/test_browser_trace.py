"""A trace in a real JupyterLab: its Mermaid diagram renders as an SVG, the live timeline draws.

A small notebook, generated into the folder the server serves (never a committed one), traces one
torch handoff (a `fork` child takes a 1 MiB tensor off a Queue) with `TraceTimeline(tr)` on
screen inside the `with trace()` block, then shows `tr.show()`. After Run All in headless
Chromium (tests/support/browser.py):

* the trace's diagram is a ``.jp-RenderedMermaid`` in the cell's output, holding an SVG image
  (JupyterLab 4.1+ renders a ```mermaid fence of a Markdown output), and no Mermaid error box;
* the timeline shows one lane per process (the kernel and the child, at least) and marks of
  both kinds, Python hops and system calls, and it said "trace ended" once the block was over;
* its text reads in the light and the dark theme (WCAG AA, 4.5:1); a screenshot of each theme
  goes to test-artifacts/.

Without strace the timeline has Python hops only: the check of system-call marks then skips
with the reason. Without Chromium the test skips, except under CI=true, as every browser test.
"""

from __future__ import annotations

import shutil
import time

import nbformat
import pytest
from support.browser import (  # noqa: F401 - `lab` is a fixture
    ALL_RAN,
    ARTIFACTS,
    IDLE,
    RUN_ALL,
    chromium,
    lab,
    low_contrast,
    need_chromium,
    set_theme,
    widget_errors,
)

NAME = "trace_in_the_browser.ipynb"
CELLS = [
    """\
import multiprocessing

import torch
from IPython.display import display

from shmlab.trace import trace
from shmlab.widgets import TraceTimeline


def receive(q, got):
    t = q.get(timeout=60)
    float(t.sum())
    del t
    got.set()
""",
    """\
ctx = multiprocessing.get_context("fork")
q, got = ctx.Queue(), ctx.Event()
with trace(syscalls="auto") as tr:
    timeline = TraceTimeline(tr)
    display(timeline)
    child = ctx.Process(target=receive, args=(q, got))
    child.start()
    t = torch.ones(256 * 1024)
    q.put(t)
    got.wait(60)
    child.join(60)
    time.sleep(0.6)  # a few refreshes while the block still runs
timeline.stop()
del t
print("events:", len(tr.events), "| strace:", tr.overhead.get("strace"))
""",
    "tr.show()",
]
STATE = """() => {
  const tl = document.querySelector('.shmlab-trace-timeline');
  const out = [...document.querySelectorAll('.jp-OutputArea .jp-RenderedMermaid')];
  const svg = (d) => [...d.querySelectorAll('img')].some(img =>
    img.src.startsWith('data:image/svg+xml,')
    && decodeURIComponent(img.src.slice('data:image/svg+xml,'.length)).includes('<svg'));
  return {
    lanes: tl ? tl.querySelectorAll('.shmlab-trace-lane').length : -1,
    python: tl ? tl.querySelectorAll('.shmlab-trace-mark.shmlab-trace-python').length : -1,
    syscall: tl ? tl.querySelectorAll('.shmlab-trace-mark.shmlab-trace-syscall').length : -1,
    status: tl?.querySelector('.shmlab-trace-status')?.innerText ?? '',
    diagrams: out.filter(d => !d.classList.contains('jp-mod-warning') && svg(d)).length,
    errors: out.filter(d => d.classList.contains('jp-mod-warning'))
      .map(d => d.innerText.slice(0, 400)),
  };
}"""
OUTPUTS = "() => [...document.querySelectorAll('.jp-OutputArea-output')].map(e => e.innerText)"


@pytest.fixture
def lab_root(tmp_path):
    """Serve a folder holding only the generated notebook."""
    root = tmp_path / "served"
    root.mkdir()
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in CELLS])
    nb.cells[1].source = "import time\n\n" + nb.cells[1].source
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3 (ipykernel)",
                                 "language": "python"}
    nbformat.write(nb, root / NAME)
    return root


@pytest.fixture
def browser_ok():
    need_chromium()  # skip (or fail under CI=true) before `lab` starts a server for nothing


def _run_all(page, base, token, timeout_s=180):
    page.goto(f"{base}/lab/tree/{NAME}?token={token}")
    page.wait_for_function("(name) => window.jupyterapp?.shell?.currentWidget?.context?.path"
                           " === name", arg=NAME, timeout=60_000)
    page.wait_for_function(IDLE, timeout=60_000)
    t0 = time.monotonic()
    page.evaluate(RUN_ALL)
    while not page.evaluate(ALL_RAN):
        text = "\n".join(page.evaluate(OUTPUTS))
        assert "Traceback" not in text, f"a cell failed:\n{text[-3000:]}"
        assert time.monotonic() - t0 < timeout_s, f"Run All took over {timeout_s} s:\n{text}"
        time.sleep(0.5)
    text = "\n".join(page.evaluate(OUTPUTS))
    assert "Traceback" not in text, f"a cell failed:\n{text[-3000:]}"
    print(f"Run All took {time.monotonic() - t0:.1f} s")
    return text


@pytest.mark.browser
@pytest.mark.timeout(300)
def test_trace_diagram_and_live_timeline_render(browser_ok, lab, tmp_path):  # noqa: F811
    from playwright.sync_api import sync_playwright

    base, token = lab
    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as pw, chromium(pw, tmp_path, width=1440, height=1000) as page:
        text = _run_all(page, base, token)
        deadline = time.monotonic() + 30  # mermaid loads on first use, then renders
        while True:
            state = page.evaluate(STATE)
            if state["diagrams"] or state["errors"] or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        print(state)
        assert not widget_errors(page), widget_errors(page)
        assert state["errors"] == [], f"Mermaid could not draw the trace: {state['errors']}"
        assert state["diagrams"] == 1, f"the trace's diagram did not render as an SVG: {state}"
        assert state["lanes"] >= 2 and state["python"] >= 3, f"the timeline is empty: {state}"
        assert "trace ended" in state["status"], state
        for theme in ("light", "dark"):
            set_theme(page, theme)
            page.locator(".shmlab-trace-timeline").scroll_into_view_if_needed()
            page.locator(".shmlab-trace-timeline").screenshot(
                path=str(ARTIFACTS / f"browser-trace-timeline-{theme}.png"))
            # the diagram is taller than the window: what a learner sees of its top
            page.locator(".jp-OutputArea .jp-RenderedMermaid").first.evaluate(
                "e => e.scrollIntoView({block: 'start'})")
            time.sleep(0.3)
            page.screenshot(path=str(ARTIFACTS / f"browser-trace-diagram-{theme}.png"))
            low = low_contrast(page, ".shmlab-trace-timeline")
            assert not low, f"timeline text below 4.5:1 in the {theme} theme: {low}"
        set_theme(page, "light")
    if "strace: True" not in text:
        pytest.skip(f"no system calls in the trace (strace: {shutil.which('strace')}); "
                    "the Python-level timeline and diagram rendered")
    assert state["syscall"] >= 3, f"the timeline shows no system call: {state}"
