"""LoRA jobs: the ``spec.lora`` settings, StartJob's checks of them, and the model's layers they name
(docs/lora.md). The backends that train an adapter are ``lora_backend.py`` and ``fsdp_lora.py``.

A ``LoraConfig`` present on the spec makes the job a LoRA job: the policy is the base plus a peft adapter, only
the adapter (and ``trainable_modules``) is trained, and each published version is the adapter's tensors plus
``rollart.base_hash``. Absent, nothing here runs and a job trains its full weights as before.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rollart.job.spec import LORA_DEFAULT_TARGETS
from rollart.runtime import errors
from rollart.runtime import validation as v
from rollart.v1 import trainer_pb2 as T

#: The attention and MLP projections of Llama/Qwen-style decoders (the default ``target_modules``).
DEFAULT_TARGETS = LORA_DEFAULT_TARGETS
MAX_RANK = 256
MAX_ALPHA = 1e6
MAX_MODULES = 64
#: A module name or a dotted suffix of one (peft matches ``name == t`` or ``name.endswith("." + t)``).
MODULE_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z0-9_]+){0,15}$")
MAX_MODULE_CHARS = 128
#: The extra tensor of every published adapter version: h(v0) of the base's full weights (uint8[32]).
BASE_HASH = "rollart.base_hash"
#: Why a backend other than torch or fsdp2 cannot train an adapter (StartJob's and make_backend's refusal).
LORA_BACKENDS = (
    "LoRA trains on the torch and fsdp2 backends; megatron-core ships no LoRA/PEFT layers (NeMo and "
    "Megatron-Bridge add them), so the megatron backend trains full weights only"
)


@dataclass(frozen=True)
class LoraSettings:
    """``spec.lora`` with its defaults applied."""

    rank: int
    alpha: float
    dropout: float = 0.0
    target_modules: tuple[str, ...] = DEFAULT_TARGETS
    trainable_modules: tuple[str, ...] = ()

    @classmethod
    def from_proto(cls, cfg: T.LoraConfig) -> LoraSettings:
        return cls(
            rank=int(cfg.rank),
            alpha=float(cfg.alpha),
            dropout=float(cfg.dropout),
            target_modules=tuple(cfg.target_modules) or DEFAULT_TARGETS,
            trainable_modules=tuple(cfg.trainable_modules),
        )

    def peft_config(self) -> Any:
        """The ``peft.LoraConfig`` (lora_B starts at zero: the initial adapter leaves the base's outputs as
        they are)."""
        from peft import LoraConfig

        return LoraConfig(
            r=self.rank,
            lora_alpha=self.alpha,  # type: ignore[arg-type]  # typed int; peft and vLLM scale by alpha / r
            lora_dropout=self.dropout,
            target_modules=list(self.target_modules),
            modules_to_save=list(self.trainable_modules) or None,
            bias="none",
            task_type="CAUSAL_LM",
        )


def settings_of(spec: T.TrainerJobSpec) -> LoraSettings | None:
    """The job's LoRA settings, or None for a full-weight job."""
    return LoraSettings.from_proto(spec.lora) if spec.HasField("lora") else None


def _names(field: str, values: Any) -> list[str]:
    v.items(field, values, MAX_MODULES)
    seen: set[str] = set()
    for i, name in enumerate(values):
        where = f"{field}[{i}]"
        if len(name) > MAX_MODULE_CHARS or not MODULE_RE.match(name):
            raise errors.InvalidArgument(
                where, f"must be a module name such as q_proj or mlp.down_proj, got {errors.shorten(name)}"
            )
        if name in seen:
            raise errors.InvalidArgument(where, f"{name!r} is listed twice")
        seen.add(name)
    return list(values)


def check_lora(spec: T.TrainerJobSpec) -> None:
    """StartJob's check of ``spec.lora`` (nothing for a full-weight job): ``errors.InvalidArgument`` naming
    ``spec.lora.<field>`` for the first value that can never work."""
    if not spec.HasField("lora"):
        return
    p = "spec.lora."
    cfg = spec.lora
    v.integer(p + "rank", cfg.rank, 1, MAX_RANK)
    v.number(p + "alpha", cfg.alpha, 0.0, MAX_ALPHA, lo_open=True)
    v.number(p + "dropout", cfg.dropout, 0.0, 1.0, hi_open=True)
    targets = _names(p + "target_modules", cfg.target_modules) or list(DEFAULT_TARGETS)
    trainable = _names(p + "trainable_modules", cfg.trainable_modules)
    for i, name in enumerate(trainable):
        if name in targets:
            raise errors.InvalidArgument(
                f"{p}trainable_modules[{i}]", f"{name!r} already has an adapter (it is in target_modules)"
            )
    if spec.backend == T.TRAINER_BACKEND_MEGATRON:
        raise errors.InvalidArgument("spec.lora", f"{LORA_BACKENDS} (not TRAINER_BACKEND_MEGATRON)")
    model = Path(spec.model).expanduser()
    try:
        known = (model / "config.json").is_file()
    except OSError:
        known = False
    if known:  # a hub name is checked when it loads (peft names the missing modules)
        check_against_model(cfg, model)


def model_layers(model_dir: Path) -> tuple[dict[str, tuple[int, int]], set[str]]:
    """(linear layer name -> (in, out) features, every module name) of the checkpoint directory's model,
    built on the meta device from its ``config.json`` (no weights are read or allocated)."""
    import torch
    from torch import nn
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(str(model_dir), local_files_only=True)
    # The process's default dtype, not the config's: from_config sets torch's (process-wide) default dtype while
    # it builds, and a job training in another thread meanwhile would create its tensors in that dtype.
    with torch.device("meta"):  # thread-local: other threads keep allocating on their devices
        model = AutoModelForCausalLM.from_config(config, dtype=torch.get_default_dtype())
    linear = {n: (m.in_features, m.out_features) for n, m in model.named_modules() if isinstance(m, nn.Linear)}
    return linear, {n for n, _ in model.named_modules() if n}


def _matches(name: str, target: str) -> bool:
    return name == target or name.endswith("." + target)


def check_against_model(cfg: T.LoraConfig, model_dir: Path) -> None:
    """The module names exist in the model, and the rank fits every targeted layer."""
    p = "spec.lora."
    try:
        linear, modules = model_layers(model_dir)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise errors.InvalidArgument(
            "spec.model", f"config.json does not build a model: {errors.shorten(str(exc))}"
        ) from None
    targets = list(cfg.target_modules) or list(DEFAULT_TARGETS)
    field = p + "target_modules"
    smallest = (math.inf, "")
    for i, target in enumerate(targets):
        hit = [n for n in linear if _matches(n, target)]
        if not hit:
            where = f"{field}[{i}]" if cfg.target_modules else field
            known = sorted({n.rsplit(".", 1)[-1] for n in linear})
            raise errors.InvalidArgument(
                where, f"the model has no linear layer {target!r} (its linear layers: {', '.join(known)})"
            )
        for n in hit:
            smallest = min(smallest, (min(linear[n]), n))
    if cfg.rank > smallest[0]:
        raise errors.InvalidArgument(
            p + "rank", f"{cfg.rank} exceeds the smallest dimension ({smallest[0]}) of targeted layer {smallest[1]}"
        )
    for i, name in enumerate(cfg.trainable_modules):
        if not any(_matches(n, name) for n in modules):
            raise errors.InvalidArgument(f"{p}trainable_modules[{i}]", f"the model has no module {name!r}")
