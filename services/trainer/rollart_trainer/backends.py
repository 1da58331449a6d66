"""Choosing a training backend by name: the one place that knows every backend.

``grpo.py`` holds the shared GRPO code and the single-device ``TorchBackend``; ``fsdp.py`` builds the sharded
``FSDP2Backend`` on top of it and ``megatron/`` the Megatron-core one (imported only when asked for: megatron-core
is an optional extra). Picking between them lives here, above all, so none imports the others back.
"""

from __future__ import annotations

from typing import Any

from .fsdp import FSDP2Backend
from .grpo import GrpoSettings, TorchBackend, TrainBackend


def make_backend(
    kind: str, model_path: Any, settings: GrpoSettings | None = None, device: str | None = None, **kwargs: Any
) -> TrainBackend:
    """``kind``: "torch" (CPU or one GPU), "fsdp2" (torchrun; one GPU per rank) or "megatron" (Megatron-core;
    ``tensor_parallel_size``/``pipeline_parallel_size`` in ``kwargs``)."""
    kind = (kind or "torch").lower()
    if kind in ("torch", "trainer_backend_torch", "trainer_backend_unspecified"):
        return TorchBackend.from_pretrained(model_path, settings, device=device or "auto")
    if kind in ("fsdp2", "trainer_backend_fsdp2"):
        return FSDP2Backend.from_pretrained(model_path, settings, device=device, **kwargs)
    if kind in ("megatron", "trainer_backend_megatron"):
        from .megatron.backend import MegatronBackend

        return MegatronBackend.from_pretrained(model_path, settings, device=device, **kwargs)
    raise ValueError(f"unknown trainer backend {kind!r} (torch, fsdp2, megatron)")
