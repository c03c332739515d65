"""The out-of-memory texts a user's program may print: data the classifier reads.

A program of the user's own (``workload.kind: command | megatron-deepspeed``) writes no
result file of autotune's, so its output (stdout and stderr, every rank as the launcher
collected it) is the only evidence of an out-of-memory failure. The foreign workloads
declare this table (:attr:`autotune.workloads.base.Workload.oom_signatures`) and
:func:`autotune.trial.classify.classify` looks for it.
"""

from __future__ import annotations

from autotune.trial.outcome import OomSignature

__all__ = ["OOM_SIGNATURES"]

OOM_SIGNATURES: tuple[OomSignature, ...] = (
    OomSignature("torch.OutOfMemoryError", "cuda/xpu",
                 "PyTorch's allocator error class (torch.OutOfMemoryError, raised by "
                 "TORCH_CHECK_WITH(OutOfMemoryError, ...) in the caching allocators)"),
    OomSignature("OutOfMemoryError", "cuda/xpu",
                 "the same class as a traceback prints it (torch.cuda.OutOfMemoryError)"),
    OomSignature("CUDA out of memory", "cuda",
                 "pytorch/pytorch c10/cuda/CUDACachingAllocator.cpp (commit eb42ad6e): "
                 "\"CUDA out of memory. Tried to allocate ...\""),
    OomSignature("CUBLAS_STATUS_ALLOC_FAILED", "cuda",
                 "cuBLAS cublasStatus_t: resource allocation failed inside cuBLAS "
                 "(cublasCreate when the device is full)"),
    OomSignature("XPU out of memory", "xpu",
                 "pytorch/pytorch c10/xpu/XPUCachingAllocator.cpp (commit 1e545826): "
                 "\"XPU out of memory. Tried to allocate ...\""),
    OomSignature("UR_RESULT_ERROR_OUT_OF_DEVICE_MEMORY", "xpu",
                 "oneAPI Unified Runtime ur_result_t (oneapi-src/unified-runtime "
                 "include/ur_api.h, commit aa04ce16): insufficient device memory"),
    OomSignature("UR_RESULT_ERROR_OUT_OF_RESOURCES", "xpu",
                 "oneAPI Unified Runtime ur_result_t (include/ur_api.h): out of resources"),
    OomSignature("PI_ERROR_OUT_OF_RESOURCES", "xpu",
                 "DPC++ plugin interface (PI) error of SYCL runtimes before Unified Runtime"),
    OomSignature("ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY", "xpu",
                 "Level Zero ze_result_t, as oneCCL reports a failed device allocation"),
    OomSignature("Cannot allocate memory", "host",
                 "strerror(ENOMEM), errno(3); PyTorch's CPU allocator prints it as "
                 "\"DefaultCPUAllocator: can't allocate memory ... Error code 12 (Cannot "
                 "allocate memory)\""),
    OomSignature("ENOMEM", "host", "errno(3) name of the host allocation failure"),
    OomSignature("MemoryError", "host", "Python's exception for a failed host allocation"),
    OomSignature("std::bad_alloc", "host", "C++ operator new failure (ISO C++ [new.delete])"),
)
"""Documented out-of-memory texts, with their source."""
