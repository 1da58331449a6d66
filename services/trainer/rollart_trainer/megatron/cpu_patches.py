"""The CUDA calls Megatron-core makes unconditionally, patched for CPU training (every patch is here).

Megatron-core is written for GPUs. On a machine without CUDA a few of its code paths call CUDA functions that
raise "Torch not compiled with CUDA enabled" even though nothing needs a GPU. :func:`apply` replaces exactly
those, and only when CUDA is not available (on a GPU machine it does nothing). Each patch says why.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

_applied = False


def apply() -> bool:
    """Patch Megatron-core for CPU-only training (idempotent). Returns True when patches are in force."""
    global _applied
    if torch.cuda.is_available():
        return False
    if _applied:
        return True
    from megatron.core.tensor_parallel import random as mrandom

    # 1. ``torch.cuda.current_device()`` initialises CUDA and raises without it. Megatron calls it only to
    #    say where to allocate (``device=torch.cuda.current_device()``: the attention score buffer of
    #    ``GlobalMemoryBuffer``, the RoPE frequencies, parallel_state's small collectives); on a CPU-only
    #    machine the answer is the CPU.
    torch.cuda.current_device = lambda: torch.device("cpu")  # type: ignore[assignment, return-value]  # typed int

    # 2. The CUDA RNG tracker's ``fork()`` swaps the *CUDA* generator's state around every tensor-parallel
    #    region (dropout and weight initialisation inside column/row-parallel layers). On CPU there is no
    #    CUDA generator; dropout is 0 in RL training and weights are loaded, not initialised, so running the
    #    region under the CPU generator unchanged is equivalent.
    @contextlib.contextmanager
    def _fork(self: Any, name: str = mrandom._MODEL_PARALLEL_RNG_TRACKER_NAME) -> Iterator[None]:
        yield

    mrandom.CudaRNGStatesTracker.fork = _fork

    # 3. ``CudaRNGStatesTracker.add`` seeds a CUDA generator (``torch.cuda.manual_seed``) when
    #    ``model_parallel_cuda_manual_seed`` sets up the tracker; with (2) nothing reads those states.
    mrandom.CudaRNGStatesTracker.add = lambda self, name, seed: self.states_.__setitem__(name, seed)

    # 4. Pipeline p2p (``P2PCommunicator._communicate_shapes``) calls ``torch.cuda.synchronize()`` after every
    #    exchange of tensor shapes, against a race of NCCL's batched sends. Gloo's isend/irecv requests were
    #    already waited on, and there is no CUDA stream to wait for.
    torch.cuda.synchronize = lambda device=None: None

    # 5. The pipeline schedules count tokens in ``torch.zeros([], device="cuda")``. The schedules module alone
    #    sees a ``torch`` whose ``zeros`` puts a "cuda" tensor on the CPU (nothing else in it changes).
    from megatron.core.pipeline_parallel import schedules

    schedules.torch = _TorchWithCpuZeros()
    _applied = True
    return True


class _TorchWithCpuZeros:
    """``torch`` for :mod:`megatron.core.pipeline_parallel.schedules` on CPU (patch 5)."""

    def __getattr__(self, name: str) -> Any:
        return getattr(torch, name)

    @staticmethod
    def zeros(*args: Any, device: Any = None, **kwargs: Any) -> torch.Tensor:
        if device is not None and str(device).startswith("cuda"):
            device = "cpu"
        return torch.zeros(*args, device=device, **kwargs)
