"""The policy: a Hugging Face causal LM held as fp32 master weights, exported as bf16 for publishing.

One code path for CPU and CUDA: the model is loaded from a local checkpoint directory (Qwen3, Llama and
other ``AutoModelForCausalLM`` architectures whose final hidden state goes straight into ``lm_head``),
cast to fp32 and moved to the device. Training updates the fp32 tensors; publishing exports their
round-to-nearest-even bf16 cast as raw bit patterns (numpy ``uint16``), keyed by the Hugging Face names
the checkpoint files use (tied weights once, under the name the checkpoint keeps), which is what
:class:`rollart.delta.WeightSet` and the weight publisher take.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from rollart.delta import WeightSet

log = logging.getLogger(__name__)

BF16 = "BF16"


def resolve_device(device: str | torch.device | None) -> torch.device:
    """``None``/"" / "auto" -> CUDA when available, else CPU; anything else as torch spells it."""
    if device is None or str(device) in ("", "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def unique_named_tensors(model: nn.Module) -> list[tuple[str, torch.Tensor]]:
    """The model's state (parameters and persistent buffers) with tied tensors once, in state-dict order.

    The first name of a tied group wins: for Qwen3/Llama with tied embeddings that is
    ``model.embed_tokens.weight``, the name ``save_pretrained`` keeps (``lm_head.weight`` is dropped).
    """
    seen: set[int] = set()
    out: list[tuple[str, torch.Tensor]] = []
    for name, t in model.state_dict(keep_vars=True).items():
        key = id(t)
        if key in seen:
            continue
        seen.add(key)
        out.append((name, t))
    return out


def bf16_bits(t: torch.Tensor) -> np.ndarray:
    """A tensor's round-to-nearest-even bf16 cast as a C-contiguous ``uint16`` numpy array (host memory).

    On CPU the cast result is viewed, not copied; on CUDA the cast happens on the device and the result
    is copied to the host once.
    """
    b = t.detach().to(torch.bfloat16)
    if b.device.type != "cpu":
        b = b.cpu()
    return b.contiguous().view(torch.uint16).numpy()


@dataclass
class Policy:
    """A causal LM with fp32 master weights on one device, and its export names."""

    model: nn.Module
    device: torch.device
    source: Path | None = None

    @classmethod
    def load(
        cls,
        path: str | os.PathLike[str],
        *,
        device: str | torch.device | None = "cpu",
        attn_implementation: str = "sdpa",
        dtype: torch.dtype = torch.float32,
    ) -> Policy:
        """Load a Hugging Face checkpoint as fp32 master weights.

        ``path``: a local checkpoint directory (read without any hub access), or a hub model name
        resolved by transformers (its cache; honours ``HF_HUB_OFFLINE``).
        """
        from transformers import AutoModelForCausalLM
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # a service logs, it draws no progress bars

        local = Path(path)
        if local.exists() and not (local / "config.json").is_file():
            raise FileNotFoundError(f"{local}: not a Hugging Face checkpoint directory (no config.json)")
        dev = resolve_device(device)
        model = AutoModelForCausalLM.from_pretrained(
            str(path), dtype=dtype, attn_implementation=attn_implementation, local_files_only=local.exists()
        )
        model.to(dev)
        # RL trains without dropout: behaviour logprobs come from an engine that never drops.
        model.eval()
        model.config.use_cache = False
        return cls(model, dev, local if local.exists() else None)

    # ------------------------------------------------------------------------------------------- names

    def named_tensors(self) -> list[tuple[str, torch.Tensor]]:
        """Exported tensors (HF names, sorted like a safetensors file's reader returns them)."""
        return sorted(unique_named_tensors(self.model), key=lambda kv: kv[0])

    def names(self) -> list[str]:
        return [n for n, _ in self.named_tensors()]

    @property
    def num_parameters(self) -> int:
        return sum(t.numel() for _, t in unique_named_tensors(self.model))

    # ------------------------------------------------------------------------------------------ export

    def export_bf16(self, out: Mapping[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
        """HF name -> bf16 bit patterns (``uint16``, the tensor's shape).

        Without ``out`` each array is the cast's own buffer (one allocation per tensor, no further
        copy). With ``out`` (arrays of the right shapes, e.g. a previous export) the cast is written
        into them in place; callers that reuse buffers must not hand them to anyone who reads them
        concurrently (the publisher snapshots what it is given, so a fresh export is the safe default).
        """
        result: dict[str, np.ndarray] = {}
        with torch.no_grad():
            for name, t in self.named_tensors():
                if out is None:
                    result[name] = bf16_bits(t)
                    continue
                dst = out[name]
                if dst.dtype != np.uint16 or tuple(dst.shape) != tuple(t.shape) or not dst.flags.c_contiguous:
                    raise ValueError(f"{name}: out buffer is {dst.dtype}{dst.shape}, need uint16{tuple(t.shape)}")
                view = torch.from_numpy(dst).view(torch.bfloat16)
                if t.device.type == "cpu":
                    view.copy_(t.detach())  # the same round-to-nearest-even kernel as .to(bfloat16)
                else:
                    view.copy_(t.detach().to(torch.bfloat16))
                result[name] = dst
        return result

    def weight_set(self, version: int | None = None) -> WeightSet:
        """The bf16 export as a :class:`rollart.delta.WeightSet` (what the publisher takes)."""
        arrays = self.export_bf16()
        return WeightSet(arrays, dict.fromkeys(arrays, BF16), version)

    # --------------------------------------------------------------------------------- master weights

    def state_tensors(self) -> dict[str, torch.Tensor]:
        """fp32 master weights on the CPU (HF names, tied once): what a training checkpoint stores."""
        return {n: t.detach().to("cpu", copy=True).contiguous() for n, t in self.named_tensors()}

    def load_state_tensors(self, tensors: Mapping[str, torch.Tensor]) -> None:
        """Overwrite the master weights in place (names must match exactly)."""
        own = dict(self.named_tensors())
        missing, extra = set(own) - set(tensors), set(tensors) - set(own)
        if missing or extra:
            raise ValueError(
                f"weights do not match the model: missing {sorted(missing)[:5]}, extra {sorted(extra)[:5]}"
            )
        with torch.no_grad():
            for name, t in own.items():
                src = tensors[name]
                if tuple(src.shape) != tuple(t.shape):
                    raise ValueError(f"{name}: shape {tuple(src.shape)} != {tuple(t.shape)}")
                t.copy_(src.to(t.device, t.dtype))
