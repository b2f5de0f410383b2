"""Models: labelled CPU stand-ins for what shmlab cannot run itself.

- ``cuda_ipc``: CUDA IPC (``torch/csrc/CudaIPCTypes.cpp``): handles, the limbo, ``ipc_collect``.
"""
