"""Helpers shared by the tests: leak checking, families of processes, waiting, notebooks."""
