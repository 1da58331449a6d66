"""What one training step did (:class:`StepStats`): loss terms, ratio and off-policy figures, tokens, rewards.

Token statistics are over the agent tokens trained on; the names are the step metrics of docs/tracking.md.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any


@dataclass
class StepStats:
    """What one ``train_step`` did. Token statistics are over the agent tokens trained on."""

    loss: float = 0.0  # pg_loss + kl_coef * kl (mean over epochs)
    pg_loss: float = 0.0  # token-mean over every agent token of the batch
    kl: float = 0.0  # token-mean k3 to the reference (0 without one)
    entropy: float = 0.0
    clip_fraction: float = 0.0  # tokens whose clipped term was chosen (no gradient through ρ)
    ratio_mean: float = 1.0
    ratio_min: float = 1.0
    ratio_max: float = 1.0
    behaviour_kl: float = 0.0  # k3(behaviour ‖ current) in the first epoch: actor/trainer mismatch
    # Off-policy figures of the first epoch (docs/objective.md): the mismatch k3 (= behaviour_kl), the
    # weight proximal / behaviour at the correction's level (without a correction: the trainer's
    # pre-update logprob over the behaviour one), the share of forwarded tokens whose weight was truncated
    # (tis) or that were dropped (mis, decoupled).
    mismatch_kl: float = 0.0
    is_ratio_mean: float = 1.0
    is_ratio_min: float = 1.0
    is_ratio_max: float = 1.0
    is_truncated_fraction: float = 0.0
    is_masked_fraction: float = 0.0
    overlong_penalty_mean: float = 0.0  # mean reward penalty of the overlong shaping (0 when off)
    grad_norm: float = 0.0  # before clipping (last epoch)
    learning_rate: float = 0.0
    tokens_trained: int = 0  # agent tokens that were forwarded (per epoch)
    loss_tokens: int = 0  # agent tokens of the batch (the loss's denominator)
    positions: int = 0  # token positions forwarded per epoch (all streams, padding included)
    samples: int = 0
    groups: int = 0
    zero_advantage_groups: int = 0
    reward_mean: float = 0.0
    reward_std: float = 0.0
    reward_min: float = 0.0
    reward_max: float = 0.0
    advantage_abs_mean: float = 0.0
    response_length_mean: float = 0.0  # agent tokens per sample
    staleness_mean: float = 0.0
    staleness_max: int = 0
    micro_batches: int = 0  # on this rank
    optimizer_steps: int = 0  # done in this train_step
    skipped_steps: int = 0  # epochs whose gradient was not finite (no update)
    train_seconds: float = 0.0
    tokens_per_second: float = 0.0  # positions forwarded and backpropagated per second

    # What the step driver copies into StepMetrics.extra beside its own fields (docs/objective.md).
    OBJECTIVE_METRICS = (
        "mismatch_kl",
        "is_ratio_mean",
        "is_ratio_min",
        "is_ratio_max",
        "is_truncated_fraction",
        "is_masked_fraction",
        "ratio_min",
        "ratio_max",
        "overlong_penalty_mean",
    )

    def to_dict(self) -> dict[str, float]:
        return asdict(self)

    _PROTO_FIELDS = (
        "loss",
        "pg_loss",
        "kl",
        "entropy",
        "clip_fraction",
        "grad_norm",
        "learning_rate",
        "tokens_trained",
        "response_length_mean",
        "staleness_mean",
        "staleness_max",
        "samples",
        "groups",
        "reward_mean",
        "reward_std",
        "reward_min",
        "reward_max",
    )

    def fill_step_metrics(self, msg: Any) -> Any:
        """Copy into a ``rollart.v1.StepMetrics`` (fields it has; everything else goes to ``extra``)."""
        for name, value in self.to_dict().items():
            if name in self._PROTO_FIELDS:
                setattr(msg, name, value)
            else:
                msg.extra[name] = float(value)
        msg.train_time.FromNanoseconds(int(self.train_seconds * 1e9))
        return msg


def response_lengths(trajectories: Iterable[Any], max_tokens: int = 0, max_seq_len: int = 0) -> dict[str, float]:
    """``response_length_max`` (the most agent tokens a sample of the batch generated, all turns) and
    ``response_clip_fraction``: the share of samples that hit the max length, i.e. a turn that generated
    ``max_tokens`` tokens (the sampling limit of one request: cut by length) or a token stream (prompt,
    observations, actions) longer than ``max_seq_len`` (cut by the trainer). 0 turns off either limit.
    ``trajectories``: ``rollart.v1.Trajectory`` messages (a batch's)."""
    n = clipped = longest = 0
    for t in trajectories:
        actions = [len(turn.action_token_ids) for turn in t.turns]
        length = sum(actions)
        stream = len(t.prompt_token_ids) + length + sum(len(turn.observation_token_ids) for turn in t.turns)
        n += 1
        longest = max(longest, length)
        if (max_tokens > 0 and any(a >= max_tokens for a in actions)) or (0 < max_seq_len < stream):
            clipped += 1
    return {"response_length_max": float(longest), "response_clip_fraction": clipped / n if n else 0.0}
