import os
import sys

# The helpers are the package tests/support/ (leakcheck, families, waiting, nbutil). This folder
# goes first on sys.path so `support` imports the same way here and in a pytester run: the
# harness's own tests load the leak checker into one (`-p support.leakcheck`) and prove that it
# fails a leaking test.
sys.path.insert(0, os.path.dirname(__file__))
pytest_plugins = ["support.leakcheck", "pytester", "support.families", "support.managers"]


def pytest_terminal_summary(terminalreporter):
    """After a run that executed notebooks headless: their times against their budgets."""
    nbutil = sys.modules.get("support.nbutil")  # not imported: no notebook ran
    if nbutil is not None and nbutil.TIMES:
        terminalreporter.write_sep("=", "notebook times (headless)")
        for line in nbutil.times_table(nbutil.TIMES):
            terminalreporter.write_line(line)
