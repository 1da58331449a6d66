"""``backend: megatron``: the shared GRPO step on a Megatron-core ``GPTModel`` with tensor and pipeline parallelism.

The model is built from the checkpoint's ``config.json`` (:mod:`.model`) and loaded through the converter
(:mod:`.convert`); everything the rest of the trainer sees is in Hugging Face names and full tensors:

- ``train_step``, ``prepare``, ``accumulate``, ``action_logprobs`` are :class:`TorchBackend`'s (the same
  advantages, packing, loss and AdamW with weight decay on matrices only) running on
  :class:`.model.MegatronTokenLogprobs`;
- with pipeline parallelism (``pipeline_parallel_size > 1``) ``accumulate`` and ``action_logprobs`` run the
  same micro-batches through megatron-core's non-interleaved 1F1B schedule
  (``forward_backward_pipelining_without_interleaving``; p2p between stages, gloo on CPU): every stage runs
  its layers, the last computes the logprobs and the GRPO loss (a KL reference is one forward-only pass of
  the reference pipeline first), and the step's statistics are summed from the last stage to all. Tied
  embeddings over several stages are two parameters whose gradients are summed every step (so they stay
  equal);
- ``export`` (bf16 bit patterns), ``model_state`` and ``optimizer_state`` gather the tensor-parallel shards
  within each stage, convert them to HF names on the stage's first tensor-parallel rank and send them to rank 0
  (the writer), so the publisher emits deltas in the inference engine's naming exactly as for the torch
  backend, and checkpoints (:mod:`rollart_trainer.checkpoint`: atomic, resume after SIGKILL) hold the same
  names whatever the layout: a Megatron checkpoint resumes under any tensor and pipeline parallel sizes, and
  its optimizer moments are keyed by HF name;
- gradient clipping measures the global norm over the parameters once each (tensor-parallel shards summed,
  replicated norms counted once per stage, stages summed, the tied copy left out), as ``clip_grad_norm_``
  does on the whole model.

World layout: the default group's ranks are ``pipeline_parallel_size`` stages of ``tensor_parallel_size``
ranks (global rank = stage x tp + tensor-parallel rank; no data parallelism). Every rank is given the whole
batch (``share_batch``) and plans the same micro-batches.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from ..fsdp import init_distributed
from ..grpo import (
    GrpoSettings,
    MicroBatch,
    PreparedBatch,
    Sample,
    TorchBackend,
    TrainBatch,
    flatten_sample,
    grpo_token_loss,
    k3_kl,
    plan_micro_batches,
)
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


class SafetensorsDir(Mapping[str, torch.Tensor]):
    """Every tensor of a checkpoint's safetensors files by name, read (as stored, dtype kept) when asked for.

    Its keys are the files' headers; a pipeline stage reads only its own layers' tensors, so no rank holds the
    whole model in host memory while it loads.
    """

    def __init__(self, model_path: str | Path) -> None:
        from safetensors import safe_open

        files = sorted(Path(model_path).glob("*.safetensors"))
        if not files:
            raise FileNotFoundError(f"{model_path}: no *.safetensors files")
        self._file: dict[str, str] = {}
        for f in files:
            with safe_open(str(f), framework="pt") as fh:
                self._file.update(dict.fromkeys(fh.keys(), str(f)))

    def __getitem__(self, name: str) -> torch.Tensor:
        from safetensors import safe_open

        with safe_open(self._file[name], framework="pt") as fh:
            return fh.get_tensor(name)

    def __iter__(self) -> Iterator[str]:
        return iter(self._file)

    def __len__(self) -> int:
        return len(self._file)


def read_hf_tensors(model_path: str | Path) -> SafetensorsDir:
    """The checkpoint's tensors by name (each read from disk when it is looked up)."""
    return SafetensorsDir(model_path)


def init_model_parallel(tp: int, pp: int = 1, device: str | None = None) -> torch.device:
    """The default process group (torchrun's, else a world of one) split into ``pp`` stages of ``tp`` ranks."""
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
    """GRPO on Megatron-core (fp32 master weights; tensor and pipeline parallel over the default group's ranks)."""

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

        problems = layout.parallel_errors(tensor_parallel_size, pipeline_parallel_size)
        if problems:
            raise ValueError(": ".join(problems[0]))
        self.device = init_model_parallel(
            tensor_parallel_size, pipeline_parallel_size, None if device is None else str(device)
        )
        self.layout = layout
        self.tp = tensor_parallel_size
        self.tp_rank = parallel_state.get_tensor_model_parallel_rank()
        self.tp_group = parallel_state.get_tensor_model_parallel_group()
        self.pp = pipeline_parallel_size
        self.pp_rank = parallel_state.get_pipeline_model_parallel_rank()
        self.pp_group = parallel_state.get_pipeline_model_parallel_group()
        self.is_last_stage = self.pp_rank == self.pp - 1
        self.rank = dist.get_rank()
        self.settings = settings or GrpoSettings()
        self._rules = convert.rules(layout, self.pp, self.pp_rank)
        # First and last stage of this rank's pipeline (global ranks), for tied gradients and results.
        self._first_rank = dist.get_global_rank(self.pp_group, 0) if self.pp > 1 else self.rank
        self._last_rank = dist.get_global_rank(self.pp_group, self.pp - 1) if self.pp > 1 else self.rank

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
        shards = self._scatter_megatron(hf)
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
        # Device tensors: NCCL reduces only CUDA tensors (on CPU the device is the CPU).
        sharded = torch.zeros((), dtype=torch.float32, device=self.device)
        replicated = torch.zeros((), dtype=torch.float32, device=self.device)
        grads: list[torch.Tensor] = []
        for r in self._rules:
            g = self._params[r.megatron].grad
            if g is None:
                continue
            grads.append(g)  # the tied copy is clipped with the rest, but its norm is the embeddings'
            if r.tied_copy:
                continue
            sq = g.detach().float().pow(2).sum()
            if r.kind == convert.REPLICATED:
                replicated += sq
            else:
                sharded += sq
        if self.tp > 1:
            dist.all_reduce(sharded, group=self.tp_group)
        stage = sharded + replicated
        if self.pp > 1:
            dist.all_reduce(stage, group=self.pp_group)
        total = stage.sqrt().cpu()
        max_norm = self.settings.max_grad_norm or float("inf")
        coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
        if grads and float(coef) < 1.0:
            torch._foreach_mul_(grads, coef.to(grads[0].device))
        return total

    # ----------------------------------------------------------------------------- pipeline parallel

    def _pipeline(
        self,
        net: Any,
        micro_batches: list[MicroBatch],
        on_last: Any,
        *,
        forward_only: bool,
        with_entropy: bool = False,
    ) -> list[Any]:
        """Run ``micro_batches`` through the stages with megatron-core's 1F1B schedule.

        On the last stage ``on_last(k, mb, logp, entropy)`` gets micro-batch ``k``'s logprobs and returns
        ``(loss, tokens, result)``: the loss is backpropagated through every stage as it is (unless
        ``forward_only``); the results come back in micro-batch order on the last stage ([] elsewhere).
        """
        from megatron.core.pipeline_parallel.schedules import forward_backward_pipelining_without_interleaving

        s = self.settings

        def forward_step(data_iterator: Any, model: Any) -> tuple[torch.Tensor, Any]:
            k = next(data_iterator)
            mb = micro_batches[k].to(self.device)
            hidden = net.hidden_states(mb.input_ids, mb.position_ids)
            if not self.is_last_stage:
                return hidden, None  # sent on to the next stage; the schedule calls no loss function here
            logp, ent = net.logprobs(hidden, mb.pred_rows, mb.pred_cols, mb.targets, s.temperature, with_entropy)
            return logp, lambda out: on_last(k, mb, out, ent)

        first = micro_batches[0]
        return forward_backward_pipelining_without_interleaving(
            forward_step_func=forward_step,
            data_iterator=iter(range(len(micro_batches))),
            model=net.gpt,
            num_microbatches=len(micro_batches),
            # Only a first guess: shapes travel ahead of every tensor (variable_seq_lengths).
            seq_length=int(first.input_ids.shape[1]),
            micro_batch_size=int(first.input_ids.shape[0]),
            forward_only=forward_only,
        )

    def _from_last_stage(self, value: Any) -> Any:
        """The last stage's ``value`` on every stage of this rank's pipeline."""
        box = [value if self.is_last_stage else None]
        dist.broadcast_object_list(box, src=self._last_rank, group=self.pp_group)
        return box[0]

    def _reference_logprobs(self, micro_batches: list[MicroBatch]) -> list[torch.Tensor]:
        """The reference model's logprobs of every micro-batch (last stage; [] elsewhere)."""
        assert self.reference is not None
        with torch.no_grad():
            return self._pipeline(
                self.reference,
                micro_batches,
                lambda k, mb, logp, ent: (logp.sum(), torch.tensor(0, dtype=torch.int), logp.detach()),
                forward_only=True,
            )

    def _sync_tied_grads(self) -> None:
        """Sum the two copies' gradients of tied embeddings split over stages (first and last stage)."""
        if not (self.layout.tied and self.pp > 1) or self.rank not in (self._first_rank, self._last_rank):
            return
        from megatron.core import parallel_state

        name = "embedding.word_embeddings.weight" if self.pp_rank == 0 else "output_layer.weight"
        p = self._params[name]
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        dist.all_reduce(p.grad, group=parallel_state.get_embedding_group())

    def accumulate(self, prep: PreparedBatch, *, first_epoch: bool = True) -> dict[str, torch.Tensor]:
        """Forward and backward over the micro-batches (pipelined when ``pp > 1``); the step's sums on every rank."""
        if self.pp == 1:
            return super().accumulate(prep, first_epoch=first_epoch)
        s = self.settings
        scale = 1.0 / float(max(prep.loss_tokens, 1))
        sums = torch.zeros(8, dtype=torch.float64)  # pg, kl, entropy, clipped, ratio, tokens, positions, bkl
        extremes = torch.tensor([math.inf, math.inf], dtype=torch.float64)  # min ratio, -max ratio
        mbs = prep.micro_batches
        ref = self._reference_logprobs(mbs) if self.reference is not None and mbs else None

        def on_last(k: int, mb: MicroBatch, logp: torch.Tensor, ent: torch.Tensor | None) -> Any:
            nonlocal sums, extremes
            tl = grpo_token_loss(
                logp,
                mb.behaviour_logp,
                mb.advantages,
                clip_eps_low=s.clip_eps_low,
                clip_eps_high=s.clip_eps_high,
                ref_logp=None if ref is None else ref[k],
                kl_coef=s.kl_coef,
                clip_ratio_c=s.clip_ratio_c,
            )
            with torch.no_grad():
                n = tl.ratio.numel()
                zero = logp.new_zeros((), dtype=torch.float64)
                bkl = k3_kl(mb.behaviour_logp, logp.detach()).sum() if first_epoch else zero
                parts = [
                    tl.pg.detach().sum(),
                    tl.kl.sum() if tl.kl is not None else zero,
                    ent.sum() if ent is not None else zero,
                    tl.clipped.sum(),
                    tl.ratio.sum(),
                    zero + n,
                    zero + mb.num_positions,
                    bkl,
                ]
                sums += torch.stack([x.double() for x in parts]).cpu()
                if n:
                    extremes = torch.minimum(extremes, torch.stack([tl.ratio.min(), -tl.ratio.max()]).double().cpu())
            return tl.loss.sum() * scale, torch.tensor(n, dtype=torch.int), {}

        if mbs:  # the same plan on every rank: all run the schedule, or none
            self._pipeline(self.net, mbs, on_last, forward_only=False, with_entropy=True)
        self._sync_tied_grads()
        sums, extremes = self._from_last_stage((sums, extremes))
        return {"sums": sums, "ratio_min": extremes[0], "ratio_max": -extremes[1]}

    @torch.no_grad()
    def action_logprobs(self, samples: list[Sample]) -> list[np.ndarray]:  # type: ignore[override]
        if self.pp == 1:
            return super().action_logprobs(samples)
        s = self.settings
        streams = [flatten_sample(x, s.max_seq_len) for x in samples]
        out = [np.zeros(x.loss_positions.size, dtype=np.float32) for x in streams]
        include = [i for i, x in enumerate(streams) if x.loss_positions.size]
        zeros = np.zeros(len(streams), dtype=np.float32)
        mbs = plan_micro_batches(streams, zeros, include, s.micro_batch_size, s.row_tokens, s.pad_token_id)
        if mbs:
            results = self._pipeline(
                self.net,
                mbs,
                lambda k, mb, logp, ent: (logp.sum(), torch.tensor(0, dtype=torch.int), logp.float().cpu().numpy()),
                forward_only=True,
            )
            for mb, logp in zip(mbs, results if self.is_last_stage else [], strict=False):  # [] on the others
                sidx = mb.sample_index.numpy()
                for i in np.unique(sidx):  # tokens of one sample are contiguous and in order
                    out[int(i)] = logp[sidx == i]
        return self._from_last_stage(out)

    # ------------------------------------------------------------------------------- export and state

    def _gather_hf(self, tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Megatron name -> local shard, on every rank -> HF name -> full tensor on rank 0 (empty elsewhere).

        Collective: every rank calls it. Each stage's tensor-parallel shards are gathered on its first
        tensor-parallel rank, which sends the stage's HF tensors to rank 0 (the shapes are the config's)."""
        out: dict[str, torch.Tensor] = {}
        for r in self._rules:
            if r.tied_copy:
                continue
            local = tensors[r.megatron].detach().contiguous()
            if self.tp == 1 or r.kind == convert.REPLICATED:
                shards = [local]
            else:
                shards = [torch.empty_like(local) for _ in range(self.tp)]
                dist.all_gather(shards, local, group=self.tp_group)
            if self.tp_rank == 0:
                out.update(zip(r.hf, convert.to_hf(self.layout, r, [s.cpu() for s in shards]), strict=True))
        if self.pp == 1 or self.tp_rank != 0:
            return out if self.rank == 0 else {}
        if self.pp_rank != 0:
            for name in self._stage_hf_names(self.pp_rank):
                dist.send(out[name].to(self.device).contiguous(), dst=self._first_rank)
            return {}
        dtype = next(iter(out.values())).dtype
        shapes = convert.hf_shapes(self.layout)
        for stage in range(1, self.pp):
            src = dist.get_global_rank(self.pp_group, stage)
            for name in self._stage_hf_names(stage):
                buf = torch.empty(shapes[name], dtype=dtype, device=self.device)
                dist.recv(buf, src=src)
                out[name] = buf.cpu()
        return out

    def _stage_hf_names(self, stage: int) -> list[str]:
        """The HF tensors pipeline ``stage`` exports, in the order its rank sends them."""
        return [n for r in convert.rules(self.layout, self.pp, stage) if not r.tied_copy for n in r.hf]

    def _scatter_megatron(self, hf: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """HF name -> full tensor (on every rank) -> Megatron name -> this rank's shard of its stage."""
        return convert.hf_to_megatron(self.layout, hf, self.tp, self.tp_rank, self.pp, self.pp_rank)

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
        exp_avg = self._gather_hf(moments["exp_avg"])
        exp_avg_sq = self._gather_hf(moments["exp_avg_sq"])
        hf_steps = {hf: steps[r.megatron] for r in self._rules if not r.tied_copy for hf in r.hf}
        if self.pp > 1 and self.tp_rank == 0:  # every stage's step counts to rank 0
            if self.pp_rank != 0:
                dist.send_object_list([hf_steps], dst=self._first_rank, device=self.device)
            else:
                for stage in range(1, self.pp):
                    box: list[Any] = [None]
                    dist.recv_object_list(box, src=dist.get_global_rank(self.pp_group, stage), device=self.device)
                    hf_steps.update(box[0])
        return {
            "format": "megatron-hf-v1",
            "param_groups": [{k: v for k, v in g.items() if k != "params"} for g in sd["param_groups"]],
            "exp_avg": exp_avg,
            "exp_avg_sq": exp_avg_sq,
            "step": hf_steps,
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
