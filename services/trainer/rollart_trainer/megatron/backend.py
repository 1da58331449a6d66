"""``backend: megatron``: the shared GRPO step on a Megatron-core ``GPTModel`` with tensor parallelism.

The model is built from the checkpoint's ``config.json`` (:mod:`.model`) and loaded through the converter
(:mod:`.convert`); everything the rest of the trainer sees is in Hugging Face names and full tensors:

- ``train_step``, ``prepare``, ``accumulate``, ``action_logprobs`` are :class:`TorchBackend`'s (the same
  advantages, packing, loss and AdamW with weight decay on matrices only) running on
  :class:`.model.MegatronTokenLogprobs`;
- ``export`` (bf16 bit patterns), ``model_state`` and ``optimizer_state`` gather the tensor-parallel shards and
  convert them to HF names on rank 0 (the writer), so the publisher emits deltas in the inference engine's
  naming exactly as for the torch backend, and checkpoints (:mod:`rollart_trainer.checkpoint`: atomic, resume
  after SIGKILL) hold the same names whatever the layout: a Megatron checkpoint resumes under any tensor
  parallel size, and its optimizer moments are keyed by HF name;
- gradient clipping measures the global norm over the sharded parameters once each (norms are replicated on
  every tensor-parallel rank and counted once), as ``clip_grad_norm_`` does on the whole model.

World layout: every rank of the default group is one tensor-parallel rank (the world size is the tensor
parallel size; no data parallelism). Every rank is given the whole batch (``share_batch``). Pipeline
parallelism (``pipeline_parallel_size > 1``) is not implemented: the validator refuses it at StartJob.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from ..fsdp import init_distributed
from ..grpo import GrpoSettings, TorchBackend, TrainBatch
from . import convert
from .convert import Qwen3Layout

log = logging.getLogger(__name__)


def megatron_available() -> bool:
    """True when megatron-core can be imported (the trainer's ``megatron`` extra)."""
    import importlib.util

    return importlib.util.find_spec("megatron.core") is not None


def read_layout(model_path: str | Path) -> Qwen3Layout:
    """The layout of a local checkpoint directory (raises ``UnsupportedModel``)."""
    return Qwen3Layout.from_hf_config(json.loads((Path(model_path) / "config.json").read_text()))


def read_hf_tensors(model_path: str | Path) -> dict[str, torch.Tensor]:
    """Every tensor of the checkpoint's safetensors files, as stored (dtype kept)."""
    from safetensors import safe_open

    files = sorted(Path(model_path).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{model_path}: no *.safetensors files")
    out: dict[str, torch.Tensor] = {}
    for f in files:
        with safe_open(str(f), framework="pt") as fh:
            for name in fh.keys():  # noqa: SIM118 (safe_open is not a mapping)
                out[name] = fh.get_tensor(name)
    return out


def init_model_parallel(tp: int, pp: int = 1, device: str | None = None) -> torch.device:
    """The default process group (torchrun's, else a world of one) split into ``tp`` tensor-parallel ranks."""
    from megatron.core import parallel_state

    from . import cpu_patches

    dev = init_distributed(device)
    if dev.type == "cpu":
        cpu_patches.apply()
    world = dist.get_world_size()
    if world != tp * pp:
        raise ValueError(f"tensor_parallel_size {tp} x pipeline_parallel_size {pp} must equal the {world} ranks")
    if parallel_state.model_parallel_is_initialized():
        current = (
            parallel_state.get_tensor_model_parallel_world_size(),
            parallel_state.get_pipeline_model_parallel_world_size(),
        )
        if current != (tp, pp):
            parallel_state.destroy_model_parallel()
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp)
        if dev.type == "cuda":
            # Attention runs its (p = 0) dropout under the tracker's "model-parallel-rng" state: it must exist.
            from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

            model_parallel_cuda_manual_seed(1234)
    return dev


class MegatronBackend(TorchBackend):
    """GRPO on Megatron-core (fp32 master weights; tensor parallel over the default group's ranks)."""

    def __init__(
        self,
        layout: Qwen3Layout,
        hf_tensors: Mapping[str, torch.Tensor],
        settings: GrpoSettings | None = None,
        *,
        device: torch.device | None = None,
        tensor_parallel_size: int = 1,
        pipeline_parallel_size: int = 1,
    ) -> None:
        from megatron.core import parallel_state

        from .model import MegatronTokenLogprobs, build_gpt_model

        if pipeline_parallel_size != 1:
            raise ValueError("pipeline_parallel_size > 1 is not implemented by the Megatron backend")
        problems = layout.parallel_errors(tensor_parallel_size, pipeline_parallel_size)
        if problems:
            raise ValueError(problems[0][1])
        self.device = init_model_parallel(
            tensor_parallel_size, pipeline_parallel_size, None if device is None else str(device)
        )
        self.layout = layout
        self.tp = tensor_parallel_size
        self.tp_rank = parallel_state.get_tensor_model_parallel_rank()
        self.tp_group = parallel_state.get_tensor_model_parallel_group()
        self.rank = dist.get_rank()
        self.settings = settings or GrpoSettings()
        self._rules = convert.rules(layout)

        def load(trainable: bool) -> nn.Module:
            gpt = build_gpt_model(layout).to(self.device)
            self._load_into(gpt, hf_tensors)
            gpt.eval()  # no dropout anywhere (behaviour logprobs come from an engine that never drops)
            if not trainable:
                gpt.requires_grad_(False)
            return gpt

        self.gpt = load(True)
        # The reference is the policy as loaded (before any checkpoint is restored into it).
        ref = load(False) if self.settings.kl_coef > 0 else None
        self.net = MegatronTokenLogprobs(self.gpt, layout)
        self.reference = None if ref is None else MegatronTokenLogprobs(ref, layout)
        self._params = dict(self.gpt.named_parameters())
        self.optimizer = self._make_optimizer(self._named_trainable())
        self.optimizer_steps = 0

    @classmethod
    def from_pretrained(
        cls,
        path: Any,
        settings: GrpoSettings | None = None,
        device: str | torch.device | None = None,
        *,
        tensor_parallel_size: int = 1,
        pipeline_parallel_size: int = 1,
    ) -> MegatronBackend:
        """From a local Hugging Face checkpoint directory (Qwen3 family)."""
        local = Path(path)
        if not (local / "config.json").is_file():
            raise FileNotFoundError(f"{local}: the Megatron backend needs a local checkpoint directory")
        dev = None if device in (None, "", "auto") else torch.device(str(device))
        return cls(
            read_layout(local),
            read_hf_tensors(local),
            settings,
            device=dev,
            tensor_parallel_size=tensor_parallel_size,
            pipeline_parallel_size=pipeline_parallel_size,
        )

    # ------------------------------------------------------------------------------------------ set-up

    def _load_into(self, gpt: nn.Module, hf: Mapping[str, torch.Tensor]) -> None:
        shards = convert.hf_to_megatron(self.layout, hf, self.tp, self.tp_rank)
        params = dict(gpt.named_parameters())
        if set(params) != set(shards):
            raise convert.UnsupportedModel(
                f"Megatron parameters differ from the converter's: {sorted(set(params) ^ set(shards))[:4]}"
            )
        with torch.no_grad():
            for name, p in params.items():
                src = shards[name]
                if tuple(src.shape) != tuple(p.shape):
                    raise convert.UnsupportedModel(f"{name}: converted shape {tuple(src.shape)} != {tuple(p.shape)}")
                p.copy_(src.to(p.device, p.dtype))

    def _named_trainable(self) -> list[tuple[str, nn.Parameter]]:
        return [(r.megatron, self._params[r.megatron]) for r in self._rules]

    @property
    def is_writer(self) -> bool:
        return self.rank == 0

    def share_batch(self, batch: TrainBatch | None) -> TrainBatch:
        """Rank 0's batch on every rank (the others pass None)."""
        box = [batch if self.rank == 0 else None]
        dist.broadcast_object_list(box, src=0)
        assert box[0] is not None
        return box[0]

    def _clip_grad_norm(self) -> torch.Tensor:
        """The global gradient norm of the full model (clipped like ``torch.nn.utils.clip_grad_norm_``)."""
        sharded = torch.zeros((), dtype=torch.float32)
        replicated = torch.zeros((), dtype=torch.float32)
        grads: list[torch.Tensor] = []
        for r in self._rules:
            g = self._params[r.megatron].grad
            if g is None:
                continue
            grads.append(g)
            sq = g.detach().float().pow(2).sum().cpu()
            if r.kind == convert.REPLICATED:
                replicated += sq
            else:
                sharded += sq
        if self.tp > 1:
            dist.all_reduce(sharded, group=self.tp_group)
        total = (sharded + replicated).sqrt()
        max_norm = self.settings.max_grad_norm or float("inf")
        coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
        if grads and float(coef) < 1.0:
            torch._foreach_mul_(grads, coef.to(grads[0].device))
        return total

    # ------------------------------------------------------------------------------- export and state

    def _gather_hf(self, tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Megatron name -> local shard, on every rank -> HF name -> full tensor on rank 0 (empty elsewhere)."""
        out: dict[str, torch.Tensor] = {}
        for r in self._rules:
            local = tensors[r.megatron].detach().contiguous()
            if self.tp == 1:
                shards = [local]
            elif r.kind == convert.REPLICATED:
                shards = [local]
            else:
                shards = [torch.empty_like(local) for _ in range(self.tp)]
                dist.all_gather(shards, local, group=self.tp_group)
            if self.rank == 0:
                out.update(zip(r.hf, convert.to_hf(self.layout, r, [s.cpu() for s in shards]), strict=True))
        return out

    def _scatter_megatron(self, hf: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """HF name -> full tensor (on every rank) -> Megatron name -> this rank's shard."""
        return convert.hf_to_megatron(self.layout, hf, self.tp, self.tp_rank)

    def export(self, out: Mapping[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
        result: dict[str, np.ndarray] = {}
        with torch.no_grad():
            full = self._gather_hf({n: p.to(torch.bfloat16) for n, p in self._params.items()})
            for name in sorted(full):
                arr = full[name].contiguous().view(torch.uint16).numpy()
                if out is not None:
                    np.copyto(out[name], arr)
                    arr = out[name]
                result[name] = arr
        return result

    def model_state(self) -> dict[str, torch.Tensor]:
        with torch.no_grad():
            return {n: t.float().contiguous() for n, t in sorted(self._gather_hf(self._params).items())}

    def load_model_state(self, tensors: Mapping[str, torch.Tensor]) -> None:
        """Load full HF tensors (every rank passes the checkpoint's; each keeps its shard)."""
        shards = self._scatter_megatron(tensors)
        with torch.no_grad():
            for name, p in self._params.items():
                p.copy_(shards[name].to(p.device, p.dtype))

    def optimizer_state(self) -> dict[str, Any]:
        """AdamW state with moments as full tensors keyed by HF name (layout-independent)."""
        sd = self.optimizer.state_dict()
        moments: dict[str, dict[str, torch.Tensor]] = {"exp_avg": {}, "exp_avg_sq": {}}
        steps: dict[str, float] = {}
        for name, p in self._params.items():
            st = self.optimizer.state.get(p, {})
            for key, d in moments.items():
                d[name] = st[key] if key in st else torch.zeros_like(p)
            steps[name] = float(st["step"]) if "step" in st else 0.0
        return {
            "format": "megatron-hf-v1",
            "param_groups": [{k: v for k, v in g.items() if k != "params"} for g in sd["param_groups"]],
            "exp_avg": self._gather_hf(moments["exp_avg"]),
            "exp_avg_sq": self._gather_hf(moments["exp_avg_sq"]),
            "step": {hf: steps[r.megatron] for r in self._rules for hf in r.hf},
            "optimizer_steps": self.optimizer_steps,
        }

    def load_optimizer_state(self, state: Mapping[str, Any]) -> None:
        if state.get("format") != "megatron-hf-v1":
            raise ValueError("not a Megatron backend optimizer state (checkpoints do not move between backends)")
        avg = self._scatter_megatron(state["exp_avg"])
        avg_sq = self._scatter_megatron(state["exp_avg_sq"])
        self.optimizer.state.clear()
        for r in self._rules:
            p = self._params[r.megatron]
            step = float(state["step"][r.hf[0]])
            if step == 0.0:
                continue
            self.optimizer.state[p] = {
                "step": torch.tensor(step, dtype=torch.float32),
                "exp_avg": avg[r.megatron].to(p.device, p.dtype).clone(),
                "exp_avg_sq": avg_sq[r.megatron].to(p.device, p.dtype).clone(),
            }
        for g, saved in zip(self.optimizer.param_groups, state["param_groups"], strict=True):
            g.update(saved)
        self.optimizer_steps = int(state.get("optimizer_steps", 0))
