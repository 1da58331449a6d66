"""The torch backend of a LoRA job (docs/lora.md): the policy wrapped by peft, only the adapter (and the modules
trained in full) in the optimizer, the base frozen.

- The KL reference is the same network with the adapter disabled (``PeftModel.disable_adapter``): the base as
  loaded, with no second copy of the model in memory.
- A version (``export``/``weight_set``) is the adapter's tensors as peft's ``get_peft_model_state_dict`` names
  them, fp32 as trained, plus ``rollart.base_hash`` (uint8[32]): h(v0) of the base's full bf16 weights, the
  digest a full-weight job's version 0 has. Every version's hash covers it, so each adapter version is bound to
  its base and chained to the previous version by the weight plane's hash chain.
- A training checkpoint's model state is the same tensor set (the base is not saved); restoring it onto another
  base is refused.
- The adapter starts with lora_B = 0 (the policy of version 0 is the base) and lora_A drawn from a generator
  seeded with the job's seed, so a trainer restarted before its first checkpoint republishes the same v0.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from torch import nn

from rollart.delta import WeightSet
from rollart.delta.identity import weights_digest

from .grpo import GrpoSettings, TorchBackend
from .lora import BASE_HASH, LoraSettings
from .policy import BF16, Policy

F32, U8 = "F32", "U8"


class AdapterDisabled(nn.Module):
    """Runs the policy's network with the adapter switched off: the base model, for the KL term."""

    def __init__(self, net: nn.Module, peft_model: Any) -> None:
        super().__init__()
        self._parts = (net, peft_model)  # a tuple: not registered as submodules (no parameter listed twice)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        net, peft_model = self._parts
        with peft_model.disable_adapter():
            return net(*args, **kwargs)


class LoraBackend(TorchBackend):
    """:class:`TorchBackend` training a peft LoRA adapter on a frozen base."""

    def __init__(
        self,
        policy: Policy,
        settings: GrpoSettings | None = None,
        *,
        lora: LoraSettings,
        seed: int = 0,
        **backend_kwargs: Any,
    ) -> None:
        """``backend_kwargs`` go to the next backend's ``__init__`` (the FSDP2 one's options in
        ``fsdp_lora.py``)."""
        from peft import get_peft_model

        self.lora = lora
        base = policy.export_bf16()  # h(v0) of the base, before the adapter changes the module names
        self.base_hash = weights_digest(base, dict.fromkeys(base, BF16))
        del base
        devices = [policy.device.index or 0] if policy.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(seed)
            self.peft = get_peft_model(policy.model, lora.peft_config())  # injects the adapter in place
        policy.model.eval()
        super().__init__(policy, settings, **backend_kwargs)  # FSDP2 shards here: after the adapter is in
        if self.settings.kl_coef > 0:
            self.reference = AdapterDisabled(self.net, self.peft)
        modules = policy.model.named_modules()
        self._dropouts = [m for n, m in modules if ".lora_dropout." in n and isinstance(m, nn.Dropout)]

    @classmethod
    def from_pretrained(  # type: ignore[override]
        cls,
        path: Any,
        settings: GrpoSettings | None = None,
        device: str | torch.device | None = "cpu",
        *,
        lora: LoraSettings,
        seed: int = 0,
    ) -> LoraBackend:
        return cls(Policy.load(path, device=device), settings, lora=lora, seed=seed)

    def _reference_copy(self) -> nn.Module | None:
        return None  # the reference is the base with the adapter disabled (set in __init__)

    # -------------------------------------------------------------------------------------- training

    def train_step(self, batch: Any) -> Any:
        """One update; the adapter's dropout (if any) is active during it, never when generating logprobs
        for anything else."""
        for m in self._dropouts:
            m.train()
        try:
            return super().train_step(batch)
        finally:
            for m in self._dropouts:
                m.eval()

    # --------------------------------------------------------------------------------- export, state

    def adapter_tensors(self) -> dict[str, torch.Tensor]:
        """The adapter (and fully trained modules) as peft names them (views of the live parameters)."""
        from peft import get_peft_model_state_dict

        return dict(get_peft_model_state_dict(self.peft))

    def _full_adapter(self) -> dict[str, torch.Tensor]:
        """The adapter's whole tensors on the writer rank ({} on the others; the FSDP2 backend gathers its
        shards here, a collective every rank calls)."""
        return self.adapter_tensors()

    def _load_adapter_tensor(self, own: torch.Tensor, src: torch.Tensor) -> None:
        """Copy a whole saved tensor into the live one (the FSDP2 backend keeps this rank's shard of it)."""
        own.copy_(src.to(own.device, own.dtype))

    def export(self, out: Mapping[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
        """The adapter tensors (fp32 numpy, fresh buffers; ``out`` is not used) and ``rollart.base_hash``;
        {} on a rank that is not the writer."""
        with torch.no_grad():
            full = self._full_adapter()
            if not self.is_writer:
                return {}
            arrays = {
                n: t.detach().to("cpu", torch.float32, copy=True).contiguous().numpy() for n, t in sorted(full.items())
            }
        arrays[BASE_HASH] = np.frombuffer(self.base_hash, dtype=np.uint8).copy()
        return arrays

    def weight_set(self, version: int | None = None) -> WeightSet:
        arrays = self.export()
        dtypes = {n: (U8 if n == BASE_HASH else F32) for n in arrays}
        return WeightSet(arrays, dtypes, version)

    def model_state(self) -> dict[str, torch.Tensor]:
        """What a training checkpoint holds: the adapter tensors and the base's hash (not the base); {} on a
        rank that is not the writer."""
        with torch.no_grad():
            full = self._full_adapter()
        if not self.is_writer:
            return {}
        out = {n: t.detach().to("cpu", copy=True).contiguous() for n, t in full.items()}
        out[BASE_HASH] = torch.frombuffer(bytearray(self.base_hash), dtype=torch.uint8)
        return out

    def load_model_state(self, tensors: Mapping[str, torch.Tensor]) -> None:
        """Restore an adapter saved by :meth:`model_state` onto this base (the names, shapes and base hash must
        match; every rank checks the same file, so all refuse or none does)."""
        own = self.adapter_tensors()
        missing = (set(own) | {BASE_HASH}) - set(tensors)
        extra = set(tensors) - set(own) - {BASE_HASH}
        if missing or extra:
            raise ValueError(
                f"the checkpoint is not this job's adapter: missing {sorted(missing)[:5]}, extra {sorted(extra)[:5]}"
            )
        saved = bytes(tensors[BASE_HASH].to(torch.uint8).contiguous().numpy().tobytes())
        if saved != self.base_hash:
            raise ValueError(
                f"the checkpoint's adapter was trained on base {saved.hex()[:16]}…, this base is "
                f"{self.base_hash.hex()[:16]}…"
            )
        with torch.no_grad():
            for name, t in own.items():
                src = tensors[name]
                if tuple(src.shape) != tuple(t.shape):
                    raise ValueError(f"{name}: shape {tuple(src.shape)} != {tuple(t.shape)}")
            for name, t in sorted(own.items()):  # one order on every rank (FSDP2 scatters: a collective)
                self._load_adapter_tensor(t, tensors[name])
