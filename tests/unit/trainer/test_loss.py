"""The clipped importance-ratio loss, the k3 KL estimator, and ratio = 1 on-policy through the backend."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from rollart_trainer.grpo import (  # noqa: E402
    GrpoSettings,
    Sample,
    TorchBackend,
    TrainBatch,
    TurnTokens,
    grpo_token_loss,
    k3_kl,
)


def _loss(ratios: list[float], adv: float, lo: float = 0.2, hi: float = 0.28, c: float = 0.0):
    behaviour = torch.full((len(ratios),), -2.0, dtype=torch.float64)
    logp = (behaviour + torch.log(torch.tensor(ratios, dtype=torch.float64))).requires_grad_(True)
    a = torch.full((len(ratios),), adv, dtype=torch.float64)
    tl = grpo_token_loss(logp, behaviour, a, clip_eps_low=lo, clip_eps_high=hi, clip_ratio_c=c)
    tl.pg.sum().backward()
    return tl, logp.grad


def test_positive_advantage_clips_above_1_plus_eps_high_only() -> None:
    ratios = [0.5, 0.9, 1.0, 1.1, 1.25, 1.5]
    tl, grad = _loss(ratios, adv=2.0)
    r = torch.tensor(ratios, dtype=torch.float64)
    expected = -torch.minimum(r * 2.0, r.clamp(0.8, 1.28) * 2.0)
    torch.testing.assert_close(tl.pg.detach(), expected)
    assert tl.clipped.tolist() == [False, False, False, False, False, True]
    # d(-A·ρ)/d logp = -A·ρ where unclipped; no gradient once clipped. A low ratio with A > 0 is not
    # clipped (PPO's pessimistic bound): its gradient still pushes the token up.
    torch.testing.assert_close(grad, torch.where(tl.clipped, 0.0, -2.0 * r))
    torch.testing.assert_close(tl.ratio, r)


def test_negative_advantage_clips_below_1_minus_eps_low_only() -> None:
    ratios = [0.5, 0.79, 0.81, 1.0, 1.5]
    tl, grad = _loss(ratios, adv=-1.0)
    r = torch.tensor(ratios, dtype=torch.float64)
    assert tl.clipped.tolist() == [True, True, False, False, False]
    torch.testing.assert_close(tl.pg.detach(), -torch.minimum(-r, -r.clamp(0.8, 1.28)))
    torch.testing.assert_close(grad, torch.where(tl.clipped, 0.0, r))


def test_clip_range_is_asymmetric() -> None:
    tl_wide, _ = _loss([1.25], adv=1.0, hi=0.28)
    tl_narrow, _ = _loss([1.25], adv=1.0, hi=0.2)
    assert not tl_wide.clipped.item() and tl_narrow.clipped.item()
    assert tl_narrow.pg.item() == pytest.approx(-1.2)


def test_dual_clip_bounds_a_negative_advantage_loss_at_c_times_a() -> None:
    # A = -2, c = 3: the PPO term is -min(-2r, -2 clip(r)) = 2 max(r, clip(r)); dual-clip caps it at 6 (r > 3),
    # where it no longer depends on r (no gradient, counted as clipped).
    ratios = [0.5, 1.0, 2.0, 2.99, 3.01, 10.0]
    tl, grad = _loss(ratios, adv=-2.0, c=3.0)
    assert tl.pg.detach().tolist() == pytest.approx([1.6, 2.0, 4.0, 5.98, 6.0, 6.0])
    assert tl.clipped.tolist() == [True, False, False, False, True, True]
    r = torch.tensor(ratios, dtype=torch.float64)
    torch.testing.assert_close(grad, torch.where(tl.clipped, 0.0, 2.0 * r))


def test_dual_clip_leaves_positive_advantages_and_the_default_loss_alone() -> None:
    ratios = [0.5, 1.0, 1.5, 10.0]
    on, _ = _loss(ratios, adv=2.0, c=3.0)
    off, _ = _loss(ratios, adv=2.0)
    assert torch.equal(on.pg, off.pg) and torch.equal(on.clipped, off.clipped)
    neg_off, _ = _loss(ratios, adv=-1.0)
    assert neg_off.pg.detach().tolist()[-1] == pytest.approx(10.0)  # unbounded without it


def test_dual_clip_option_is_read_and_checked() -> None:
    from rollart.v1 import trainer_pb2

    g = trainer_pb2.GrpoConfig(learning_rate=1e-5)
    assert GrpoSettings.from_proto(g).clip_ratio_c == 0.0
    assert GrpoSettings.from_proto(g, {"grpo.clip_ratio_c": "3"}).clip_ratio_c == 3.0
    for bad in ("1", "0.5", "-3", "inf"):
        with pytest.raises(ValueError, match="clip_ratio_c"):
            GrpoSettings.from_proto(g, {"grpo.clip_ratio_c": bad})
    with pytest.raises(ValueError, match=r"options\[grpo.clip_ratio\] is not a grpo option"):
        GrpoSettings.from_proto(g, {"grpo.clip_ratio": "3"})  # a typo is refused, not ignored


def test_k3_kl_values_gradient_and_unbiasedness() -> None:
    lp = torch.tensor([-1.0, -2.0, -0.5], dtype=torch.float64, requires_grad=True)
    ref = torch.tensor([-1.0, -1.0, -3.0], dtype=torch.float64)
    kl = k3_kl(lp, ref)
    d = ref - lp.detach()
    torch.testing.assert_close(kl.detach(), torch.exp(d) - d - 1)
    assert kl[0].item() == 0.0 and bool((kl >= 0).all())
    kl.sum().backward()
    # d/dlogp [exp(ref - lp) - (ref - lp) - 1] = 1 - exp(ref - lp): zero where policy == reference
    torch.testing.assert_close(lp.grad, 1 - torch.exp(d))
    # Monte Carlo: the mean of k3 over samples from pi is KL(pi || ref).
    g = torch.Generator().manual_seed(0)
    pi = torch.softmax(torch.randn(6, generator=g, dtype=torch.float64), 0)
    q = torch.softmax(torch.randn(6, generator=g, dtype=torch.float64), 0)
    x = torch.multinomial(pi, 200_000, replacement=True, generator=g)
    est = k3_kl(pi.log()[x], q.log()[x]).mean().item()
    exact = float((pi * (pi.log() - q.log())).sum())
    assert est == pytest.approx(exact, rel=0.03)


def test_kl_coefficient_adds_to_the_loss() -> None:
    lp = torch.tensor([-1.0, -2.0], dtype=torch.float64)
    tl = grpo_token_loss(
        lp,
        lp,
        torch.tensor([1.0, -1.0], dtype=torch.float64),
        clip_eps_low=0.2,
        clip_eps_high=0.2,
        ref_logp=torch.tensor([-1.5, -1.0], dtype=torch.float64),
        kl_coef=0.1,
    )
    assert tl.kl is not None
    torch.testing.assert_close(tl.loss, tl.pg + 0.1 * tl.kl)


def _random_batch(seed: int, groups: int = 3, per_group: int = 4, vocab: int = 512) -> list[Sample]:
    rng = np.random.default_rng(seed)
    samples = []
    for g in range(groups):
        prompt = rng.integers(3, vocab, int(rng.integers(2, 8))).tolist()
        for k in range(per_group):
            turns = []
            for _ in range(int(rng.integers(1, 4))):
                n = int(rng.integers(1, 6))
                turns.append(
                    TurnTokens(
                        rng.integers(3, vocab, int(rng.integers(0, 5))).tolist(),
                        rng.integers(3, vocab, n).tolist(),
                        [0.0] * n,
                        [3] * n,
                    )
                )
            samples.append(Sample(prompt, turns, float(rng.integers(0, 3)), f"g{g}", f"s{g}-{k}"))
    return samples


def _set_behaviour(samples: list[Sample], logprobs: list[np.ndarray]) -> None:
    for s, lp in zip(samples, logprobs):
        it = iter(lp.tolist())
        for t in s.turns:
            t.action_logprobs = [next(it) for _ in t.action_ids]


def test_ratio_is_one_when_behaviour_is_the_current_policy(tiny_model: Path) -> None:
    # Behaviour logprobs from one-sample micro-batches (no packing); training packs every sample into
    # shared rows: the ratio must still be 1 (packing isolates sequences), so nothing is clipped.
    b = TorchBackend.from_pretrained(tiny_model, GrpoSettings(learning_rate=1e-4, micro_batch_size=1))
    samples = _random_batch(0)
    _set_behaviour(samples, b.action_logprobs(samples))
    b.settings.micro_batch_size = 0
    st = b.train_step(TrainBatch(samples, "b", policy_version=5))
    assert st.micro_batches == 1 and st.tokens_trained > 0
    assert abs(st.ratio_min - 1) < 1e-5 and abs(st.ratio_max - 1) < 1e-5
    assert st.clip_fraction == 0.0
    assert st.behaviour_kl < 1e-9
    assert st.staleness_mean == 2.0 and st.staleness_max == 2
    # A wrong behaviour logprob shows up as a ratio != 1 (the check above can fail).
    samples[0].turns[0].action_logprobs = [x - 1.0 for x in samples[0].turns[0].action_logprobs]
    st2 = b.train_step(TrainBatch(samples, "b2"))
    assert st2.ratio_max > 2.0


def test_kl_to_reference_is_zero_at_start_then_grows(tiny_model: Path) -> None:
    b = TorchBackend.from_pretrained(tiny_model, GrpoSettings(learning_rate=3e-3, kl_coef=0.05))
    ref_before = {n: p.detach().clone() for n, p in b.reference.named_parameters()}  # type: ignore[union-attr]
    samples = _random_batch(1)
    _set_behaviour(samples, b.action_logprobs(samples))
    first = b.train_step(TrainBatch(samples, "b0"))
    assert first.kl == pytest.approx(0.0, abs=1e-9)
    assert math.isclose(first.loss, first.pg_loss + 0.05 * first.kl)
    kls = [b.train_step(TrainBatch(samples, f"b{i}")).kl for i in range(1, 3)]
    assert kls[-1] > 1e-4
    for n, p in b.reference.named_parameters():  # type: ignore[union-attr]
        assert torch.equal(p, ref_before[n]), f"reference parameter {n} changed"
