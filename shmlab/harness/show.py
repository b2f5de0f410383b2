"""Show things in a notebook: Markdown tables and live widgets, never failing the notebook.

In a Jupyter kernel these display rich output; anywhere else (a script, a test) they print the
text form, so the same helper works headless.
"""

from __future__ import annotations

import importlib

from shmlab.messages import tr


def _in_ipython() -> bool:
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    return get_ipython() is not None


def _display(obj, text=None) -> None:
    """IPython's display() in a kernel; elsewhere (scripts, tests) print `text` or `obj`."""
    if not _in_ipython():
        print(obj if text is None else text)
        return
    from IPython.display import display

    display(obj)


def markdown_table(head, rows) -> str:
    """The Markdown text of a small table."""
    lines = ["| " + " | ".join(map(str, head)) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def show_table(head, rows) -> None:
    """A small Markdown table (readable in light and dark themes, and as text headless)."""
    text = markdown_table(head, rows)
    if not _in_ipython():
        print(text)
        return
    from IPython.display import Markdown

    _display(Markdown(text))


def make_widget(make, **kwargs):
    """`make` is a widget class name of shmlab.widgets ("FdMonitor") or a callable."""
    if isinstance(make, str):
        make = getattr(importlib.import_module("shmlab.widgets"), make)
    return make(**kwargs)


def show_widget(make, **kwargs):
    """Display a live widget if one can be made here; return it, or None (never raises)."""
    try:
        widget = make_widget(make, **kwargs)
        _display(widget)
    except Exception as exc:  # noqa: BLE001 - no widget here (headless, or not installed)
        print(f"(live widget not available: {type(exc).__name__}: {exc})")
        return None
    return widget


def reveal(answer: str, *evidence, sep: str = " ") -> None:
    """A self-check answer, collapsed: Run All shows only "Show the answer", so the learner's
    attempt comes first. ``evidence`` (joined like ``print``'s arguments) is what this machine
    just measured; it goes inside the same collapsed element."""
    import html

    shown = sep.join(str(e) for e in evidence)
    body = f"<p>{html.escape(answer)}</p>" + (f"<pre>{html.escape(shown)}</pre>" if shown else "")
    _display(_html(f"<details><summary>{tr('Show the answer')}</summary>{body}</details>"),
             text=f"{tr('[answer hidden]')} {answer}\n{shown}".rstrip())


def _html(markup: str):
    from IPython.display import HTML

    return HTML(markup)
