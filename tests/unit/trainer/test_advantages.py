"""Group-normalised GRPO advantages."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from rollart_trainer.grpo import group_advantages, group_indices  # noqa: E402


def reference(rewards: list[float], groups: list[str], normalize_std: bool, eps: float) -> np.ndarray:
    r = np.asarray(rewards, dtype=np.float64)
    out = np.zeros_like(r)
    for g in set(groups):
        m = np.array([x == g for x in groups])
        vals = r[m]
        if vals.size < 2 or np.all(vals == vals[0]):
            continue  # documented choice: no preference inside the group -> exactly 0
        dev = vals - vals.mean()
        out[m] = dev / (vals.std(ddof=1) + eps) if normalize_std else dev
    return out


def adv(rewards: list[float], groups: list[str], **kw: object) -> np.ndarray:
    gi = torch.from_numpy(group_indices(groups))
    return group_advantages(torch.tensor(rewards, dtype=torch.float64), gi, **kw).numpy()  # type: ignore[arg-type]


def test_matches_per_group_formula_with_interleaved_groups() -> None:
    rng = np.random.default_rng(0)
    groups = [f"g{int(x)}" for x in rng.integers(0, 7, 200)]
    rewards = rng.normal(size=200).round(1).tolist()
    for norm in (True, False):
        got = adv(rewards, groups, normalize_std=norm, eps=1e-6)
        np.testing.assert_allclose(got, reference(rewards, groups, norm, 1e-6), rtol=1e-12, atol=1e-12)


def test_normalised_groups_have_zero_mean_and_unit_std() -> None:
    rewards = [1.0, 0.0, 0.0, 1.0, 3.0, 5.0, 4.0]
    groups = ["a", "a", "a", "a", "b", "b", "b"]
    got = adv(rewards, groups, normalize_std=True, eps=0.0)
    for g in ("a", "b"):
        m = np.array([x == g for x in groups])
        assert abs(got[m].mean()) < 1e-12
        assert got[m].std(ddof=1) == pytest.approx(1.0)
    # affine changes of the reward inside a group do not change normalised advantages
    got2 = adv([10 * r + 3 for r in rewards], groups, normalize_std=True, eps=0.0)
    np.testing.assert_allclose(got, got2, atol=1e-12)


def test_constant_and_singleton_groups_get_exactly_zero() -> None:
    # 0.1 * 3 does not average back to exactly 0.1 in floating point: the deviation would be ~1e-17 and
    # dividing it by eps would give a spurious advantage. The documented choice is exactly 0.
    rewards = [0.1, 0.1, 0.1, 0.7, 1.0, 0.0]
    groups = ["c", "c", "c", "single", "x", "x"]
    got = adv(rewards, groups, normalize_std=True, eps=1e-6)
    assert np.all(got[:4] == 0.0)
    assert got[4] > 0 > got[5]
    assert got[4] == pytest.approx(-got[5])


def test_without_std_normalisation_advantage_is_reward_minus_group_mean() -> None:
    got = adv([1.0, 0.0, 0.5, 2.0, 4.0], ["a", "a", "a", "b", "b"], normalize_std=False)
    np.testing.assert_allclose(got, [0.5, -0.5, 0.0, -1.0, 1.0], atol=1e-12)


def test_group_indices_are_dense_in_first_appearance_order() -> None:
    assert group_indices(["z", "a", "z", "m", "a"]).tolist() == [0, 1, 0, 2, 1]
