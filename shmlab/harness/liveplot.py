"""Live training plots for notebooks 06 (Hogwild) and 07 (beyond one machine).

``LivePlot`` is one figure updated in place from an ``on_metric`` callback: training loss and
test accuracy per process against time. A white figure with dark text reads in light and dark
themes; the display is replaced (``display_id``), not appended, so it neither flickers nor
scrolls. ``accuracy_curve`` and ``plot_accuracy`` draw the finished runs the same way. Their
labels are Chinese in the Chinese edition when a CJK font is installed
(Note [A figure's language needs a CJK font]).

Mirrors: nothing in torch; torch's examples plot with matplotlib (or TensorBoard) in the script.
"""

from __future__ import annotations

import time

from ..messages import figure_language, tr


def _plt():
    import matplotlib.pyplot as plt  # imported on use: the package does not need matplotlib

    return plt


def fmt_seconds(t) -> str:
    """A time-to-target for a table: "1.23 s", or "not reached"."""
    return tr("not reached") if t is None else f"{t:.2f} s"


def accuracy_curve(metrics) -> tuple[list, list]:
    """(times, test accuracies) of the metric messages that carry a test accuracy."""
    pts = [(m["time"], m["test_acc"]) for m in metrics if m.get("test_acc") is not None]
    return [t for t, _ in pts], [a for _, a in pts]


def plot_accuracy(ax, hogwild_run, other_run, other_label: str, target: float) -> None:
    """Test accuracy against time: one line per Hogwild process, one for `other_run`."""
    lang = figure_language()
    for rank, ms in hogwild_run.per_process().items():
        ax.plot(*accuracy_curve(ms), ".-", lw=1,
                label=tr("Hogwild process {rank}", lang, rank=rank))
    ax.plot(*accuracy_curve(other_run.metrics), ".-", lw=1, color="black", label=other_label)
    ax.axhline(target, color="0.4", ls="--", lw=1)
    ax.set(xlabel=tr("seconds since training started", lang),
           ylabel=tr("test accuracy", lang), ylim=(0.5, 1.0))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)


def white_figure(*args, **kwargs):
    """``plt.subplots`` in the default style on a white background (light and dark themes);
    in the Chinese edition with a CJK font configured, for labels a notebook writes in Chinese."""
    figure_language()
    plt = _plt()
    with plt.style.context("default"):
        return plt.subplots(*args, facecolor="white", layout="constrained", **kwargs)


class LivePlot:
    """Loss and test accuracy per process against time, redrawn at most every `every` s.

    ``plot.add(metric)`` takes one metric message (rank, time, loss, test_acc) — pass
    ``plot.add`` as a trainer's ``on_metric`` — and ``plot.draw()`` forces a final redraw.
    """

    def __init__(self, title: str, target: float, every: float = 0.5):
        from IPython.display import display

        self.lang = figure_language()
        self.fig, (self.ax_loss, self.ax_acc) = white_figure(1, 2, figsize=(9.5, 3.2))
        for ax, label in ((self.ax_loss, tr("training loss (batch)", self.lang)),
                          (self.ax_acc, tr("test accuracy", self.lang))):
            ax.set_facecolor("white")
            ax.set_xlabel(tr("seconds since training started", self.lang))
            ax.set_title(label, fontsize=10)
            ax.grid(alpha=0.3)
        self.ax_acc.axhline(target, color="0.4", ls="--", lw=1,
                            label=tr("target {target:.0%}", self.lang, target=target))
        self.fig.suptitle(title, fontsize=11)
        self.lines, self.every, self.last = {}, every, 0.0
        self.handle = display(self.fig, display_id=True)
        _plt().close(self.fig)  # shown through self.handle only, not again at the cell's end

    def _line(self, key, ax, label, **style):
        if (key, ax) not in self.lines:
            (line,) = ax.plot([], [], label=label, **style)
            self.lines[key, ax] = (line, [], [])
            ax.legend(fontsize=8, loc="best")
        return self.lines[key, ax]

    def add(self, m, name=None, **style) -> None:
        """Add one metric message; redraw at most every `every` seconds."""
        name = name or tr("process {rank}", self.lang, rank=m["rank"])
        _, xs, ys = self._line(name, self.ax_loss, name, lw=1, **style)
        xs.append(m["time"])
        ys.append(m["loss"])
        if m.get("test_acc") is not None:
            _, xs, ys = self._line(name, self.ax_acc, name, marker=".", lw=1, **style)
            xs.append(m["time"])
            ys.append(m["test_acc"])
        if time.monotonic() - self.last > self.every:
            self.draw()

    def draw(self) -> None:
        for line, xs, ys in self.lines.values():
            line.set_data(xs, ys)
        for ax in (self.ax_loss, self.ax_acc):
            ax.relim()
            ax.autoscale_view()
        self.handle.update(self.fig)
        self.last = time.monotonic()
