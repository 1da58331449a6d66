"""The training objective's choices beyond today's GRPO loss: aggregation, GSPO, entropy bonus, off-policy
correction, RLOO and the overlong penalty (docs/objective.md).

Every choice is a field of :class:`ObjectiveSettings` whose default is the loss :mod:`rollart_trainer.grpo`
computed before these existed; :mod:`~rollart_trainer.grpo` calls the functions here only when a field is
not its default, so the defaults take the very same floating-point operations as before.

Notation per agent token ``t`` of sample ``s``: ``l`` the current logprob (differentiable), ``b`` the
behaviour logprob the actor recorded, ``p`` the proximal logprob (the pre-update weights': the first epoch's
own forward, or AReaL's log-linear interpolation by version), ``w = exp(p - b)`` the off-policy weight at the
chosen level (token, sequence product, or sequence geometric mean).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

# exp() of a log-ratio beyond this overflows nothing but carries no information either.
MAX_LOG_RATIO = 20.0

AGGREGATIONS = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
RATIO_LEVELS = ("token", "sequence")
ESTIMATORS = ("grpo", "rloo")
CORRECTIONS = ("none", "tis", "mis", "decoupled")
CORRECTION_LEVELS = ("token", "sequence", "geometric")
PROXIMALS = ("recompute", "loglinear")
DEFAULT_CAP = {"tis": 2.0, "decoupled": 5.0}
DEFAULT_MIS_LOW, DEFAULT_MIS_HIGH = 0.5, 2.0


class ObjectiveError(ValueError):
    """A bad objective setting; ``field`` is the GrpoConfig field it names."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.reason = message


def _choice(field: str, value: str, choices: Sequence[str]) -> str:
    if value not in choices:
        raise ObjectiveError(field, f"unknown mode {value!r} (one of {', '.join(choices)})")
    return value


def _finite(field: str, value: float, lo: float, *, lo_open: bool = False) -> None:
    if not isinstance(value, int | float) or not math.isfinite(value) or value < lo or (lo_open and value == lo):
        raise ObjectiveError(field, f"must be a finite number {'>' if lo_open else '>='} {lo:g}, got {value!r}")


@dataclass
class ObjectiveSettings:
    """The objective's fields (GrpoConfig 11-26); defaults are today's loss."""

    loss_aggregation: str = "token-mean"
    aggregation_length: int = 0  # Dr. GRPO's constant tokens per sample (0: max_seq_len)
    ratio_level: str = "token"  # "sequence": GSPO
    entropy_coef: float = 0.0
    advantage_estimator: str = "grpo"
    overlong_buffer: int = 0
    overlong_max_tokens: int = 0
    overlong_penalty: float = 1.0
    correction: str = "none"
    correction_level: str = "token"
    is_cap: float | None = None  # None: DEFAULT_CAP of the correction
    mis_low: float = DEFAULT_MIS_LOW
    mis_high: float = DEFAULT_MIS_HIGH
    proximal: str = "recompute"
    dynamic_sampling: bool = False
    max_groups_per_batch: int = 0  # 0: 4 x the batch's groups

    def check(self, max_seq_len: int = 0) -> None:
        """Raise :class:`ObjectiveError` naming the first bad field."""
        _choice("loss_aggregation", self.loss_aggregation, AGGREGATIONS)
        _choice("ratio_level", self.ratio_level, RATIO_LEVELS)
        _choice("advantage_estimator", self.advantage_estimator, ESTIMATORS)
        _choice("correction", self.correction, CORRECTIONS)
        _choice("correction_level", self.correction_level, CORRECTION_LEVELS)
        _choice("proximal", self.proximal, PROXIMALS)
        if self.aggregation_length < 0:
            raise ObjectiveError("aggregation_length", f"must be >= 0, got {self.aggregation_length}")
        if self.loss_aggregation == "seq-mean-token-sum-norm" and not (self.aggregation_length or max_seq_len):
            raise ObjectiveError(
                "aggregation_length",
                "seq-mean-token-sum-norm needs a constant length (aggregation_length or max_seq_len)",
            )
        _finite("entropy_coef", self.entropy_coef, 0.0)
        if self.overlong_buffer < 0 or self.overlong_max_tokens < 0:
            which = "overlong_buffer" if self.overlong_buffer < 0 else "overlong_max_tokens"
            raise ObjectiveError(which, f"must be >= 0, got {getattr(self, which)}")
        if self.overlong_buffer:
            if self.overlong_max_tokens <= self.overlong_buffer:
                raise ObjectiveError(
                    "overlong_max_tokens",
                    f"must be > overlong_buffer ({self.overlong_buffer}) when the penalty is on, "
                    f"got {self.overlong_max_tokens}",
                )
        _finite("overlong_penalty", self.overlong_penalty, 0.0, lo_open=True)
        if self.is_cap is not None:
            _finite("is_cap", self.is_cap, 0.0, lo_open=True)
        _finite("mis_low", self.mis_low, 0.0)
        _finite("mis_high", self.mis_high, 0.0)
        if self.mis_low > self.mis_high:
            raise ObjectiveError(
                "mis_low", f"the bounds are empty: mis_low {self.mis_low:g} > mis_high {self.mis_high:g}"
            )
        if self.mis_low > 1.0:
            raise ObjectiveError("mis_low", f"must be <= 1 (a weight of 1 is always kept), got {self.mis_low:g}")
        if self.mis_high < 1.0:
            raise ObjectiveError("mis_high", f"must be >= 1 (a weight of 1 is always kept), got {self.mis_high:g}")
        if self.max_groups_per_batch < 0:
            raise ObjectiveError("max_groups_per_batch", f"must be >= 0, got {self.max_groups_per_batch}")

    @property
    def cap(self) -> float:
        """The weight cap in force (tis: truncation, decoupled: drop above)."""
        if self.is_cap is not None:
            return self.is_cap
        return DEFAULT_CAP.get(self.correction, math.inf)

    @property
    def is_default_loss(self) -> bool:
        """The per-token loss and its aggregation are today's (the bit-for-bit path)."""
        return (
            self.loss_aggregation == "token-mean"
            and self.ratio_level == "token"
            and self.entropy_coef == 0.0
            and self.correction == "none"
        )


# ====================================================================================================
# Advantages
# ====================================================================================================


def overlong_penalty(lengths: torch.Tensor, buffer: int, max_tokens: int, scale: float = 1.0) -> torch.Tensor:
    """DAPO's soft overlong penalty per sample: 0 up to ``max_tokens - buffer`` agent tokens, then linearly
    down to ``-scale`` at ``max_tokens``, and ``-scale`` beyond."""
    lengths = lengths.to(torch.float64)
    if buffer <= 0:
        return torch.zeros_like(lengths)
    start = float(max_tokens - buffer)
    return -scale * ((lengths - start) / buffer).clamp(0.0, 1.0)


def rloo_advantages(rewards: torch.Tensor, groups: torch.Tensor) -> torch.Tensor:
    """Leave-one-out advantages: ``r_i - mean_{j != i} r_j`` over the sample's group; 0 for singletons and
    for groups whose rewards are all equal (exactly, as GRPO's)."""
    rewards = rewards.to(torch.float64)
    n = int(groups.max()) + 1 if groups.numel() else 0
    count = torch.bincount(groups, minlength=n).to(torch.float64)
    total = torch.zeros(n, dtype=torch.float64).index_add_(0, groups, rewards)
    others = (total[groups] - rewards) / (count[groups] - 1).clamp(min=1)
    adv = rewards - others
    hi = torch.full((n,), -math.inf, dtype=torch.float64).scatter_reduce(0, groups, rewards, "amax")
    lo = torch.full((n,), math.inf, dtype=torch.float64).scatter_reduce(0, groups, rewards, "amin")
    flat = (hi == lo) | (count < 2)
    return torch.where(flat[groups], torch.zeros_like(adv), adv)


# ====================================================================================================
# Per-sample reductions inside a micro-batch (a sample's tokens are all in one micro-batch)
# ====================================================================================================


def per_sample_sum(values: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """Sum of ``values`` over each token's sample, broadcast back to the tokens."""
    if values.numel() == 0:
        return values
    n = int(index.max()) + 1
    sums = torch.zeros(n, dtype=values.dtype, device=values.device).index_add_(0, index, values)
    return sums[index]


def per_sample_count(index: torch.Tensor, keep: torch.Tensor | None = None) -> torch.Tensor:
    """Tokens (kept ones, when ``keep`` is given) of each token's sample, broadcast back (float32)."""
    ones = torch.ones(index.shape, dtype=torch.float32, device=index.device)
    if keep is not None:
        ones = ones * keep.to(torch.float32)
    return per_sample_sum(ones, index)


# ====================================================================================================
# Proximal policy and off-policy weights
# ====================================================================================================


def loglinear_proximal(
    logp: torch.Tensor, behaviour_logp: torch.Tensor, versions: torch.Tensor, prox_version: float, cur_version: float
) -> torch.Tensor:
    """AReaL's log-linear approximation of the proximal logprob: ``b + α (l - b)`` with
    ``α = (v_prox - v_b) / (v_cur - v_b)`` per token (1 where the version is unknown or ``v_cur == v_b``:
    the current weights then are the proximal ones). Detached."""
    v = versions.to(torch.float64)
    den = cur_version - v
    alpha = torch.where((versions >= 0) & (den > 0), (prox_version - v) / den.clamp(min=1e-12), torch.ones_like(v))
    alpha = alpha.clamp(0.0, 1.0).to(logp.dtype)
    lg = logp.detach()
    return behaviour_logp + alpha * (lg - behaviour_logp)


@dataclass
class OffPolicyWeights:
    """What the correction does to every token (all detached)."""

    ratio: torch.Tensor  # w at the chosen level, before any cap or mask
    weight: torch.Tensor  # the factor on the policy-gradient term (0 on dropped tokens)
    truncated: torch.Tensor  # bool: w above the TIS cap (weight = cap)
    masked: torch.Tensor  # bool: dropped (MIS outside the bounds, decoupled above the cap)
    rejected: torch.Tensor  # bool: dropped AND out of the loss's denominators (MIS only)


def off_policy_weights(
    prox_logp: torch.Tensor, behaviour_logp: torch.Tensor, sample_index: torch.Tensor, o: ObjectiveSettings
) -> OffPolicyWeights:
    """The correction's per-token weights from the proximal and behaviour logprobs."""
    log_w = (prox_logp.detach() - behaviour_logp).to(torch.float64)
    if o.correction_level == "sequence":
        log_w = per_sample_sum(log_w, sample_index)
    elif o.correction_level == "geometric":
        log_w = per_sample_sum(log_w, sample_index) / per_sample_count(sample_index).to(torch.float64)
    w = torch.exp(log_w.clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO))
    false = torch.zeros_like(w, dtype=torch.bool)
    if o.correction == "tis":
        cap = o.cap
        truncated = w > cap
        return OffPolicyWeights(w, w.clamp(max=cap), truncated, false, false)
    if o.correction == "mis":
        keep = (w >= o.mis_low) & (w <= o.mis_high)
        return OffPolicyWeights(w, torch.where(keep, w, torch.zeros_like(w)), false, ~keep, ~keep)
    if o.correction == "decoupled":
        keep = w <= o.cap
        return OffPolicyWeights(w, torch.where(keep, w, torch.zeros_like(w)), false, ~keep, false)
    raise ValueError(f"correction {o.correction!r} has no weights")


# ====================================================================================================
# Aggregation
# ====================================================================================================


@dataclass(frozen=True)
class Denominator:
    """The step's loss = Σ_t factor_t · loss_t / total; ``factor`` is per sample (1, or 1 / its kept tokens
    for seq-mean-token-mean) and ``total`` one number for the batch."""

    mode: str
    total: float


def batch_denominator(o: ObjectiveSettings, loss_tokens: Sequence[int], max_seq_len: int) -> Denominator:
    """The denominator before any MIS rejection: token-mean, every agent token of the batch; the
    sequence means, every sample with at least one agent token; Dr. GRPO, every sample x a constant."""
    if o.loss_aggregation == "token-mean":
        return Denominator(o.loss_aggregation, float(sum(loss_tokens)))
    if o.loss_aggregation == "seq-mean-token-sum-norm":
        return Denominator(o.loss_aggregation, float(len(loss_tokens) * (o.aggregation_length or max_seq_len)))
    return Denominator(o.loss_aggregation, float(sum(1 for n in loss_tokens if n > 0)))


def token_factors(
    o: ObjectiveSettings, sample_index: torch.Tensor, keep: torch.Tensor | None
) -> tuple[torch.Tensor | None, torch.Tensor, torch.Tensor]:
    """Per-token factor of the aggregation (None: all 1) and what rejected tokens take off the batch's
    denominator: ``(factor, removed_tokens, removed_samples)`` (scalars; samples: those left with no kept
    token). A rejected token (``keep`` False) gets factor 0: it leaves the whole loss, KL and entropy terms
    included."""
    zero = torch.zeros((), dtype=torch.float64, device=sample_index.device)
    removed_tokens, removed_samples = zero, zero
    if keep is not None and sample_index.numel():
        removed_tokens = (~keep).sum().to(torch.float64)
        kept_per_sample = per_sample_count(sample_index, keep)
        first = torch.ones_like(keep)
        first[1:] = sample_index[1:] != sample_index[:-1]  # one token stands for its sample
        removed_samples = (first & (kept_per_sample == 0)).sum().to(torch.float64)
    factor = None if keep is None else keep.to(torch.float32)
    if o.loss_aggregation == "seq-mean-token-mean":
        inv = 1.0 / per_sample_count(sample_index, keep).clamp(min=1.0)
        factor = inv if factor is None else factor * inv
    return factor, removed_tokens, removed_samples


def kept_total(o: ObjectiveSettings, den: Denominator, removed_tokens: float, removed_samples: float) -> float:
    """The denominator after MIS rejections (Dr. GRPO's constant never moves)."""
    if o.loss_aggregation == "token-mean":
        return den.total - removed_tokens
    if o.loss_aggregation == "seq-mean-token-sum-norm":
        return den.total
    return den.total - removed_samples


# ====================================================================================================
# Dynamic sampling
# ====================================================================================================


def zero_variance_groups(group_ids: Sequence[str], rewards: Sequence[float]) -> set[str]:
    """Groups whose rewards are all equal (single-sample groups included): no advantage, nothing to learn."""
    seen: dict[str, tuple[float, bool]] = {}
    for g, r in zip(group_ids, rewards, strict=True):
        if g not in seen:
            seen[g] = (r, True)
        else:
            first, flat = seen[g]
            seen[g] = (first, flat and r == first)
    return {g for g, (_, flat) in seen.items() if flat}
