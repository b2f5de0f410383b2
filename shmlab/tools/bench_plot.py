"""Draw the handoff benchmark: round-trip time against size, log-log, one panel per strategy.

Kept apart from bench.py so that measuring never imports matplotlib (its import costs more
than a whole small run, and the Agg backend is chosen here, before pyplot loads: no display).
"""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")  # files only: works without a display, in CI and over ssh
import matplotlib.pyplot as plt  # noqa: E402 - must follow the backend choice

from ..messages import N_, figure_language, tr  # noqa: E402
from .bench import LIBS, SHORT, STRATEGIES  # noqa: E402

_COLOR = {"torch": "tab:orange", "shmlab": "tab:blue"}
_STYLE = {N_("shared"): "-", N_("fresh"): "--"}  # the legend's words too (N_: see tr below)


def plot(rows: list[dict], path: str, about: dict | None = None) -> None:
    """p50 per case (markers), p50..p90 as a band, for both strategies; saved to ``path``."""
    sizes = [r["bytes"] for r in rows]
    lang = figure_language()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5), sharey=True)
    for ax, strategy in zip(axes, STRATEGIES, strict=True):
        for lib in LIBS:
            for kind in ("shared", "fresh"):
                case = f"{lib} {SHORT[strategy]} {kind}"
                p50 = [r[case]["p50"] for r in rows]
                p90 = [r[case]["p90"] for r in rows]
                ax.plot(sizes, p50, _STYLE[kind], marker="o", ms=3, color=_COLOR[lib],
                        label=f"{lib}, {tr(kind, lang)}")
                ax.fill_between(sizes, p50, p90, color=_COLOR[lib], alpha=0.12, lw=0)
        ax.plot(sizes, [r["pickle copy"]["p50"] for r in rows], ":", marker="s", ms=3,
                color="tab:gray", label=tr("pickle copy (numpy)", lang))
        ax.set(xscale="log", yscale="log", title=strategy,
               xlabel=tr("tensor size, bytes", lang))
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel(tr("round trip, ms (p50; band to p90)", lang))
    axes[1].legend(fontsize=8)
    if about:
        fig.suptitle(tr("{cores} cores, load {load}, Linux {kernel}, Python {python}, "
                        "torch {torch}", lang, **about), fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
