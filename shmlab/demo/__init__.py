"""What the notebooks, tests, labs and the stress tool drive: child processes that take one
command at a time (``actor``), the commands they run, and the notebook helper.

Nothing here is part of the torch mirror; it only drives it.
"""
