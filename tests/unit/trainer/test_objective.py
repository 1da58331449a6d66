"""The objective's pieces against values computed by hand: RLOO, the overlong penalty, GSPO's sequence ratio,
the entropy bonus, the off-policy weights (truncated, masked, rejected), the aggregation's denominators,
AReaL's log-linear proximal policy, zero-variance groups, and the settings' checks naming the field."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from rollart.v1 import trainer_pb2 as T  # noqa: E402
from rollart_trainer import objective as obj  # noqa: E402
from rollart_trainer.grpo import GrpoSettings, grpo_token_loss, objective_from_proto  # noqa: E402
from rollart_trainer.objective import ObjectiveError, ObjectiveSettings  # noqa: E402

F64 = torch.float64


def t(x: list[float]) -> torch.Tensor:
    return torch.tensor(x, dtype=F64)


# ------------------------------------------------------------------------------------------- advantages


def test_rloo_is_reward_minus_mean_of_the_others() -> None:
    rewards = t([1.0, 0.0, 0.0, 2.0, 5.0, 5.0, 7.0])
    groups = torch.tensor([0, 0, 0, 1, 1, 1, 2])
    adv = obj.rloo_advantages(rewards, groups)
    # group 0: 1 - 0, 0 - 0.5, 0 - 0.5; group 1: 2 - 5, 5 - 3.5, 5 - 3.5; singleton: 0
    assert adv.tolist() == [1.0, -0.5, -0.5, -3.0, 1.5, 1.5, 0.0]


def test_rloo_flat_group_is_exactly_zero() -> None:
    adv = obj.rloo_advantages(t([0.1, 0.1, 0.1]), torch.tensor([0, 0, 0]))
    assert adv.tolist() == [0.0, 0.0, 0.0]


def test_overlong_penalty_is_zero_then_linear_then_capped() -> None:
    lengths = torch.tensor([10, 12, 13, 14, 16, 30])
    pen = obj.overlong_penalty(lengths, buffer=4, max_tokens=16, scale=0.5)
    # free up to 12 tokens, then -0.5 * (len - 12) / 4, -0.5 from 16 on
    assert pen.tolist() == [0.0, 0.0, -0.125, -0.25, -0.5, -0.5]
    assert obj.overlong_penalty(lengths, buffer=0, max_tokens=16).tolist() == [0.0] * 6


# -------------------------------------------------------------------------------------------- the loss


def test_gspo_ratio_is_the_geometric_mean_per_sample_with_token_gradients() -> None:
    behaviour = t([-1.0, -2.0, -1.5, -0.5])
    logp = (behaviour + t([0.2, -0.1, 0.3, 0.0])).requires_grad_(True)
    index = torch.tensor([0, 0, 1, 1])
    adv = t([1.0, 1.0, -1.0, -1.0])
    tl = grpo_token_loss(logp, behaviour, adv, clip_eps_low=0.2, clip_eps_high=0.2, sequence_index=index)
    s0, s1 = math.exp((0.2 - 0.1) / 2), math.exp((0.3 + 0.0) / 2)
    torch.testing.assert_close(tl.ratio, t([s0, s0, s1, s1]))
    torch.testing.assert_close(tl.pg.detach(), t([-s0, -s0, s1, s1]))
    tl.pg.sum().backward()
    # d(-A s)/d l_t = -A s (each token carries its sample's ratio as its own weight)
    torch.testing.assert_close(logp.grad, t([-s0, -s0, s1, s1]))


def test_gspo_clips_the_sequence_ratio() -> None:
    behaviour = t([-1.0, -1.0])
    logp = (behaviour + t([0.6, 0.6])).requires_grad_(True)  # ratio e^0.6 = 1.82 > 1.2
    tl = grpo_token_loss(
        logp, behaviour, t([1.0, 1.0]), clip_eps_low=0.2, clip_eps_high=0.2, sequence_index=torch.tensor([0, 0])
    )
    assert tl.clipped.tolist() == [True, True]
    torch.testing.assert_close(tl.pg.detach(), t([-1.2, -1.2]))
    tl.pg.sum().backward()
    assert logp.grad.tolist() == [0.0, 0.0]


def test_entropy_bonus_subtracts_coef_times_entropy() -> None:
    behaviour = t([-1.0, -1.0])
    logp = behaviour.clone().requires_grad_(True)
    ent = t([0.5, 2.0]).requires_grad_(True)
    tl = grpo_token_loss(
        logp, behaviour, t([1.0, 0.0]), clip_eps_low=0.2, clip_eps_high=0.2, entropy=ent, entropy_coef=0.1
    )
    torch.testing.assert_close(tl.loss.detach(), t([-1.0 - 0.05, -0.2]))
    tl.loss.sum().backward()
    assert ent.grad.tolist() == [-0.1, -0.1]


def test_weight_multiplies_the_policy_gradient_term_only() -> None:
    behaviour = t([-1.0, -1.0])
    logp = behaviour.clone().requires_grad_(True)
    ref = t([-1.5, -0.5])
    tl = grpo_token_loss(
        logp,
        behaviour,
        t([2.0, 2.0]),
        clip_eps_low=0.2,
        clip_eps_high=0.2,
        weight=t([0.5, 0.0]),
        ref_logp=ref,
        kl_coef=1.0,
    )
    kl = torch.expm1(ref - behaviour) - (ref - behaviour)
    torch.testing.assert_close(tl.pg.detach(), t([-1.0, 0.0]))
    torch.testing.assert_close(tl.loss.detach(), t([-1.0, 0.0]) + kl)


# ------------------------------------------------------------------------------ off-policy weights

# 2 samples x 3 tokens; proximal - behaviour = log w, w chosen by hand.
W = [1.0, 3.0, 0.6, 0.25, 1.0, 1.0]
INDEX = torch.tensor([0, 0, 0, 1, 1, 1])


def weights(**kw: object) -> obj.OffPolicyWeights:
    o = ObjectiveSettings(**kw)  # type: ignore[arg-type]
    o.check()
    behaviour = t([-1.0] * 6)
    return obj.off_policy_weights(behaviour + torch.log(t(W)), behaviour, INDEX, o)


def test_tis_token_truncates_at_the_cap() -> None:
    w = weights(correction="tis")  # default cap 2
    torch.testing.assert_close(w.weight, t([1.0, 2.0, 0.6, 0.25, 1.0, 1.0]))
    assert w.truncated.tolist() == [False, True, False, False, False, False]
    assert not w.masked.any() and not w.rejected.any()
    torch.testing.assert_close(w.ratio, t(W))


def test_tis_sequence_uses_the_product_per_sample() -> None:
    w = weights(correction="tis", correction_level="sequence", is_cap=1.5)
    # sample 0: 1 * 3 * 0.6 = 1.8 -> 1.5; sample 1: 0.25
    torch.testing.assert_close(w.ratio, t([1.8] * 3 + [0.25] * 3))
    torch.testing.assert_close(w.weight, t([1.5] * 3 + [0.25] * 3))
    assert w.truncated.tolist() == [True] * 3 + [False] * 3


def test_mis_token_rejects_outside_the_bounds() -> None:
    w = weights(correction="mis")  # [0.5, 2]
    torch.testing.assert_close(w.weight, t([1.0, 0.0, 0.6, 0.0, 1.0, 1.0]))
    assert w.rejected.tolist() == [False, True, False, True, False, False]
    assert w.masked.tolist() == w.rejected.tolist()


def test_mis_geometric_tests_the_geometric_mean() -> None:
    w = weights(correction="mis", correction_level="geometric", mis_low=0.7, mis_high=1.5)
    g0, g1 = 1.8 ** (1 / 3), 0.25 ** (1 / 3)  # 1.216 kept, 0.630 rejected
    torch.testing.assert_close(w.ratio, t([g0] * 3 + [g1] * 3))
    torch.testing.assert_close(w.weight, t([g0] * 3 + [0.0] * 3))
    assert w.rejected.tolist() == [False] * 3 + [True] * 3


def test_decoupled_drops_above_the_cap_but_does_not_reject() -> None:
    w = weights(correction="decoupled", is_cap=2.0)
    torch.testing.assert_close(w.weight, t([1.0, 0.0, 0.6, 0.25, 1.0, 1.0]))
    assert w.masked.tolist() == [False, True, False, False, False, False]
    assert not w.rejected.any()  # AReaL: the dropped token stays in the denominator


def test_loglinear_proximal_interpolates_by_version() -> None:
    behaviour = t([-2.0, -2.0, -2.0, -2.0])
    logp = t([-1.0, -1.0, -1.0, -1.0])
    versions = torch.tensor([3, 4, 5, -1])
    # proximal version 5, current 6: alpha = (5 - v) / (6 - v) = 2/3, 1/2, 0; unknown version -> 1
    prox = obj.loglinear_proximal(logp, behaviour, versions, 5.0, 6.0)
    torch.testing.assert_close(prox, t([-2.0 + 2 / 3, -1.5, -2.0, -1.0]))
    # the first epoch (current = proximal): the current logprobs themselves
    torch.testing.assert_close(obj.loglinear_proximal(logp, behaviour, versions, 5.0, 5.0), logp)


# ---------------------------------------------------------------------------------------- aggregation


def test_denominators_before_rejection() -> None:
    tokens = [3, 3, 0, 2]
    den = obj.batch_denominator
    assert den(ObjectiveSettings(), tokens, 0).total == 8
    assert den(ObjectiveSettings(loss_aggregation="seq-mean-token-sum"), tokens, 0).total == 3
    assert den(ObjectiveSettings(loss_aggregation="seq-mean-token-mean"), tokens, 0).total == 3
    assert den(ObjectiveSettings(loss_aggregation="seq-mean-token-sum-norm"), tokens, 16).total == 4 * 16
    assert (
        den(ObjectiveSettings(loss_aggregation="seq-mean-token-sum-norm", aggregation_length=5), tokens, 16).total == 20
    )


@pytest.mark.parametrize(
    ("mode", "kept"),
    [
        ("token-mean", 12 - 4),  # the 4 rejected tokens leave
        ("seq-mean-token-sum", 4 - 1),  # sample 1 lost all its tokens
        ("seq-mean-token-mean", 4 - 1),
        ("seq-mean-token-sum-norm", 4 * 8),  # Dr. GRPO's constant never moves
    ],
)
def test_a_rejected_token_leaves_the_denominator_where_the_mode_says(mode: str, kept: float) -> None:
    o = ObjectiveSettings(loss_aggregation=mode, aggregation_length=8)
    index = torch.tensor([0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3])
    keep = torch.tensor([True, False, True] + [False] * 3 + [True] * 6)
    den = obj.batch_denominator(o, [3, 3, 3, 3], 0)
    factor, removed_tokens, removed_samples = obj.token_factors(o, index, keep)
    assert (float(removed_tokens), float(removed_samples)) == (4.0, 1.0)
    assert obj.kept_total(o, den, float(removed_tokens), float(removed_samples)) == kept
    assert factor is not None
    expected = [1.0, 0.0, 1.0, 0.0, 0.0, 0.0] + [1.0] * 6
    if mode == "seq-mean-token-mean":  # 1 / kept tokens of the sample
        expected = [0.5, 0.0, 0.5, 0.0, 0.0, 0.0] + [1 / 3] * 6
    torch.testing.assert_close(factor, torch.tensor(expected))


def test_without_rejection_only_seq_mean_token_mean_has_factors() -> None:
    index = torch.tensor([0, 0, 1])
    f, rt, rs = obj.token_factors(ObjectiveSettings(), index, None)
    assert f is None and float(rt) == 0 and float(rs) == 0
    f, _, _ = obj.token_factors(ObjectiveSettings(loss_aggregation="seq-mean-token-mean"), index, None)
    assert f is not None
    torch.testing.assert_close(f, torch.tensor([0.5, 0.5, 1.0]))


# ------------------------------------------------------------------------------------- dynamic sampling


def test_zero_variance_groups() -> None:
    groups = ["a", "a", "b", "b", "c", "d", "d"]
    rewards = [1.0, 1.0, 0.0, 1.0, 0.5, 0.0, 0.0]
    assert obj.zero_variance_groups(groups, rewards) == {"a", "c", "d"}


# ------------------------------------------------------------------------------------------- settings


def test_defaults_are_the_default_loss_and_proto_zero_values_map_to_them() -> None:
    assert ObjectiveSettings().is_default_loss
    assert objective_from_proto(T.GrpoConfig()) == ObjectiveSettings()
    assert GrpoSettings.from_proto(T.GrpoConfig()).objective == ObjectiveSettings()


def test_proto_fields_reach_the_settings() -> None:
    g = T.GrpoConfig(
        loss_aggregation="seq-mean-token-mean",
        ratio_level="sequence",
        entropy_coef=0.01,
        advantage_estimator="rloo",
        overlong_buffer=4,
        overlong_max_tokens=32,
        correction="mis",
        correction_level="geometric",
        mis_low=0.0,
        mis_high=3.0,
        proximal="loglinear",
        dynamic_sampling=True,
        max_groups_per_batch=12,
    )
    o = GrpoSettings.from_proto(g).objective
    assert (o.loss_aggregation, o.ratio_level, o.advantage_estimator) == ("seq-mean-token-mean", "sequence", "rloo")
    assert (o.correction, o.correction_level, o.proximal) == ("mis", "geometric", "loglinear")
    assert (o.mis_low, o.mis_high, o.is_cap) == (0.0, 3.0, None)  # an explicit 0 is kept (optional field)
    assert (o.overlong_buffer, o.overlong_max_tokens, o.overlong_penalty) == (4, 32, 1.0)
    assert o.dynamic_sampling and o.max_groups_per_batch == 12 and o.entropy_coef == 0.01
    assert not o.is_default_loss
    assert ObjectiveSettings(correction="tis").cap == 2.0 and ObjectiveSettings(correction="decoupled").cap == 5.0


@pytest.mark.parametrize(
    ("fields", "field", "words"),
    [
        ({"loss_aggregation": "mean"}, "loss_aggregation", "unknown mode 'mean'"),
        ({"ratio_level": "seq"}, "ratio_level", "unknown mode"),
        ({"advantage_estimator": "ppo"}, "advantage_estimator", "unknown mode"),
        ({"correction": "is"}, "correction", "one of none, tis, mis, decoupled"),
        ({"correction_level": "batch"}, "correction_level", "unknown mode"),
        ({"proximal": "linear"}, "proximal", "unknown mode"),
        ({"is_cap": -1.0}, "is_cap", "> 0"),
        ({"is_cap": 0.0}, "is_cap", "> 0"),
        ({"is_cap": math.inf}, "is_cap", "finite"),
        ({"mis_low": -0.1}, "mis_low", ">= 0"),
        ({"mis_low": 3.0, "mis_high": 2.0}, "mis_low", "mis_low 3 > mis_high 2"),
        ({"mis_low": 1.5, "mis_high": 2.0}, "mis_low", "<= 1"),
        ({"mis_high": 0.8}, "mis_high", ">= 1"),
        ({"mis_high": math.nan}, "mis_high", "finite"),
        ({"entropy_coef": -0.01}, "entropy_coef", ">= 0"),
        ({"overlong_buffer": -1}, "overlong_buffer", ">= 0"),
        ({"overlong_buffer": 8, "overlong_max_tokens": 8}, "overlong_max_tokens", "> overlong_buffer"),
        ({"overlong_penalty": -1.0}, "overlong_penalty", "> 0"),
        ({"aggregation_length": -3}, "aggregation_length", ">= 0"),
        ({"loss_aggregation": "seq-mean-token-sum-norm"}, "aggregation_length", "constant length"),
        ({"max_groups_per_batch": -2}, "max_groups_per_batch", ">= 0"),
    ],
)
def test_bad_values_are_refused_naming_the_field(fields: dict[str, object], field: str, words: str) -> None:
    with pytest.raises(ObjectiveError) as err:
        GrpoSettings(objective=ObjectiveSettings(**fields))  # type: ignore[arg-type]
    assert err.value.field == field
    assert str(err.value).startswith(f"{field}: ")
    assert words in str(err.value)


def test_the_step_metrics_carry_the_off_policy_figures() -> None:
    from rollart.v1 import ledger_pb2
    from rollart_trainer import stepmetrics
    from rollart_trainer.grpo import StepStats

    st = StepStats(mismatch_kl=0.02, is_ratio_max=3.5, is_truncated_fraction=0.25, is_masked_fraction=0.1)
    m = T.StepMetrics()
    stepmetrics.fill(m, st, ledger_pb2.Batch(), multitask=False)
    assert m.extra["mismatch_kl"] == 0.02 and m.extra["is_ratio_max"] == 3.5
    assert m.extra["is_truncated_fraction"] == 0.25 and m.extra["is_masked_fraction"] == 0.1
    assert {"is_ratio_mean", "is_ratio_min", "ratio_min", "ratio_max", "overlong_penalty_mean"} <= set(m.extra)
