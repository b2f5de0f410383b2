"""The cheat sheets' numbers are the ones the code produces: the "checked on" line names the
Pythons the Makefile tests and the torch every constraints file pins, and the size of a pickled
4 MB tensor is what notebook 01's step 3 measures (torch.zeros(1_000_000), float32).

Mirrors: notebooks/01_what_is_torch_multiprocessing.ipynb (step 3), Makefile (PYTHONS).
"""

import json
import os
import re
import subprocess
import sys

import pytest
from support.nbutil import REPO

SHEETS = {"en": REPO / "docs" / "cheatsheet.md", "zh": REPO / "docs" / "cheatsheet.zh.md"}
CHECKED = {"en": r"Checked\s+on torch (\d+\.\d+) and Python (3\.\d+)–(3\.\d+) on Linux",
           "zh": r"在 Linux 上的 torch (\d+\.\d+)、Python (3\.\d+)–(3\.\d+) 下核对过"}
SIZES = {"en": r"4 MB tensor[^:]*: (\d+) bytes vs ([\d,]+) plain",
         "zh": r"4 MB 张量[^：]*：(\d+) 字节，普通 pickle 是 ([\d,]+) 字节"}


def pythons_the_suite_runs() -> list[str]:
    text = (REPO / "Makefile").read_text()
    return re.search(r"^PYTHONS\s*:=\s*(.*)$", text, re.M).group(1).split()


def pinned_torch() -> set[str]:
    pins = set()
    for path in (REPO / "requirements").glob("constraints-py3.*.txt"):
        pins |= set(re.findall(r"^torch==(\d+\.\d+)\.", path.read_text(), re.M))
    return pins


@pytest.mark.claim("C25.35")
@pytest.mark.parametrize("lang", SHEETS)
def test_checked_on_line_names_the_tested_pythons_and_the_pinned_torch(lang):
    found = re.search(CHECKED[lang], SHEETS[lang].read_text(encoding="utf-8"))
    assert found, f"{SHEETS[lang].name}: no 'checked on' line matching {CHECKED[lang]!r}"
    torch, oldest, newest = found.groups()
    pythons = sorted(pythons_the_suite_runs(), key=lambda v: tuple(map(int, v.split("."))))
    assert (oldest, newest) == (pythons[0], pythons[-1]), (found.group(0), pythons)
    assert {torch} == pinned_torch(), (found.group(0), pinned_torch())


STEP3 = """
import json, pickle
import torch
from multiprocessing.reduction import ForkingPickler
t = torch.zeros(1_000_000)  # notebook 01 step 3's 4 MB row: float32
print(json.dumps([len(ForkingPickler.dumps(t)), len(pickle.dumps(t))]))
"""


@pytest.mark.timeout(120)
@pytest.mark.claim("C25.36")
def test_the_4_mb_figures_are_what_step_3_pickles():
    # The handle carries the resource sharer's socket path, which lies under TMPDIR: the
    # sheets' figure is for the default /tmp (the test run's private TMPDIR is longer).
    out = subprocess.run([sys.executable, "-c", STEP3], capture_output=True, text=True,
                         timeout=100, env=dict(os.environ, TMPDIR="/tmp"))
    assert out.returncode == 0, out.stderr
    handle, plain = json.loads(out.stdout.splitlines()[-1])
    for lang, pattern in SIZES.items():
        found = re.search(pattern, SHEETS[lang].read_text(encoding="utf-8"))
        assert found, f"{SHEETS[lang].name}: no 4 MB figure matching {pattern!r}"
        assert (int(found.group(1)), int(found.group(2).replace(",", ""))) == (handle, plain), (
            f"{SHEETS[lang].name} says {found.group(0)!r}; step 3 pickles {handle} and {plain}")
