"""GRPO on PyTorch: advantages, the clipped token-level loss, step statistics and the training backends.

Invariants: a group whose rewards are all equal gets advantage 0 exactly (its tokens still count in the
token denominator); with the default objective the step's loss is the mean over every agent token of the batch,
so gradient accumulation over micro-batches gives exactly the full-batch gradient; every other choice is a field
of :class:`~rollart_trainer.objective.ObjectiveSettings` whose default computes this loss by the same
floating-point operations. The formulas: docs/objective.md; batches and packing: :mod:`rollart_trainer.batches`;
the backends (``TorchBackend`` here, ``FSDP2Backend`` in :mod:`rollart_trainer.fsdp`) are picked by
:func:`rollart_trainer.backends.make_backend`.
"""

from __future__ import annotations

import copy
import logging
import math
import time
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import torch
from torch import nn

from rollart.delta import WeightSet

from . import objective as obj
from .batches import (  # noqa: F401 - re-exported: callers import them from grpo
    MicroBatch,
    Sample,
    TokenStream,
    TrainBatch,
    TurnTokens,
    build_micro_batch,
    flatten_sample,
    pack_first_fit,
    plan_micro_batches,
)
from .objective import ObjectiveSettings
from .policy import BF16, Policy
from .train_stats import StepStats

if TYPE_CHECKING:
    from transformers import PreTrainedModel

log = logging.getLogger(__name__)

# exp() of a log-ratio beyond this overflows nothing but carries no information either.
_MAX_LOG_RATIO = obj.MAX_LOG_RATIO


# ====================================================================================================
# Settings
# ====================================================================================================


GRPO_OPTIONS = (
    "temperature", "warmup_steps", "row_tokens", "clip_ratio_c", "adam_beta1", "adam_beta2", "advantage_eps",
    "pad_token_id",
)  # fmt: skip


@dataclass
class GrpoSettings:
    """GRPO hyper-parameters (the proto's ``GrpoConfig`` plus a few options)."""

    learning_rate: float = 1e-6
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    adam_eps: float = 1e-8
    warmup_steps: int = 0  # linear learning-rate warm-up over this many optimizer steps
    clip_eps_low: float = 0.2
    clip_eps_high: float = 0.2
    clip_ratio_c: float = 0.0  # dual-clip (option grpo.clip_ratio_c, > 1): a negative advantage's loss <= -c * A
    kl_coef: float = 0.0
    max_grad_norm: float = 1.0  # 0: no clipping (the norm is still measured)
    normalize_advantage_std: bool = True
    advantage_eps: float = 1e-6
    micro_batch_size: int = 0  # samples per micro-batch (0: the whole batch in one)
    epochs_per_batch: int = 1
    max_seq_len: int = 0  # 0: no truncation
    row_tokens: int = 0  # packed row capacity (0: the longest stream of the micro-batch)
    temperature: float = 1.0  # the actor's sampling temperature, if its logprobs are of logits / T
    pad_token_id: int = 0
    objective: ObjectiveSettings = field(default_factory=ObjectiveSettings)  # defaults: the loss above

    def __post_init__(self) -> None:
        if not (self.learning_rate > 0 and math.isfinite(self.learning_rate)):
            raise ValueError(f"learning_rate must be > 0, got {self.learning_rate}")
        if not (0 <= self.clip_eps_low < 1) or self.clip_eps_high < 0:
            raise ValueError("clip_eps_low must be in [0, 1) and clip_eps_high >= 0")
        if self.clip_ratio_c != 0 and not (1 < self.clip_ratio_c < math.inf):
            raise ValueError(f"grpo.clip_ratio_c must be > 1 (dual-clip) or 0 (off), got {self.clip_ratio_c}")
        if self.kl_coef < 0 or self.max_grad_norm < 0 or self.weight_decay < 0:
            raise ValueError("kl_coef, max_grad_norm and weight_decay must be >= 0")
        if self.micro_batch_size < 0 or self.epochs_per_batch < 1 or self.max_seq_len < 0 or self.row_tokens < 0:
            raise ValueError("micro_batch_size/max_seq_len/row_tokens must be >= 0, epochs_per_batch >= 1")
        if self.temperature <= 0:
            raise ValueError("temperature must be > 0")
        self.objective.check(self.max_seq_len)

    @classmethod
    def from_job_spec(cls, spec: Any) -> GrpoSettings:
        """From a ``rollart.v1.TrainerJobSpec`` (its ``grpo`` and ``options``)."""
        return cls.from_proto(spec.grpo, spec.options)

    @classmethod
    def from_proto(cls, grpo: Any, options: Mapping[str, str] | None = None) -> GrpoSettings:
        """From ``rollart.v1.GrpoConfig`` (zero fields take the defaults above, except ``max_grad_norm``,
        ``weight_decay`` and ``kl_coef`` whose 0 means none, and ``normalize_advantage_std`` taken as is)
        and the job spec's ``options`` (``grpo.temperature``, ``grpo.warmup_steps``, ``grpo.row_tokens``,
        ``grpo.clip_ratio_c``, ``grpo.adam_beta1``, ``grpo.adam_beta2``, ``grpo.advantage_eps``,
        ``grpo.pad_token_id``). The objective's fields: empty strings and zeros take the defaults of
        :class:`ObjectiveSettings` (the caps and bounds are ``optional``: unset takes the default, a value is
        checked as given)."""
        d = cls()
        opts = dict(options or {})
        for key in opts:  # a typo would otherwise be ignored silently
            if key.startswith("grpo.") and key.removeprefix("grpo.") not in GRPO_OPTIONS:
                raise ValueError(f"options[{key}] is not a grpo option (one of grpo.{', grpo.'.join(GRPO_OPTIONS)})")

        def opt(name: str, conv: Any, default: Any) -> Any:
            raw = opts.get(f"grpo.{name}")
            if raw is None or raw == "":
                return default
            try:
                return conv(raw)
            except ValueError:
                raise ValueError(f"option grpo.{name}={raw!r} is not a valid {conv.__name__}") from None

        return cls(
            learning_rate=grpo.learning_rate or d.learning_rate,
            weight_decay=grpo.weight_decay,
            betas=(opt("adam_beta1", float, d.betas[0]), opt("adam_beta2", float, d.betas[1])),
            warmup_steps=opt("warmup_steps", int, d.warmup_steps),
            clip_eps_low=grpo.clip_eps_low or d.clip_eps_low,
            clip_eps_high=grpo.clip_eps_high or d.clip_eps_high,
            clip_ratio_c=opt("clip_ratio_c", float, d.clip_ratio_c),
            kl_coef=grpo.kl_coef,
            max_grad_norm=grpo.max_grad_norm,
            normalize_advantage_std=grpo.normalize_advantage_std,
            advantage_eps=opt("advantage_eps", float, d.advantage_eps),
            micro_batch_size=grpo.micro_batch_size,
            epochs_per_batch=grpo.epochs_per_batch or 1,
            max_seq_len=grpo.max_seq_len,
            row_tokens=opt("row_tokens", int, d.row_tokens),
            temperature=opt("temperature", float, d.temperature),
            pad_token_id=opt("pad_token_id", int, d.pad_token_id),
            objective=objective_from_proto(grpo),
        )


def objective_from_proto(grpo: Any) -> ObjectiveSettings:
    """``rollart.v1.GrpoConfig``'s objective fields (11-26) as :class:`ObjectiveSettings` (unchecked)."""
    d = ObjectiveSettings()

    def has(name: str) -> bool:
        return bool(grpo.HasField(name))

    return ObjectiveSettings(
        loss_aggregation=grpo.loss_aggregation or d.loss_aggregation,
        aggregation_length=grpo.aggregation_length,
        ratio_level=grpo.ratio_level or d.ratio_level,
        entropy_coef=grpo.entropy_coef,
        advantage_estimator=grpo.advantage_estimator or d.advantage_estimator,
        overlong_buffer=grpo.overlong_buffer,
        overlong_max_tokens=grpo.overlong_max_tokens,
        overlong_penalty=grpo.overlong_penalty or d.overlong_penalty,
        correction=grpo.correction or d.correction,
        correction_level=grpo.correction_level or d.correction_level,
        is_cap=grpo.is_cap if has("is_cap") else None,
        mis_low=grpo.mis_low if has("mis_low") else d.mis_low,
        mis_high=grpo.mis_high if has("mis_high") else d.mis_high,
        proximal=grpo.proximal or d.proximal,
        dynamic_sampling=grpo.dynamic_sampling,
        max_groups_per_batch=grpo.max_groups_per_batch,
    )


# ====================================================================================================
# Advantages
# ====================================================================================================


def group_indices(group_ids: Sequence[str]) -> np.ndarray:
    """Dense group index per sample (first appearance order)."""
    index: dict[str, int] = {}
    return np.fromiter((index.setdefault(g, len(index)) for g in group_ids), dtype=np.int64, count=len(group_ids))


def group_advantages(
    rewards: torch.Tensor, groups: torch.Tensor, *, normalize_std: bool = True, eps: float = 1e-6
) -> torch.Tensor:
    """Per-sample GRPO advantages (see the module docstring); ``groups`` are dense indices."""
    rewards = rewards.to(torch.float64)
    n = int(groups.max()) + 1 if groups.numel() else 0
    count = torch.bincount(groups, minlength=n).to(torch.float64)
    mean = torch.zeros(n, dtype=torch.float64).index_add_(0, groups, rewards) / count.clamp(min=1)
    dev = rewards - mean[groups]
    hi = torch.full((n,), -math.inf, dtype=torch.float64).scatter_reduce(0, groups, rewards, "amax")
    lo = torch.full((n,), math.inf, dtype=torch.float64).scatter_reduce(0, groups, rewards, "amin")
    flat = hi == lo  # all rewards equal (singletons included): no preference inside the group
    if normalize_std:
        var = torch.zeros(n, dtype=torch.float64).index_add_(0, groups, dev * dev) / (count - 1).clamp(min=1)
        adv = dev / (var.sqrt()[groups] + eps)
    else:
        adv = dev
    return torch.where(flat[groups], torch.zeros_like(adv), adv)


# ====================================================================================================
# Loss
# ====================================================================================================


@dataclass
class TokenLoss:
    loss: torch.Tensor  # per token, differentiable: pg + kl_coef * kl
    pg: torch.Tensor  # per token policy-gradient term
    kl: torch.Tensor | None  # per token k3 to the reference (None without one)
    ratio: torch.Tensor  # per token importance ratio (detached)
    clipped: torch.Tensor  # bool per token: the clipped term was chosen (no gradient through the ratio)
    entropy: torch.Tensor | None = None  # per token entropy bonus term (before entropy_coef), when on


def k3_kl(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Schulman's k3 estimator of KL(π‖ref) per token sampled from π: exp(d) − d − 1 with d = ref − logp
    (unbiased, always ≥ 0)."""
    d = (ref_logp - logp).clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)
    return torch.expm1(d) - d


def grpo_token_loss(
    logp: torch.Tensor,
    behaviour_logp: torch.Tensor,
    advantages: torch.Tensor,
    *,
    clip_eps_low: float,
    clip_eps_high: float,
    ref_logp: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    old_logp: torch.Tensor | None = None,
    weight: torch.Tensor | None = None,
    sequence_index: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
    entropy_coef: float = 0.0,
    clip_ratio_c: float = 0.0,
) -> TokenLoss:
    """The clipped importance-ratio surrogate per token (PPO-style, asymmetric clip range).

    Without the optional arguments: today's loss, ratio against ``behaviour_logp``. ``old_logp``: the
    ratio is against it instead (the proximal policy of an off-policy correction); ``weight``: the
    policy-gradient term is multiplied by it (the correction's capped or masked weight, detached);
    ``sequence_index``: GSPO, one ratio per sample (the geometric mean of its token ratios; sample index per
    token), with the token-level gradient of GSPO-token; ``entropy`` with ``entropy_coef``: the bonus
    ``- entropy_coef * entropy`` (differentiable entropy); ``clip_ratio_c`` (> 1): dual-clip, a token with a
    negative advantage loses at most ``-clip_ratio_c * A`` (a ratio far above 1 on a bad sample, e.g. a stale
    one, no longer yields an unbounded step; counted as clipped)."""
    base = behaviour_logp if old_logp is None else old_logp
    if sequence_index is None:
        log_ratio = (logp - base).clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)
    else:
        lr = (logp.detach() - base).double()
        mean = obj.per_sample_sum(lr, sequence_index) / obj.per_sample_count(sequence_index).double()
        # value: the sample's mean log-ratio; gradient: the token's own logprob (GSPO-token).
        log_ratio = mean.clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO).to(logp.dtype) + (logp - logp.detach())
    ratio = torch.exp(log_ratio)
    unclipped = ratio * advantages
    clipped = ratio.clamp(1.0 - clip_eps_low, 1.0 + clip_eps_high) * advantages
    pg = -torch.minimum(unclipped, clipped)
    chose_clip = clipped < unclipped
    if clip_ratio_c:
        bound = -clip_ratio_c * advantages
        dual = (advantages < 0) & (pg > bound)
        pg = torch.where(dual, bound.to(pg.dtype), pg)
        chose_clip = chose_clip | dual
    if weight is not None:
        pg = pg * weight.to(pg.dtype)
    loss = pg
    kl = None
    if ref_logp is not None:
        kl = k3_kl(logp, ref_logp)
        if kl_coef:
            loss = pg + kl_coef * kl
    bonus = None
    if entropy is not None and entropy_coef:
        bonus = entropy
        loss = loss - entropy_coef * entropy
    return TokenLoss(loss, pg, kl, ratio.detach(), chose_clip.detach(), bonus)


# ====================================================================================================
# The network wrapper
# ====================================================================================================


class TokenLogprobs(nn.Module):
    """Logprob (and entropy) of chosen next tokens at chosen positions of packed rows.

    Runs the decoder on the rows, then ``lm_head`` only on the positions that predict an agent token, so
    the logits of environment tokens and padding are never materialised. Being a module of its own makes
    it the root that FSDP2 shards (its forward gathers the root-level parameters).
    """

    def __init__(self, lm: nn.Module) -> None:
        super().__init__()
        # A transformers causal LM: nn.Module's types know neither get_decoder nor get_output_embeddings.
        self.lm = cast("PreTrainedModel", lm)

    def forward(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        pred_rows: torch.Tensor,
        pred_cols: torch.Tensor,
        targets: torch.Tensor,
        temperature: float = 1.0,
        with_entropy: bool = True,
        entropy_grad: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        decoder = self.lm.get_decoder()
        hidden = decoder(input_ids=input_ids, position_ids=position_ids, use_cache=False).last_hidden_state
        h = hidden[pred_rows, pred_cols]
        logits = self.lm.get_output_embeddings()(h).float()
        if temperature != 1.0:
            logits = logits / temperature
        logz = torch.logsumexp(logits, dim=-1)
        logp = logits.gather(-1, targets[:, None]).squeeze(-1) - logz  # a new tensor, not a view
        entropy = None
        if with_entropy and entropy_grad:  # the entropy bonus: differentiable
            entropy = logz - (torch.softmax(logits, dim=-1) * logits).sum(-1)
        elif with_entropy:
            with torch.no_grad():
                probs = torch.softmax(logits, dim=-1)
                entropy = logz - (probs * logits).sum(-1)
        return logp, entropy


# ====================================================================================================
# Backends
# ====================================================================================================


class TrainBackend(ABC):
    """What the step driver uses: train on a batch, export bf16 weights, and checkpoint state."""

    settings: GrpoSettings

    @abstractmethod
    def train_step(self, batch: TrainBatch) -> StepStats:
        """One GRPO update (``epochs_per_batch`` optimizer steps) on the batch."""

    @abstractmethod
    def export(self, out: Mapping[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
        """HF name -> bf16 bit patterns (numpy ``uint16``) of the current weights."""

    def weight_set(self, version: int | None = None) -> WeightSet:
        arrays = self.export()
        return WeightSet(arrays, dict.fromkeys(arrays, BF16), version)

    @abstractmethod
    def model_state(self) -> dict[str, torch.Tensor]:
        """fp32 master weights on the CPU (HF names)."""

    @abstractmethod
    def load_model_state(self, tensors: Mapping[str, torch.Tensor]) -> None: ...

    @abstractmethod
    def optimizer_state(self) -> dict[str, Any]: ...

    @abstractmethod
    def load_optimizer_state(self, state: Mapping[str, Any]) -> None: ...

    @property
    def is_writer(self) -> bool:
        """True on the process that writes checkpoints and publishes (rank 0)."""
        return True


@dataclass
class PreparedBatch:
    streams: list[TokenStream]
    advantages: np.ndarray
    micro_batches: list[MicroBatch]
    loss_tokens: int
    stats: StepStats
    denominator: obj.Denominator | None = None  # the aggregation's (None: token-mean over loss_tokens)
    policy_version: int | None = None
    epoch: int = 0  # the epoch accumulate() runs
    proximal: dict[int, torch.Tensor] = field(default_factory=dict)  # micro-batch -> first-epoch logprobs


def _weighted_sum(x: torch.Tensor | None, factor: torch.Tensor | None, zero: torch.Tensor) -> torch.Tensor:
    if x is None:
        return zero
    return (x.detach() * factor).sum() if factor is not None else x.detach().sum()


# The sums accumulate() returns (float64): pg, kl, entropy, clipped, ratio, tokens, positions, behaviour k3,
# then the first epoch's weight sum, truncated and dropped tokens, this epoch's tokens and samples rejected
# out of the denominator, and the entropy bonus term.
_NSUMS = 14


class TorchBackend(TrainBackend):
    """Plain PyTorch on one device (CPU, or one GPU): fp32 master weights, AdamW, token-level GRPO."""

    def __init__(self, policy: Policy, settings: GrpoSettings | None = None) -> None:
        self.policy = policy
        self.settings = settings or GrpoSettings()
        self.device = policy.device
        ref = self._reference_copy()
        self.net: nn.Module = self._setup(TokenLogprobs(policy.model), trainable=True)
        self.reference: nn.Module | None = None if ref is None else self._setup(TokenLogprobs(ref), trainable=False)
        self.optimizer = self._make_optimizer(self._named_trainable())
        self.optimizer_steps = 0

    @classmethod
    def from_pretrained(
        cls, path: Any, settings: GrpoSettings | None = None, device: str | torch.device | None = "cpu"
    ) -> TorchBackend:
        return cls(Policy.load(path, device=device), settings)

    # ----------------------------------------------------------------------------------- set-up hooks

    def _reference_copy(self) -> nn.Module | None:
        """The KL reference: the policy as loaded (before any checkpoint is restored into it), a copy; None
        without a KL term. A LoRA backend has none: its reference is the base with the adapter disabled."""
        if self.settings.kl_coef <= 0:
            return None
        return copy.deepcopy(self.policy.model).eval().requires_grad_(False)

    def _setup(self, net: TokenLogprobs, trainable: bool) -> nn.Module:
        """Place a model for computation (the FSDP2 backend shards it here)."""
        return net

    def _named_trainable(self) -> list[tuple[str, nn.Parameter]]:
        seen: set[int] = set()
        out = []
        for name, p in sorted(self.policy.model.named_parameters(), key=lambda kv: kv[0]):
            if p.requires_grad and id(p) not in seen:
                seen.add(id(p))
                out.append((name, p))
        return out

    def _make_optimizer(self, named: list[tuple[str, nn.Parameter]]) -> torch.optim.Optimizer:
        s = self.settings
        decay = [p for _, p in named if p.ndim >= 2]  # matrices; norms and biases are not decayed
        rest = [p for _, p in named if p.ndim < 2]
        groups = [{"params": decay, "weight_decay": s.weight_decay}, {"params": rest, "weight_decay": 0.0}]
        return torch.optim.AdamW(groups, lr=s.learning_rate, betas=s.betas, eps=s.adam_eps)

    @property
    def parameters(self) -> list[nn.Parameter]:
        return [p for g in self.optimizer.param_groups for p in g["params"]]

    # Work split and collectives (overridden by the FSDP2 backend).
    def _my_samples(self, include: list[int], streams: list[TokenStream]) -> list[int]:
        return include

    def _micro_batch_count(self, local: int) -> int:
        return local

    def _before_micro_batch(self, index: int, count: int) -> None:
        pass

    def _all_reduce_sums(self, values: torch.Tensor, op: str = "sum") -> torch.Tensor:
        return values

    def _loss_scale(self) -> float:
        return 1.0

    def _dummy_micro_batch(self) -> MicroBatch:
        z = torch.zeros(1, 2, dtype=torch.int64)
        e = torch.zeros(0, dtype=torch.int64)
        return MicroBatch(z, torch.arange(2)[None], e, e, e, e.float(), e.float(), e, e)

    def _clip_grad_norm(self) -> torch.Tensor:
        max_norm = self.settings.max_grad_norm or math.inf
        return torch.nn.utils.clip_grad_norm_(self.parameters, max_norm)

    # -------------------------------------------------------------------------------------- training

    def prepare(self, batch: TrainBatch) -> PreparedBatch:
        """Advantages, token streams and this process's micro-batches; batch-level statistics."""
        s = self.settings
        if not batch.samples:
            raise ValueError("empty batch")
        streams = [flatten_sample(x, s.max_seq_len) for x in batch.samples]
        rewards = torch.tensor([x.reward for x in batch.samples], dtype=torch.float64)
        if not torch.isfinite(rewards).all():
            raise ValueError("a reward is not finite")
        gidx = torch.from_numpy(group_indices([x.group_id for x in batch.samples]))
        o = s.objective
        shaped = rewards
        penalty = None
        if o.overlong_buffer:
            lengths = torch.tensor([sum(len(t.action_ids) for t in x.turns) for x in batch.samples])
            penalty = obj.overlong_penalty(lengths, o.overlong_buffer, o.overlong_max_tokens, o.overlong_penalty)
            shaped = rewards + penalty
        if o.advantage_estimator == "rloo":
            adv_t = obj.rloo_advantages(shaped, gidx)
        else:
            adv_t = group_advantages(shaped, gidx, normalize_std=s.normalize_advantage_std, eps=s.advantage_eps)
        advantages = adv_t.numpy().astype(np.float32)
        n_loss = np.array([s_.loss_positions.size for s_ in streams], dtype=np.int64)
        loss_tokens = int(n_loss.sum())
        # Without a KL term or an entropy bonus a zero-advantage sample contributes exactly nothing: do not
        # forward it.
        extra_terms = s.kl_coef > 0 or o.entropy_coef > 0
        include = [i for i in range(len(streams)) if n_loss[i] > 0 and (extra_terms or advantages[i] != 0)]
        mine = self._my_samples(include, streams)
        mbs = plan_micro_batches(streams, advantages, mine, s.micro_batch_size, s.row_tokens, s.pad_token_id)
        has_signal = torch.zeros(int(gidx.max()) + 1, dtype=torch.bool).index_fill_(0, gidx[adv_t != 0], True)
        r = rewards.numpy()
        st = StepStats(
            loss_tokens=loss_tokens,
            samples=len(streams),
            groups=int(has_signal.numel()),
            zero_advantage_groups=int((~has_signal).sum()),
            reward_mean=float(r.mean()),
            reward_std=float(r.std()),
            reward_min=float(r.min()),
            reward_max=float(r.max()),
            advantage_abs_mean=float(np.abs(advantages).mean()),
            response_length_mean=float(sum(int(x.action.sum()) for x in streams) / len(streams)),
            overlong_penalty_mean=float(penalty.mean()) if penalty is not None else 0.0,
        )
        den = None if o.is_default_loss else obj.batch_denominator(o, n_loss.tolist(), s.max_seq_len)
        return PreparedBatch(streams, advantages, mbs, loss_tokens, st, den, batch.policy_version)

    def _lr_at(self, step: int) -> float:
        s = self.settings
        if s.warmup_steps > 0 and step < s.warmup_steps:
            return s.learning_rate * (step + 1) / s.warmup_steps
        return s.learning_rate

    def accumulate(self, prep: PreparedBatch, *, first_epoch: bool = True) -> dict[str, torch.Tensor]:
        """Forward and backward over the micro-batches (gradients add up in ``.grad``); returns sums.

        The gradient is of the loss over the batch's provisional denominator (``prep.denominator``, or every
        agent token); tokens an MIS correction rejects leave it, which :meth:`train_step` applies by rescaling
        the gradient once the whole batch was seen."""
        s = self.settings
        o = s.objective
        default = o.is_default_loss
        denom = float(max(prep.loss_tokens if prep.denominator is None else prep.denominator.total, 1))
        scale = self._loss_scale() / denom
        sums = torch.zeros(_NSUMS, dtype=torch.float64)
        lows = torch.tensor([math.inf, math.inf], dtype=torch.float64)  # PPO ratio, off-policy weight
        highs = torch.tensor([-math.inf, -math.inf], dtype=torch.float64)
        ent_kw = {"entropy_grad": True} if o.entropy_coef else {}
        count = self._micro_batch_count(len(prep.micro_batches))
        for k in range(count):
            self._before_micro_batch(k, count)
            real = k < len(prep.micro_batches)
            mb = (prep.micro_batches[k] if real else self._dummy_micro_batch()).to(self.device)
            positions = mb.num_positions if real else 0
            logp, ent = self.net(
                mb.input_ids, mb.position_ids, mb.pred_rows, mb.pred_cols, mb.targets, s.temperature, **ent_kw
            )
            ref_logp = None
            if self.reference is not None:
                with torch.no_grad():
                    ref_logp, _ = self.reference(
                        mb.input_ids, mb.position_ids, mb.pred_rows, mb.pred_cols, mb.targets, s.temperature, False
                    )
            extra: dict[str, Any] = {}
            off = None
            keep = None
            if o.correction != "none":
                prox = self._proximal(prep, k, mb, logp, first_epoch)
                off = obj.off_policy_weights(prox, mb.behaviour_logp, mb.sample_index, o)
                extra.update(old_logp=prox, weight=off.weight)
                if o.correction == "mis":
                    keep = ~off.rejected
            if o.ratio_level == "sequence":
                extra["sequence_index"] = mb.sample_index
            if o.entropy_coef:
                extra.update(entropy=ent, entropy_coef=o.entropy_coef)
            tl = grpo_token_loss(
                logp,
                mb.behaviour_logp,
                mb.advantages,
                clip_eps_low=s.clip_eps_low,
                clip_eps_high=s.clip_eps_high,
                ref_logp=ref_logp,
                kl_coef=s.kl_coef,
                clip_ratio_c=s.clip_ratio_c,
                **extra,
            )
            factor = None
            removed = (logp.new_zeros((), dtype=torch.float64), logp.new_zeros((), dtype=torch.float64))
            if not default:
                factor, *rest = obj.token_factors(o, mb.sample_index, keep)
                removed = (rest[0], rest[1])
            if factor is None:
                (tl.loss.sum() * scale).backward()
            else:
                ((tl.loss * factor).sum() * scale).backward()
            with torch.no_grad():
                n = tl.ratio.numel()
                zero = logp.new_zeros(())
                bkl = k3_kl(mb.behaviour_logp, logp.detach()).sum() if first_epoch else zero
                # The off-policy weight of the first epoch (no correction: the pre-update ratio itself).
                w = (off.ratio if off is not None else tl.ratio) if first_epoch else None
                sums += torch.stack(
                    [
                        _weighted_sum(tl.pg, factor, zero).double(),
                        _weighted_sum(tl.kl, factor, zero).double(),
                        (ent.detach().sum() if ent is not None else zero).double(),
                        tl.clipped.sum().double(),
                        tl.ratio.sum().double(),
                        logp.new_tensor(float(n), dtype=torch.float64),
                        logp.new_tensor(float(positions), dtype=torch.float64),
                        bkl.double(),
                        (w.sum() if w is not None else zero).double(),
                        (off.truncated.sum() if off is not None and first_epoch else zero).double(),
                        (off.masked.sum() if off is not None and first_epoch else zero).double(),
                        removed[0].double(),
                        removed[1].double(),
                        _weighted_sum(tl.entropy, factor, zero).double(),
                    ]
                ).cpu()
                if n:
                    lows[0] = min(lows[0], tl.ratio.min().double().cpu())
                    highs[0] = max(highs[0], tl.ratio.max().double().cpu())
                    if w is not None:
                        lows[1] = min(lows[1], w.min().double().cpu())
                        highs[1] = max(highs[1], w.max().double().cpu())
        sums = self._all_reduce_sums(sums)
        lows = self._all_reduce_sums(lows, "min")
        highs = self._all_reduce_sums(highs, "max")
        return {"sums": sums, "ratio_min": lows[0], "ratio_max": highs[0], "is_min": lows[1], "is_max": highs[1]}

    def _proximal(self, prep: PreparedBatch, k: int, mb: MicroBatch, logp: torch.Tensor, first: bool) -> torch.Tensor:
        """Proximal logprobs of micro-batch ``k``: the pre-update weights' (the first epoch's forward runs on
        them: no extra forward), or AReaL's log-linear interpolation by version."""
        o = self.settings.objective
        if o.proximal == "loglinear" and prep.policy_version is not None:
            v = float(prep.policy_version)
            cur = v + prep.epoch / self.settings.epochs_per_batch  # the weights after `epoch` of the updates
            return obj.loglinear_proximal(logp, mb.behaviour_logp, mb.versions, v, cur)
        if first or k not in prep.proximal:
            prep.proximal[k] = logp.detach().clone()
        return prep.proximal[k]

    def _scale_grads(self, factor: float) -> None:
        for p in self.parameters:
            if p.grad is not None:
                p.grad.mul_(factor)

    def train_step(self, batch: TrainBatch) -> StepStats:
        t0 = time.perf_counter()
        s = self.settings
        prep = self.prepare(batch)
        st = prep.stats
        st.micro_batches = len(prep.micro_batches)
        denom = float(max(prep.loss_tokens, 1))
        totals = torch.zeros(_NSUMS, dtype=torch.float64)
        rmin, rmax = math.inf, -math.inf
        trained = 0
        aggregated = 0.0, 0.0, 0.0  # pg, kl, entropy bonus over each epoch's final denominator (summed)
        for epoch in range(s.epochs_per_batch):
            self.optimizer.zero_grad(set_to_none=True)
            prep.epoch = epoch
            acc = self.accumulate(prep, first_epoch=epoch == 0)
            sums = acc["sums"]
            if sums.numel() < _NSUMS:  # a backend's own accumulate (Megatron's pipeline) sums the first 8
                sums = torch.cat([sums, torch.zeros(_NSUMS - sums.numel(), dtype=sums.dtype)])
            if epoch == 0:
                trained = int(sums[5])
                st.positions = int(sums[6])
                st.behaviour_kl = float(sums[7]) / max(trained, 1)
                st.mismatch_kl = st.behaviour_kl
                if trained:
                    st.is_ratio_mean = float(sums[8]) / trained
                    st.is_ratio_min = float(acc.get("is_min", acc["ratio_min"]))
                    st.is_ratio_max = float(acc.get("is_max", acc["ratio_max"]))
                st.is_truncated_fraction = float(sums[9]) / max(trained, 1)
                st.is_masked_fraction = float(sums[10]) / max(trained, 1)
            if prep.denominator is not None:
                provisional = float(max(prep.denominator.total, 1))
                kept = float(max(obj.kept_total(s.objective, prep.denominator, float(sums[11]), float(sums[12])), 1))
                if kept != provisional:  # MIS rejected tokens: they leave the denominator
                    self._scale_grads(provisional / kept)
                aggregated = (
                    aggregated[0] + float(sums[0]) / kept,
                    aggregated[1] + float(sums[1]) / kept,
                    aggregated[2] + float(sums[13]) / kept,
                )
            totals += sums
            rmin, rmax = min(rmin, float(acc["ratio_min"])), max(rmax, float(acc["ratio_max"]))
            lr = self._lr_at(self.optimizer_steps)
            for g in self.optimizer.param_groups:
                g["lr"] = lr
            gn = self._clip_grad_norm()
            st.grad_norm = float(gn)
            st.learning_rate = lr
            if math.isfinite(st.grad_norm) and trained > 0:
                self.optimizer.step()
                self.optimizer_steps += 1
                st.optimizer_steps += 1
            else:
                st.skipped_steps += 1
                if trained > 0:
                    log.warning("non-finite gradient norm %s: optimizer step skipped", st.grad_norm)
            self.optimizer.zero_grad(set_to_none=True)
        epochs = s.epochs_per_batch
        st.tokens_trained = trained
        if prep.denominator is None:
            st.pg_loss = float(totals[0]) / denom / epochs
            st.kl = float(totals[1]) / denom / epochs
            st.loss = st.pg_loss + s.kl_coef * st.kl
        else:
            st.pg_loss, st.kl = aggregated[0] / epochs, aggregated[1] / epochs
            st.loss = st.pg_loss + s.kl_coef * st.kl - s.objective.entropy_coef * aggregated[2] / epochs
        ntok = max(float(totals[5]), 1.0)
        st.entropy = float(totals[2]) / ntok
        st.clip_fraction = float(totals[3]) / ntok
        st.ratio_mean = float(totals[4]) / ntok if totals[5] else 1.0
        st.ratio_min = rmin if math.isfinite(rmin) else 1.0
        st.ratio_max = rmax if math.isfinite(rmax) else 1.0
        self._staleness(prep, batch.policy_version, st)
        st.train_seconds = time.perf_counter() - t0
        st.tokens_per_second = st.positions * epochs / max(st.train_seconds, 1e-9)
        return st

    @staticmethod
    def _staleness(prep: PreparedBatch, version: int | None, st: StepStats) -> None:
        if version is None:
            return
        vs = np.concatenate([x.versions[x.loss_positions] for x in prep.streams])
        vs = vs[vs >= 0]
        if vs.size:
            lag = version - vs
            st.staleness_mean = float(lag.mean())
            st.staleness_max = int(lag.max())

    # ------------------------------------------------------------------------------------ inference

    @torch.no_grad()
    def action_logprobs(self, samples: Sequence[Sample]) -> list[np.ndarray]:
        """Current-policy logprob of every predictable agent token of each sample (stream order)."""
        s = self.settings
        streams = [flatten_sample(x, s.max_seq_len) for x in samples]
        out = [np.zeros(x.loss_positions.size, dtype=np.float32) for x in streams]
        zeros = np.zeros(len(streams), dtype=np.float32)
        include = [i for i, x in enumerate(streams) if x.loss_positions.size]
        for mb in plan_micro_batches(streams, zeros, include, s.micro_batch_size, s.row_tokens, s.pad_token_id):
            d = mb.to(self.device)
            logp, _ = self.net(d.input_ids, d.position_ids, d.pred_rows, d.pred_cols, d.targets, s.temperature, False)
            logp = logp.float().cpu().numpy()
            sidx = mb.sample_index.numpy()
            for i in np.unique(sidx):  # tokens of one sample are contiguous and in order
                out[int(i)] = logp[sidx == i]
        return out

    # --------------------------------------------------------------------------------- export, state

    def export(self, out: Mapping[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
        return self.policy.export_bf16(out)

    def model_state(self) -> dict[str, torch.Tensor]:
        return self.policy.state_tensors()

    def load_model_state(self, tensors: Mapping[str, torch.Tensor]) -> None:
        self.policy.load_state_tensors(tensors)

    def optimizer_state(self) -> dict[str, Any]:
        return {"optimizer": self.optimizer.state_dict(), "optimizer_steps": self.optimizer_steps}

    def load_optimizer_state(self, state: Mapping[str, Any]) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.optimizer_steps = int(state.get("optimizer_steps", 0))
