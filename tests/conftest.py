import os
import sys

# The leak checker is a plugin module beside this file, so the harness's own tests can load it
# into a pytester run and prove that it fails a leaking test.
sys.path.insert(0, os.path.dirname(__file__))
pytest_plugins = ["leakcheck", "pytester", "families"]
