"""The doctor (and 00_start_here, which asks the same function) says when no CJK font is
installed, and how to install one."""

from __future__ import annotations

import shutil

import pytest

from shmlab.introspect import checks


@pytest.mark.skipif(shutil.which("fc-list") is None, reason="no fontconfig (fc-list) here")
def test_no_cjk_font_is_reported_with_the_fix(monkeypatch, tmp_path):
    conf = tmp_path / "fonts.conf"  # a fontconfig that knows DejaVu only: no Han glyphs
    conf.write_text('<?xml version="1.0"?><!DOCTYPE fontconfig SYSTEM "fonts.dtd">'
                    "<fontconfig><dir>/usr/share/fonts/truetype/dejavu</dir>"
                    f"<cachedir>{tmp_path / 'cache'}</cachedir></fontconfig>")
    monkeypatch.setenv("FONTCONFIG_FILE", str(conf))
    (finding,) = checks.cjk_font()
    assert finding.severity == "info" and "no CJK font" in finding.message
    assert "fonts-noto-cjk" in finding.fix and finding.details == {"fonts": []}


@pytest.mark.skipif(not checks.cjk_fonts(), reason="no CJK font installed here")
def test_an_installed_cjk_font_is_named():
    (finding,) = checks.cjk_font()
    assert finding.severity == "ok" and finding.message.startswith("CJK font: ")


def test_without_fontconfig_the_doctor_says_it_cannot_tell(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    (finding,) = checks.cjk_font()
    assert finding.severity == "info" and "cannot tell" in finding.message
