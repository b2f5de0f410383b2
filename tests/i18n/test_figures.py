"""The figures shmlab draws speak the notebook's language: Chinese labels in a CJK font when one
is installed (Note [A figure's language needs a CJK font]), English and no warning without one."""

from __future__ import annotations

import re
import warnings

import pytest

matplotlib = pytest.importorskip("matplotlib")
matplotlib.use("Agg")

from matplotlib import font_manager  # noqa: E402

from shmlab import messages  # noqa: E402
from shmlab.lessons import share_parts  # noqa: E402

HAN = re.compile(r"[\u4e00-\u9fff]")
MED = {"torch share_memory_()": {"allocate + copy": (0.030, 10), "free old": (0.004, 0),
                                  "shm_open": (0.0001, 0)},
       "shmlab share_memory_()": {"allocate": (0.010, 5), "copy": (0.020, 5)}}


def _texts(fig):
    ax = fig.axes[0]
    return [ax.xaxis.label, *ax.get_legend().get_texts()]


def _draw(fig) -> list[str]:
    """Draw the figure; the warnings matplotlib gave (a missing glyph is one)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fig.canvas.draw()
    return [str(w.message) for w in caught]


@pytest.mark.skipif(messages.cjk_family() is None, reason="no CJK font installed here")
def test_a_chinese_figure_has_chinese_labels_in_a_cjk_font(monkeypatch):
    monkeypatch.setenv("SHMLAB_LANG", "zh")
    with matplotlib.rc_context():
        fig = share_parts.plot(MED, 64 << 20)
        texts = _texts(fig)
        assert all(HAN.search(t.get_text()) for t in texts), [t.get_text() for t in texts]
        assert texts[0].get_text() == "毫秒（多次重复的中位数），一个 64 MiB 的张量"
        for t in texts:  # the file matplotlib draws the label with is the CJK family's
            path = font_manager.findfont(t.get_fontproperties(), fallback_to_default=False)
            assert font_manager.get_font(path).family_name == messages.cjk_family(), path
        assert not [w for w in _draw(fig) if "Glyph" in w]
        matplotlib.pyplot.close(fig)


def test_the_english_figure_is_as_before(monkeypatch):
    monkeypatch.setenv("SHMLAB_LANG", "en")
    with matplotlib.rc_context():
        fig = share_parts.plot(MED, 64 << 20)
        assert [t.get_text() for t in _texts(fig)] == [
            "milliseconds (median of the repeats), one 64 MiB tensor",
            "allocate", "copy", "allocate + copy", "free old", "the rest"]
        matplotlib.pyplot.close(fig)


def test_without_a_cjk_font_a_chinese_figure_is_english_and_quiet(monkeypatch):
    monkeypatch.setenv("SHMLAB_LANG", "zh")
    monkeypatch.setattr(messages, "cjk_family", lambda: None)
    with matplotlib.rc_context():
        before = list(matplotlib.rcParams["font.sans-serif"])
        assert messages.figure_language() == "en"
        fig = share_parts.plot(MED, 64 << 20)
        assert not any(HAN.search(t.get_text()) for t in _texts(fig))
        assert not [w for w in _draw(fig) if "Glyph" in w]
        assert matplotlib.rcParams["font.sans-serif"] == before
        matplotlib.pyplot.close(fig)
