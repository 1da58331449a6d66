"""Choosing a training backend by name: the one place that knows every backend.

``grpo.py`` holds the shared GRPO code and the single-device ``TorchBackend``; ``fsdp.py`` builds the sharded
``FSDP2Backend`` on top of it and ``megatron/`` the Megatron-core one (imported only when asked for: megatron-core
is an optional extra). Picking between them lives here, above all, so none imports the others back.
"""

from __future__ import annotations

from typing import Any

from .fsdp import FSDP2Backend
from .grpo import GrpoSettings, TorchBackend, TrainBackend
from .lora import LORA_BACKENDS, LoraSettings


def make_backend(
    kind: str,
    model_path: Any,
    settings: GrpoSettings | None = None,
    device: str | None = None,
    *,
    lora: LoraSettings | None = None,
    seed: int = 0,
    **kwargs: Any,
) -> TrainBackend:
    """``kind``: "torch" (CPU or one GPU), "fsdp2" (torchrun; one GPU per rank) or "megatron" (Megatron-core;
    ``tensor_parallel_size``/``pipeline_parallel_size`` in ``kwargs``). ``lora``: train a LoRA adapter on the
    frozen model (torch or fsdp2; ``seed`` draws the adapter's initial lora_A)."""
    kind = (kind or "torch").lower()
    torch_kind = kind in ("torch", "trainer_backend_torch", "trainer_backend_unspecified")
    fsdp2_kind = kind in ("fsdp2", "trainer_backend_fsdp2")
    if lora is not None and torch_kind:
        from .lora_backend import LoraBackend

        return LoraBackend.from_pretrained(model_path, settings, device=device or "auto", lora=lora, seed=seed)
    if lora is not None and fsdp2_kind:
        from .fsdp_lora import FSDP2LoraBackend

        return FSDP2LoraBackend.from_pretrained(model_path, settings, device=device, lora=lora, seed=seed, **kwargs)
    if lora is not None:
        raise ValueError(f"spec.lora: {LORA_BACKENDS} (not {kind!r})")
    if torch_kind:
        return TorchBackend.from_pretrained(model_path, settings, device=device or "auto")
    if fsdp2_kind:
        return FSDP2Backend.from_pretrained(model_path, settings, device=device, **kwargs)
    if kind in ("megatron", "trainer_backend_megatron"):
        from .megatron.backend import MegatronBackend

        return MegatronBackend.from_pretrained(model_path, settings, device=device, **kwargs)
    raise ValueError(f"unknown trainer backend {kind!r} (torch, fsdp2, megatron)")
