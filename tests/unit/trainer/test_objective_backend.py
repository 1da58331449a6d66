"""The objective through the real backend on a tiny Qwen3: the defaults reproduce today's loss bit for bit,
each correction and aggregation gives the step loss computed by hand on a 2 groups x 2 samples x 3 tokens
batch (masked, truncated and rejected tokens included), and the gradient is the hand loss's gradient when MIS
rejections move the denominator after the micro-batches ran."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from rollart_trainer.grpo import GrpoSettings, Sample, TorchBackend, TrainBatch, TurnTokens  # noqa: E402
from rollart_trainer.objective import ObjectiveSettings  # noqa: E402

# Off-policy weight w = proximal / behaviour per token, chosen by hand: sample 0 (A = +1), sample 1 (A = -1),
# then a group whose rewards are equal (A = 0, never forwarded without a KL or entropy term).
W = [[1.0, 3.0, 0.6], [0.25, 1.0, 1.0], [1.0, 1.0, 1.0], [1.0, 1.0, 1.0]]
REWARDS = [1.0, 0.0, 1.0, 1.0]
GROUPS = ["g0", "g0", "g1", "g1"]
ACTIONS = [[11, 12, 13], [21, 22, 23], [31, 32, 33], [41, 42, 43]]


def make_samples(behaviour: list[list[float]]) -> list[Sample]:
    return [
        Sample([5, 6], [TurnTokens([], ACTIONS[i], behaviour[i], [3, 3, 3])], REWARDS[i], GROUPS[i], f"s{i}")
        for i in range(4)
    ]


def batch_with_weights(backend: TorchBackend, weights: list[list[float]] = W) -> TrainBatch:
    """Behaviour logprobs set to the current logprobs minus log w: the first epoch's proximal policy (the
    pre-update weights) over the behaviour one is then exactly w, and the PPO ratio against it is 1."""
    current = backend.action_logprobs(make_samples([[0.0] * 3] * 4))
    behaviour = [(current[i].astype(np.float64) - np.log(weights[i])).tolist() for i in range(4)]
    return TrainBatch(make_samples(behaviour), "b", policy_version=3)


def capture_grads(backend: TorchBackend) -> list[list[torch.Tensor]]:
    """The gradients the optimizer steps with (after any rescaling), one list per optimizer step."""
    seen: list[list[torch.Tensor]] = []
    step = backend.optimizer.step

    def wrapped(*a: Any, **k: Any) -> Any:
        seen.append([p.grad.detach().clone() for p in backend.parameters])
        return step(*a, **k)

    backend.optimizer.step = wrapped  # type: ignore[method-assign]
    return seen


def backend(model: Path, **objective: Any) -> TorchBackend:
    settings = GrpoSettings(
        learning_rate=1e-3,
        micro_batch_size=1,
        max_grad_norm=0.0,
        advantage_eps=1e-6,
        objective=ObjectiveSettings(advantage_estimator="rloo", **objective),
    )
    return TorchBackend.from_pretrained(model, settings)


# Step loss by hand: Σ over tokens of -A_s * weight_t (ratio 1), over the mode's denominator.
S0, S1 = [-1.0, -2.0, -0.6], [0.25, 1.0, 1.0]  # tis token, cap 2
G0, G1 = 1.8 ** (1 / 3), 0.25 ** (1 / 3)
CASES = [
    # (objective fields, pg_loss, truncated fraction, masked fraction)
    ({"correction": "tis"}, sum(S0 + S1) / 12, 1 / 6, 0.0),
    ({"correction": "tis", "loss_aggregation": "seq-mean-token-sum"}, sum(S0 + S1) / 4, 1 / 6, 0.0),
    (
        {"correction": "tis", "loss_aggregation": "seq-mean-token-sum-norm", "aggregation_length": 8},
        -1.35 / 32,
        1 / 6,
        0,
    ),
    ({"correction": "tis", "correction_level": "sequence"}, (-3 * 1.8 + 3 * 0.25) / 12, 0.0, 0.0),
    # MIS [0.5, 2] rejects w = 3 and w = 0.25: they leave the token count (12 -> 10)
    ({"correction": "mis"}, (-1.0 - 0.6 + 1.0 + 1.0) / 10, 0.0, 2 / 6),
    ({"correction": "mis", "loss_aggregation": "seq-mean-token-sum"}, 0.4 / 4, 0.0, 2 / 6),
    ({"correction": "mis", "loss_aggregation": "seq-mean-token-mean"}, (-1.6 / 2 + 2.0 / 2) / 4, 0.0, 2 / 6),
    ({"correction": "mis", "loss_aggregation": "seq-mean-token-sum-norm", "aggregation_length": 8}, 0.4 / 32, 0, 2 / 6),
    # sample 1's product 0.25 is rejected whole: 9 tokens left
    ({"correction": "mis", "correction_level": "sequence"}, -3 * 1.8 / 9, 0.0, 3 / 6),
    ({"correction": "mis", "correction_level": "geometric"}, (-3 * G0 + 3 * G1) / 12, 0.0, 0.0),
    # decoupled (AReaL): w = 3 above the cap 2 is dropped but stays in the denominator
    ({"correction": "decoupled", "is_cap": 2.0}, (-1.0 - 0.6 + 0.25 + 1.0 + 1.0) / 12, 0.0, 1 / 6),
]


@pytest.mark.parametrize(("fields", "pg_loss", "truncated", "masked"), CASES)
def test_step_loss_matches_the_hand_value(
    tiny_model: Path, fields: dict[str, Any], pg_loss: float, truncated: float, masked: float
) -> None:
    b = backend(tiny_model, **fields)
    st = b.train_step(batch_with_weights(b))
    assert st.pg_loss == pytest.approx(pg_loss, rel=1e-5, abs=1e-6)
    assert st.loss == pytest.approx(pg_loss, rel=1e-5, abs=1e-6)
    assert st.tokens_trained == 6 and st.loss_tokens == 12
    assert st.is_truncated_fraction == pytest.approx(truncated)
    assert st.is_masked_fraction == pytest.approx(masked)
    assert st.ratio_mean == pytest.approx(1.0) and st.clip_fraction == 0.0  # clipped against the proximal


def test_off_policy_figures(tiny_model: Path) -> None:
    b = backend(tiny_model, correction="tis")
    st = b.train_step(batch_with_weights(b))
    flat = [w for row in W[:2] for w in row]  # the forwarded samples
    assert st.is_ratio_mean == pytest.approx(sum(flat) / 6, rel=1e-5)
    assert (st.is_ratio_min, st.is_ratio_max) == (pytest.approx(0.25, rel=1e-5), pytest.approx(3.0, rel=1e-5))
    # k3(behaviour ‖ trainer) = w - log w - 1 per token, averaged
    assert st.mismatch_kl == pytest.approx(sum(w - math.log(w) - 1 for w in flat) / 6, rel=1e-4)
    assert st.mismatch_kl == st.behaviour_kl


@pytest.mark.parametrize(
    "fields",
    [
        {"correction": "mis"},
        {"correction": "mis", "loss_aggregation": "seq-mean-token-mean"},
        {"correction": "mis", "correction_level": "sequence", "loss_aggregation": "seq-mean-token-sum"},
        {
            "correction": "decoupled",
            "is_cap": 2.0,
            "loss_aggregation": "seq-mean-token-sum-norm",
            "aggregation_length": 8,
        },
    ],
)
def test_gradient_is_the_hand_losss_gradient(tiny_model: Path, fields: dict[str, Any]) -> None:
    b = backend(tiny_model, **fields)
    batch = batch_with_weights(b)
    grads = capture_grads(b)
    st = b.train_step(batch)
    # The same loss written out: weights, kept tokens and denominators from W by hand.
    o = b.settings.objective
    ref = backend(tiny_model, **fields)
    prep = ref.prepare(batch)
    adv = {0: 1.0, 1: -1.0}
    terms: dict[int, torch.Tensor] = {}
    for mb in prep.micro_batches:
        logp, _ = ref.net(mb.input_ids, mb.position_ids, mb.pred_rows, mb.pred_cols, mb.targets)
        terms[int(mb.sample_index[0])] = logp
    total = torch.zeros((), dtype=torch.float32)
    kept_tokens, kept_samples = 0, 0
    for s, logp in terms.items():
        w = torch.tensor(W[s], dtype=torch.float32)
        if o.correction_level == "sequence":
            w = torch.full((3,), float(np.prod(W[s])))
        if o.correction == "mis":
            keep = (w >= o.mis_low) & (w <= o.mis_high)
        else:
            keep = torch.ones(3, dtype=torch.bool)
        weight = torch.where(w <= o.cap, w, torch.zeros(3)) if o.correction == "decoupled" else torch.where(keep, w, 0)
        per_token = -adv[s] * weight * torch.exp(logp - logp.detach())
        if o.correction == "mis":
            per_token = per_token * keep
        n_kept = int(keep.sum())
        if o.loss_aggregation == "seq-mean-token-mean":
            per_token = per_token / max(n_kept, 1)
        total = total + per_token.sum()
        kept_tokens += n_kept
        kept_samples += int(n_kept > 0)
    denom = {
        "token-mean": kept_tokens + 6,  # + the 6 tokens of the flat group, never forwarded
        "seq-mean-token-sum": kept_samples + 2,
        "seq-mean-token-mean": kept_samples + 2,
        "seq-mean-token-sum-norm": 4 * 8,
    }[o.loss_aggregation]
    (total / denom).backward()
    assert st.pg_loss == pytest.approx(float(total.detach()) / denom, rel=1e-5)
    assert len(grads) == 1
    for got, p in zip(grads[0], ref.parameters, strict=True):
        expected = p.grad if p.grad is not None else torch.zeros_like(p)
        # float32 rounding of w (the behaviour logprobs are float32): relative to the tensor's scale
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5 * float(expected.abs().max()) + 1e-12)


def test_defaults_reproduce_todays_loss_bit_for_bit(tiny_model: Path) -> None:
    """Today's formula written out (ratio against the behaviour logprobs, clipped, summed over every agent
    token and divided by their count, GRPO advantages): the same gradient and pg_loss, bit for bit."""
    rng = np.random.default_rng(0)
    samples = []
    for i in range(6):
        act = rng.integers(1, 500, 4).tolist()
        turns = [TurnTokens(rng.integers(1, 500, 2).tolist(), act, (-rng.random(4) * 2).tolist())]
        samples.append(Sample([7, 8, 9], turns, float(rng.integers(0, 3)), f"g{i // 3}", f"s{i}"))
    settings = GrpoSettings(learning_rate=1e-3, micro_batch_size=2, clip_eps_high=0.28)
    b = TorchBackend.from_pretrained(tiny_model, settings)
    grads = capture_grads(b)
    st = b.train_step(TrainBatch(samples, "b"))

    ref = TorchBackend.from_pretrained(tiny_model, settings)
    prep = ref.prepare(TrainBatch(samples, "b"))
    denom = float(max(prep.loss_tokens, 1))
    pg_sum = torch.zeros((), dtype=torch.float64)
    for mb in prep.micro_batches:
        logp, _ = ref.net(mb.input_ids, mb.position_ids, mb.pred_rows, mb.pred_cols, mb.targets, 1.0)
        ratio = torch.exp((logp - mb.behaviour_logp).clamp(-20.0, 20.0))
        a = mb.advantages
        pg = -torch.minimum(ratio * a, ratio.clamp(1.0 - 0.2, 1.0 + 0.28) * a)
        (pg.sum() * (1.0 / denom)).backward()
        pg_sum += pg.detach().sum().double()
    assert st.pg_loss == float(pg_sum) / denom
    for got, p in zip(grads[0], ref.parameters, strict=True):
        assert p.grad is not None
        assert torch.equal(got, p.grad)


@pytest.mark.parametrize(
    "fields",
    [
        {"ratio_level": "sequence", "loss_aggregation": "seq-mean-token-mean"},
        {"entropy_coef": 0.01},
        {"overlong_buffer": 1, "overlong_max_tokens": 3},
        {"correction": "decoupled", "proximal": "loglinear"},
    ],
)
def test_variants_train(tiny_model: Path, fields: dict[str, Any]) -> None:
    b = backend(tiny_model, **fields)
    batch = batch_with_weights(b, [[1.0] * 3] * 4)  # on-policy: nothing clipped, every variant moves the weights
    before = {k: v.clone() for k, v in b.model_state().items()}
    st = b.train_step(batch)
    assert st.optimizer_steps == 1 and math.isfinite(st.loss)
    assert any(not torch.equal(before[k], v) for k, v in b.model_state().items())
    if "entropy_coef" in fields:  # the flat group is forwarded for its entropy bonus
        assert st.tokens_trained == 12 and st.loss == pytest.approx(st.pg_loss - 0.01 * st.entropy, rel=1e-4)
    if "overlong_buffer" in fields:  # every sample has 3 agent tokens: penalty -1 each, advantages unchanged
        assert st.overlong_penalty_mean == -1.0 and st.zero_advantage_groups == 1


def test_recomputed_proximal_is_the_first_epochs_policy(tiny_model: Path) -> None:
    """Two epochs: the second clips against the first epoch's (pre-update) logprobs, so its ratio moves off 1,
    while the weights proximal / behaviour stay those of the first epoch."""
    b = backend(tiny_model, correction="tis")
    b.settings.epochs_per_batch = 2
    st = b.train_step(batch_with_weights(b))
    assert st.optimizer_steps == 2
    assert max(abs(st.ratio_min - 1.0), abs(st.ratio_max - 1.0)) > 1e-4
    assert st.is_ratio_max == pytest.approx(3.0, rel=1e-5)
