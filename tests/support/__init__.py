"""Helpers shared by the tests, one package: leak checking, torch and shmlab side by side, waiting,
notebooks, and the manager tests' fixtures.

leakcheck (plugin, autouse)  fail a test that leaves /dev/shm files, children or managers behind
leakwatch                    the leak checker's watcher process (whose /dev/shm file is whose)
families (plugin)            LIBS, both(), the `families` fixture: torch and shmlab side by side
managers (plugin)            the `segment` and `fresh_client` fixtures of the manager tests
waiting                      wait_for(), stop()
namespaces                   run_unshared(): a script as root in a private mount namespace
nbutil                       find, execute and inspect notebooks
xdistgroups (plugin)         `--dist loadgroup` keeps each xdist_group on one worker (pytest 9)
"""
