"""Where the time goes in ``share_memory_()`` of a large tensor: its parts, timed and counted
(C12.30, C12.31).

Mirrors: THPStorage_shareFd in torch/csrc/StorageSharing.cpp, whose three steps are

    new_storage = at::new_shm_fd_storage(nbytes)   # shm_open, ftruncate, posix_fallocate, mmap,
                                                   # shm_unlink: every tmpfs page allocated now
    at::storage_copy(new_storage, storage)         # memcpy through the mapping: a page fault
                                                   # for each page it writes (GIL released)
    storage.set_data_ptr(new_storage's pointer)    # the old DataPtr dies: free() -> munmap

Notebook 13 writes the runs (torch's call, its steps by hand, shmlab's call, shmlab's OS layer
driven torch's way); this module holds what they share: ``parts_of`` times the functions
shmlab's Python ``share_memory_`` calls *in place* (each is wrapped for the length of one call,
and nothing else changes), ``medians`` and ``copies`` summarise the runs, ``plot`` draws them.
What is timed is shown, never asserted: timings are noise on a busy machine. What is asserted
is counted: page faults, bytes allocated, bytes resident.
"""

from __future__ import annotations

import contextlib
import statistics
import time

from ..messages import N_, figure_language, tr
from .memprobe import faults


@contextlib.contextmanager
def parts_of(steps, on_fill=None):
    """Time each (module, name, part) call while the block runs; yields {part: {s, faults}}.
    ``on_fill(fd)`` runs right after ``fill`` returns: the peak, both copies alive."""
    timed, saved = {}, [(mod, name, getattr(mod, name)) for mod, name, _ in steps]

    def wrap(real, part, name):
        def call(*args, **kwargs):
            t0, f0 = time.perf_counter(), faults()
            try:
                return real(*args, **kwargs)
            finally:
                timed[part] = {"s": time.perf_counter() - t0, "faults": faults() - f0}
                if name == "fill" and on_fill is not None:
                    timed[part].update(on_fill(args[0]))
        return call

    try:
        for (mod, name, part), (_, _, real) in zip(steps, saved, strict=True):
            setattr(mod, name, wrap(real, part, name))
        yield timed
    finally:
        for mod, name, real in saved:
            setattr(mod, name, real)


def medians(results: dict) -> dict:
    """{run: {part: (median seconds, median faults)}} over the repeats (faults: a real count,
    the lower middle one of an even number)."""
    out = {}
    for name, runs in results.items():
        parts = runs[0]["parts"]
        out[name] = {p: (statistics.median(r["parts"][p]["s"] for r in runs),
                         statistics.median_low(r["parts"][p]["faults"] for r in runs))
                     for p in parts}
    return out


def copies(results: dict, nbytes: int) -> dict:
    """Memory in copies of the tensor (median over the repeats), for both whole calls:
    "peak": both copies at once (torch: VmHWM, the segment's pages are in its RSS once copied;
    shmlab: RssAnon + the segment's pages when ``fill`` returns: pwrite maps nothing), "peak
    RSS", and after the call "private" (RssAnon), "segment" (st_blocks), "mapped" (RssShmem);
    and how much of the old private buffer was in transparent huge pages."""
    out = {}
    for lib in ("torch", "shmlab"):
        rows = []
        for r in results[f"{lib} share_memory_()"]:
            base, after = r["base"], r["after"]
            fill = r["parts"].get("allocate + copy", {})
            peak = (fill["anon"] - base["RssAnon"] + fill["segment"] if fill
                    else None if r["peak"] is None else r["peak"] - base["VmRSS"])
            rows.append({"peak": peak, "peak RSS": None if r["peak"] is None
                         else r["peak"] - base["VmRSS"],
                         "private": after["RssAnon"] - base["RssAnon"],
                         "segment": r["segment"], "mapped": after["RssShmem"] - base["RssShmem"],
                         "old in huge pages": r["before"].get("AnonHugePages", 0)
                         - base.get("AnonHugePages", 0)})
        out[lib] = {k: None if any(row[k] is None for row in rows)
                    else round(statistics.median(row[k] for row in rows) / nbytes, 2)
                    for k in rows[0]}
    return out


# What each part is drawn as: one colour per kind of work, the same in every bar.
KIND = {"allocate": "allocate", "copy": "copy", "allocate + copy": "allocate + copy",
        "free old": "free old", "swap, free old": "free old", "share_memory_()": "the whole call"}
# The kinds are the legend's labels too (N_: translated when drawn).
COLORS = {N_("the whole call"): "#937860", N_("allocate"): "#4c72b0", N_("copy"): "#dd8452",
          N_("allocate + copy"): "#8172b3", N_("free old"): "#55a868",
          N_("the rest"): "#bbbbbb"}


def plot(med: dict, nbytes: int):
    """Stacked horizontal bars of the median parts, one bar per run; returns the figure.
    Parts of well under a millisecond (shm_open, mmap, shm_unlink, Python) are "the rest"."""
    import matplotlib.pyplot as plt

    lang = figure_language()
    fig, ax = plt.subplots(figsize=(10, 2.8))
    for y, parts in enumerate(med.values()):
        left = 0.0
        for part, (sec, _) in parts.items():
            kind = KIND.get(part, "the rest")
            ax.barh(y, sec * 1e3, left=left, color=COLORS[kind], edgecolor="white", label=kind)
            left += sec * 1e3
    ax.set_yticks(range(len(med)), list(med))
    ax.invert_yaxis()
    ax.set_xlabel(tr("milliseconds (median of the repeats), one {mib} MiB tensor", lang,
                     mib=nbytes // 2**20))
    handles = dict(zip(*reversed(ax.get_legend_handles_labels()), strict=True))
    kinds = [k for k in COLORS if k in handles]  # the legend in COLORS' order
    ax.legend([handles[k] for k in kinds], [tr(k, lang) for k in kinds], loc="upper left",
              bbox_to_anchor=(1.01, 1), fontsize="small")
    fig.tight_layout()
    return fig
