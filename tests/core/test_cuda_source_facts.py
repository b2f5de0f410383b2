"""CUDA facts read from the installed torch's source (no GPU needed): what poisons fork, and
when the IPC limbo is collected. The C++ halves (torch/csrc/cuda/Module.cpp's
THCPModule_getDeviceCount_wrap calling poison_fork, torch/csrc/CudaIPCTypes.cpp's
CudaIPCSentDataDelete calling collect) are not shipped; what is shipped is read here."""

from __future__ import annotations

import inspect
import pathlib

import pytest
import torch
import torch.cuda

TORCH = pathlib.Path(torch.__file__).parent


@pytest.mark.claim("C25.7")
def test_is_available_asks_the_cuda_runtime_unless_the_nvml_check_is_asked_for():
    src = inspect.getsource(torch.cuda.is_available)
    doc = inspect.getdoc(torch.cuda.is_available)
    # documented: it poisons fork unless PYTORCH_NVML_BASED_CUDA_CHECK=1
    assert "will NOT poison fork" in doc and "PYTORCH_NVML_BASED_CUDA_CHECK=1" in doc
    assert 'os.getenv("PYTORCH_NVML_BASED_CUDA_CHECK") == "1"' in inspect.getsource(
        torch.cuda._nvml_based_avail)
    nvml, default = src.split("if _nvml_based_avail():", 1)[1].split("else:", 1)
    assert "device_count() > 0" in nvml and "torch._C._cuda_getDeviceCount() > 0" in default
    # the bad-fork check that _lazy_init makes in such a child
    assert "_is_in_bad_fork()" in inspect.getsource(torch.cuda._lazy_init)
    assert "Cannot re-initialize CUDA in forked subprocess" in inspect.getsource(
        torch.cuda._lazy_init)


@pytest.mark.claim("C25.9")
def test_the_limbo_is_collected_by_ipc_collect_and_on_an_allocator_cache_miss():
    ipc = (TORCH / "include/torch/csrc/CudaIPCTypes.h").read_text()
    alloc = (TORCH / "include/c10/cuda/CUDACachingAllocator.h").read_text()
    assert "struct CudaIPCSentDataLimbo" in ipc and "bool collect();" in ipc
    # the caching allocator's free-memory callback collects; it runs whenever an allocation
    # finds no free cached block (before cudaMalloc), not only when memory runs out
    callback = ipc[ipc.index("class CudaIPCCollectCallback"):]
    assert "public FreeMemoryCallback" in callback and "torch::CudaIPCCollect()" in callback
    assert "FreeCudaMemoryCallbacksRegistry" in alloc
    assert ("// Caching allocator will execute every registered callback if it unable to find\n"
            "// block inside of already allocated area.") in alloc
    assert "_cuda_ipc_collect" in inspect.getsource(torch.cuda.ipc_collect)
