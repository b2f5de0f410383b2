import os
import sys

# The helpers are the package tests/support/ (leakcheck, families, waiting, nbutil). This folder
# goes first on sys.path so `support` imports the same way here and in a pytester run: the
# harness's own tests load the leak checker into one (`-p support.leakcheck`) and prove that it
# fails a leaking test.
sys.path.insert(0, os.path.dirname(__file__))
pytest_plugins = ["support.leakcheck", "pytester", "support.families", "support.managers"]
