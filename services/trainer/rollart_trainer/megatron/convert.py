"""Hugging Face <-> Megatron-core weight conversion for the Qwen3 family: exact, both ways, per tensor-parallel rank.

Only reshapes, slices and concatenations: no arithmetic touches a value, so any dtype (bf16 bit patterns
included) survives HF -> Megatron -> HF unchanged. The layouts Megatron's ``GPTModel`` (local layer spec) uses:

- ``self_attention.linear_qkv.weight``: q, k and v fused and **interleaved per query group**: for each of the
  ``ng`` KV groups, its ``heads/ng`` query heads, then its key head, then its value head (``head_dim`` rows
  each). Tensor parallelism splits the fused rows into ``tp`` contiguous blocks of whole groups.
- ``mlp.linear_fc1.weight``: SwiGLU's gate and up projections stacked, each rank holding its slice of gate
  then its slice of up (so the fused tensor of ``tp`` ranks is not one split of ``cat(gate, up)``).
- column-parallel (split rows): ``word_embeddings`` and ``output_layer`` (vocabulary); row-parallel (split
  columns): ``linear_proj`` (``o_proj``) and ``linear_fc2`` (``down_proj``); norms are replicated.

``lm_head.weight`` exists on either side only when the config does not tie embeddings.

Pipeline parallelism splits the model by stage (:func:`stage_layers`): stage ``s`` of ``pp`` holds decoder
layers ``s*L/pp .. (s+1)*L/pp - 1`` under local names (``decoder.layers.0`` is its first), the first stage the
word embeddings, the last the final norm and the output layer. A tied model split over stages keeps a copy of
the embeddings as the last stage's ``output_layer.weight`` (a rule with ``tied_copy``): it is loaded from
``model.embed_tokens.weight``, its gradient is summed with the embeddings' every step so both copies stay
equal, and it is never exported (the first stage's is).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

#: Hugging Face ``model_type`` values this converter knows.
KNOWN_MODEL_TYPES = ("qwen3",)


class UnsupportedModel(ValueError):
    """The config is not one the converter maps exactly (another architecture, or a Qwen3 variant it does not)."""


@dataclass(frozen=True)
class Qwen3Layout:
    """The shape facts of a Qwen3 config that the Megatron model and the converter need."""

    num_layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied: bool
    rope_theta: float
    norm_eps: float
    max_positions: int

    @classmethod
    def from_hf_config(cls, cfg: Mapping[str, Any] | Any) -> Qwen3Layout:
        """From a ``config.json`` dict or a transformers config. Raises :class:`UnsupportedModel`."""
        get: Callable[..., Any] = (
            (lambda k, d=None: cfg.get(k, d)) if isinstance(cfg, Mapping) else (lambda k, d=None: getattr(cfg, k, d))
        )
        model_type = get("model_type", "")
        if model_type not in KNOWN_MODEL_TYPES:
            raise UnsupportedModel(
                f"model_type {model_type!r} is not known to the Megatron converter"
                f" (known: {', '.join(KNOWN_MODEL_TYPES)})"
            )
        if get("attention_bias", False):
            raise UnsupportedModel("attention_bias=true is not supported (Qwen3 has no attention biases)")
        if get("hidden_act", "silu") != "silu":
            raise UnsupportedModel(f"hidden_act {get('hidden_act', '')!r}: only SwiGLU (silu) is supported")
        rope_scaling = get("rope_scaling", None)
        if rope_scaling and (rope_scaling.get("rope_type") or rope_scaling.get("type")) not in (None, "default"):
            raise UnsupportedModel(f"rope_scaling {rope_scaling!r} is not supported")
        theta = get("rope_theta", None)
        if theta is None:  # transformers 5 keeps it in rope_parameters
            theta = (get("rope_parameters", None) or {}).get("rope_theta", 10000.0)
        heads = int(get("num_attention_heads"))
        hidden = int(get("hidden_size"))
        return cls(
            num_layers=int(get("num_hidden_layers")),
            hidden=hidden,
            heads=heads,
            kv_heads=int(get("num_key_value_heads", heads) or heads),
            head_dim=int(get("head_dim", None) or hidden // heads),
            intermediate=int(get("intermediate_size")),
            vocab=int(get("vocab_size")),
            tied=bool(get("tie_word_embeddings", False)),
            rope_theta=float(theta),
            norm_eps=float(get("rms_norm_eps", 1e-6)),
            max_positions=int(get("max_position_embeddings", 4096)),
        )

    def parallel_errors(self, tp: int, pp: int) -> list[tuple[str, str]]:
        """(which size, why) for every way ``tp``/``pp`` cannot split this model; empty when they can."""
        out: list[tuple[str, str]] = []
        for what, n in (
            ("attention heads", self.heads),
            ("key/value heads", self.kv_heads),
            ("the vocabulary", self.vocab),
            ("intermediate_size", self.intermediate),
        ):
            if n % tp:
                out.append(("tensor_parallel_size", f"{what} ({n}) is not divisible by tensor_parallel_size {tp}"))
        if self.num_layers % pp:
            out.append(("pipeline_parallel_size", f"{self.num_layers} layers are not divisible by {pp} stages"))
        return out

    def stage_layers(self, pp: int, stage: int) -> range:
        """The global decoder layers of pipeline ``stage`` of ``pp`` (equal shares; see :meth:`parallel_errors`)."""
        if pp < 1 or not 0 <= stage < pp or self.num_layers % pp:
            raise ValueError(f"stage {stage} of {pp} does not split {self.num_layers} layers")
        per = self.num_layers // pp
        return range(stage * per, (stage + 1) * per)


# ----------------------------------------------------------------------------------------------- rules

REPLICATED, VOCAB, ROW, QKV, GATE_UP = "replicated", "vocab", "row", "qkv", "gate_up"


@dataclass(frozen=True)
class Rule:
    """One Megatron parameter and the Hugging Face tensors it holds (``kind`` says how)."""

    megatron: str
    hf: tuple[str, ...]
    kind: str
    #: The last stage's copy of tied embeddings: loaded, trained in step, never exported (the first stage's is).
    tied_copy: bool = False


def rules(layout: Qwen3Layout, pp: int = 1, stage: int = 0) -> list[Rule]:
    """Every parameter of pipeline ``stage`` of ``pp`` of the Megatron model, in a fixed order (Megatron names
    local to the stage, Hugging Face names global)."""
    first, last = stage == 0, stage == pp - 1
    out = []
    if first:
        out.append(Rule("embedding.word_embeddings.weight", ("model.embed_tokens.weight",), VOCAB))
    for local, i in enumerate(layout.stage_layers(pp, stage)):
        m, h = f"decoder.layers.{local}.", f"model.layers.{i}."
        out += [
            Rule(m + "input_layernorm.weight", (h + "input_layernorm.weight",), REPLICATED),
            Rule(
                m + "self_attention.linear_qkv.weight",
                tuple(f"{h}self_attn.{x}_proj.weight" for x in "qkv"),
                QKV,
            ),
            Rule(m + "self_attention.q_layernorm.weight", (h + "self_attn.q_norm.weight",), REPLICATED),
            Rule(m + "self_attention.k_layernorm.weight", (h + "self_attn.k_norm.weight",), REPLICATED),
            Rule(m + "self_attention.linear_proj.weight", (h + "self_attn.o_proj.weight",), ROW),
            Rule(m + "pre_mlp_layernorm.weight", (h + "post_attention_layernorm.weight",), REPLICATED),
            Rule(m + "mlp.linear_fc1.weight", (h + "mlp.gate_proj.weight", h + "mlp.up_proj.weight"), GATE_UP),
            Rule(m + "mlp.linear_fc2.weight", (h + "mlp.down_proj.weight",), ROW),
        ]
    if last:
        out.append(Rule("decoder.final_layernorm.weight", ("model.norm.weight",), REPLICATED))
        if not layout.tied:
            out.append(Rule("output_layer.weight", ("lm_head.weight",), VOCAB))
        elif not first:
            out.append(Rule("output_layer.weight", ("model.embed_tokens.weight",), VOCAB, tied_copy=True))
    return out


def hf_names(layout: Qwen3Layout) -> list[str]:
    """The Hugging Face names the model exports, sorted (what the torch backend's ``export`` returns)."""
    return sorted(n for r in rules(layout) for n in r.hf)


def hf_shapes(layout: Qwen3Layout) -> dict[str, tuple[int, ...]]:
    L, h, hd = layout, layout.hidden, layout.head_dim
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (L.vocab, h), "model.norm.weight": (h,)}
    if not L.tied:
        shapes["lm_head.weight"] = (L.vocab, h)
    for i in range(L.num_layers):
        p = f"model.layers.{i}."
        shapes.update(
            {
                p + "input_layernorm.weight": (h,),
                p + "post_attention_layernorm.weight": (h,),
                p + "self_attn.q_proj.weight": (L.heads * hd, h),
                p + "self_attn.k_proj.weight": (L.kv_heads * hd, h),
                p + "self_attn.v_proj.weight": (L.kv_heads * hd, h),
                p + "self_attn.o_proj.weight": (h, L.heads * hd),
                p + "self_attn.q_norm.weight": (hd,),
                p + "self_attn.k_norm.weight": (hd,),
                p + "mlp.gate_proj.weight": (L.intermediate, h),
                p + "mlp.up_proj.weight": (L.intermediate, h),
                p + "mlp.down_proj.weight": (h, L.intermediate),
            }
        )
    return shapes


# ------------------------------------------------------------------------------------------ one tensor


def to_megatron(layout: Qwen3Layout, rule: Rule, tensors: Sequence[torch.Tensor], tp: int, rank: int) -> torch.Tensor:
    """The shard of ``rule``'s Megatron parameter on tensor-parallel ``rank`` (a new contiguous tensor)."""
    if rule.kind == REPLICATED:
        return tensors[0].clone()
    if rule.kind == VOCAB:
        return tensors[0].chunk(tp, 0)[rank].clone()
    if rule.kind == ROW:
        return tensors[0].chunk(tp, 1)[rank].contiguous()
    if rule.kind == GATE_UP:
        gate, up = tensors
        return torch.cat([gate.chunk(tp, 0)[rank], up.chunk(tp, 0)[rank]], 0)
    if rule.kind == QKV:
        q, k, v = tensors
        ng, hd, cols = layout.kv_heads, layout.head_dim, q.shape[-1]
        per = layout.heads // ng
        fused = torch.cat([q.reshape(ng, per * hd, cols), k.reshape(ng, hd, cols), v.reshape(ng, hd, cols)], 1)
        return fused.reshape(ng * (per + 2) * hd, cols).chunk(tp, 0)[rank].clone()
    raise AssertionError(rule.kind)


def to_hf(layout: Qwen3Layout, rule: Rule, shards: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """The Hugging Face tensors of ``rule`` from its shards on every tensor-parallel rank (rank order)."""
    if rule.kind == REPLICATED:
        return [shards[0].clone()]
    if rule.kind == VOCAB:
        return [torch.cat(list(shards), 0)]
    if rule.kind == ROW:
        return [torch.cat(list(shards), 1)]
    if rule.kind == GATE_UP:
        halves = [s.chunk(2, 0) for s in shards]
        return [torch.cat([g for g, _ in halves], 0), torch.cat([u for _, u in halves], 0)]
    if rule.kind == QKV:
        ng, hd = layout.kv_heads, layout.head_dim
        per = layout.heads // ng
        full = torch.cat(list(shards), 0)
        cols = full.shape[-1]
        q, k, v = full.reshape(ng, (per + 2) * hd, cols).split([per * hd, hd, hd], 1)
        return [q.reshape(-1, cols).clone(), k.reshape(-1, cols).clone(), v.reshape(-1, cols).clone()]
    raise AssertionError(rule.kind)


# ------------------------------------------------------------------------------------------ whole models


def hf_to_megatron(
    layout: Qwen3Layout, hf: Mapping[str, torch.Tensor], tp: int = 1, rank: int = 0, pp: int = 1, stage: int = 0
) -> dict[str, torch.Tensor]:
    """Megatron name -> this rank's shard (tensor-parallel ``rank`` of pipeline ``stage``). ``hf`` must hold
    every exported name (extra names are refused, except ``lm_head.weight`` of a tied model, which some
    checkpoints still store)."""
    want = set(hf_names(layout))
    extra = set(hf) - want - ({"lm_head.weight"} if layout.tied else set())
    missing = want - set(hf)
    if missing or extra:
        raise UnsupportedModel(
            f"weights do not match the config: missing {sorted(missing)[:4]}, extra {sorted(extra)[:4]}"
        )
    return {r.megatron: to_megatron(layout, r, [hf[n] for n in r.hf], tp, rank) for r in rules(layout, pp, stage)}


def megatron_to_hf(
    layout: Qwen3Layout, shards: Sequence[Mapping[str, torch.Tensor]], pp: int = 1, stage: int = 0
) -> dict[str, torch.Tensor]:
    """HF name -> full tensor, from every tensor-parallel rank's Megatron tensors (rank order) of one pipeline
    stage (the tied copy is left out: the first stage's embeddings are the exported ones)."""
    out: dict[str, torch.Tensor] = {}
    for r in rules(layout, pp, stage):
        if not r.tied_copy:
            out.update(zip(r.hf, to_hf(layout, r, [s[r.megatron] for s in shards]), strict=True))
    return out


def stages_to_hf(
    layout: Qwen3Layout, stages: Sequence[Sequence[Mapping[str, torch.Tensor]]]
) -> dict[str, torch.Tensor]:
    """HF name -> full tensor, from every rank's Megatron tensors (``stages[stage][tensor-parallel rank]``)."""
    out: dict[str, torch.Tensor] = {}
    for stage, shards in enumerate(stages):
        out.update(megatron_to_hf(layout, shards, len(stages), stage))
    return out
