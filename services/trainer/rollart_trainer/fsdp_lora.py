"""The FSDP2 backend of a LoRA job: :class:`LoraBackend`'s adapter on :class:`FSDP2Backend`'s sharding.

- peft injects the adapter before sharding, and ``rollart.base_hash`` (h(v0) of the full bf16 base) is taken
  before that, on every rank, from the whole base each rank loaded: the same digest as on one device.
- Each FSDP2 unit (a decoder layer, the root) holds frozen base and trainable adapter parameters side by side;
  only the adapter's are in the optimizer and have their gradients reduced. Base and adapter stay fp32 and
  sharded; compute is bf16 unless ``mixed_precision=False``.
- The KL reference is the same sharded network with the adapter disabled (no second copy).
- ``export``/``weight_set``/``model_state`` gather the adapter's whole tensors on every rank (a collective) and
  return them on rank 0 only, as the full-weight backend does; ``load_model_state`` checks the file on every
  rank, then scatters rank 0's tensors into the shards. Optimizer state is saved as ``FSDP2Backend`` saves it.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, distribute_tensor

from .fsdp import FSDP2Backend, init_distributed
from .grpo import GrpoSettings
from .lora import LoraSettings
from .lora_backend import LoraBackend
from .policy import Policy


class FSDP2LoraBackend(LoraBackend, FSDP2Backend):
    """:class:`LoraBackend` (adapter, frozen base, reference, export names) over :class:`FSDP2Backend` (sharding,
    work split, collectives, optimizer state)."""

    def __init__(
        self,
        policy: Policy,
        settings: GrpoSettings | None = None,
        *,
        lora: LoraSettings,
        seed: int = 0,
        mixed_precision: bool = True,
        reshard_after_forward: bool = True,
    ) -> None:
        if not dist.is_initialized():  # before peft changes the model
            raise RuntimeError(
                "FSDP2LoraBackend needs torch.distributed initialised (use init_distributed or from_pretrained)"
            )
        super().__init__(
            policy,
            settings,
            lora=lora,
            seed=seed,
            mixed_precision=mixed_precision,
            reshard_after_forward=reshard_after_forward,
        )

    @classmethod
    def from_pretrained(  # type: ignore[override]
        cls,
        path: Any,
        settings: GrpoSettings | None = None,
        device: str | torch.device | None = None,
        *,
        lora: LoraSettings,
        seed: int = 0,
        **kwargs: Any,
    ) -> FSDP2LoraBackend:
        dev = init_distributed(None if device is None else str(device))
        return cls(Policy.load(path, device=dev), settings, lora=lora, seed=seed, **kwargs)

    def _full_adapter(self) -> dict[str, torch.Tensor]:
        out: dict[str, torch.Tensor] = {}
        for name, t in sorted(self.adapter_tensors().items()):  # the same gathers in the same order everywhere
            full = self._full(t.detach())
            if self.is_writer:
                out[name] = full
        return out

    def _load_adapter_tensor(self, own: torch.Tensor, src: torch.Tensor) -> None:
        if isinstance(own, DTensor):  # a sharded view of the parameter (state_dict resharded it first)
            whole = src.to(self.policy.device, own.dtype)
            own.to_local().copy_(distribute_tensor(whole, own.device_mesh, own.placements).to_local())
        else:
            super()._load_adapter_tensor(own, src)
