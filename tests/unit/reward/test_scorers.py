"""The scorers as functions: right and wrong answers, bad input, scorer resolution."""

from __future__ import annotations

import json

import pytest

from rollart.v1 import common_pb2 as c
from rollart_reward.scorers import game, registry
from rollart_reward.scorers import math as math_scorer
from rollart_reward.scorers import reasoning_gym as rg_scorer
from rollart_reward.scorers.base import FAILED, OK, TIMEOUT, InvalidRequest, ScorerFailure

SK = c.ScorerKind


def traj(action: str = "", task: str = "math", turns: int = 1, rewards=(), **metadata: str) -> c.Trajectory:
    t = c.Trajectory(trajectory_id="t-1", task=task, metadata=metadata)
    for i in range(turns):
        t.turns.append(c.Turn(observation=f"obs {i}", action=action, env_reward=rewards[i] if rewards else 0.0))
    return t


# ------------------------------------------------------------------------------------------------------ math


@pytest.mark.parametrize(
    "answer, gold, reward",
    [
        ("The answer is \\boxed{\\frac{1}{2}}", "0.5", 1.0),
        ("so we get $x^2+2x+1$", "(x+1)^2", 1.0),
        ("Final: 42", "$42$", 1.0),
        ("\\boxed{41}", "42", 0.0),
        ("\\boxed{x^2+1}", "(x+1)^2", 0.0),
    ],
)
def test_math_right_and_wrong(answer, gold, reward):
    v = math_scorer.score(traj(answer, answer=gold), {}, budget=10)
    assert v.status == OK and v.reward == reward
    assert v.components["correct"] == reward and v.components["parsed"] == 1.0


def test_math_unparseable_answer_is_a_wrong_answer_not_a_failure():
    v = math_scorer.score(traj("I do not know", answer="7"), {}, budget=10)
    assert v.status == OK and v.reward == 0.0 and v.components["parsed"] == 0.0


def test_math_needs_a_gold_answer_and_a_turn():
    with pytest.raises(InvalidRequest, match="gold answer"):
        math_scorer.score(traj("\\boxed{1}"), {}, budget=10)
    with pytest.raises(InvalidRequest, match="no turns"):
        math_scorer.score(traj(turns=0, answer="1"), {}, budget=10)
    # answer_field picks another metadata key.
    v = math_scorer.score(traj("\\boxed{3}", solution="3"), {"answer_field": "solution"}, budget=10)
    assert v.reward == 1.0


# --------------------------------------------------------------------------------------------- reasoning-gym


def _rg_entry(name: str, seed: int, index: int, **config):
    import reasoning_gym

    return reasoning_gym.create_dataset(name, seed=seed, size=index + 1, **config)[index]


def test_reasoning_gym_rebuilds_the_entry_and_uses_its_scorer():
    entry = _rg_entry("basic_arithmetic", 11, 5)
    meta = {"dataset": "basic_arithmetic", "seed": "11", "index": "5", "question": entry["question"]}
    right = rg_scorer.score(traj(f"thinking... <answer>{entry['answer']}</answer>", **meta), "", {}, 5)
    wrong = rg_scorer.score(traj("<answer>123456789</answer>", **meta), "", {}, 5)
    assert right.status == OK and right.reward == 1.0
    assert wrong.status == OK and wrong.reward < 1.0
    # The dataset may also come from the spec (the task tag's name), and generator arguments from metadata.
    entry2 = _rg_entry("leg_counting", 3, 2, min_animals=2, max_animals=3)
    meta2 = {"seed": "3", "index": "2", "dataset_config": json.dumps({"min_animals": 2, "max_animals": 3})}
    assert rg_scorer.score(traj(entry2["answer"], **meta2), "leg_counting", {}, 5).reward == 1.0
    # check_question catches a trajectory whose recorded question is not what (seed, index) generates.
    bad = {**meta, "question": "what is 1+1?"}
    with pytest.raises(InvalidRequest, match="regenerate"):
        rg_scorer.score(traj(entry["answer"], **bad), "", {"check_question": "true"}, 5)


def test_reasoning_gym_bad_requests():
    with pytest.raises(InvalidRequest, match="unknown reasoning-gym dataset"):
        rg_scorer.score(traj("1", dataset="no_such_dataset", seed="1", index="0"), "", {}, 5)
    with pytest.raises(InvalidRequest, match="'seed' must be an integer"):
        rg_scorer.score(traj("1", dataset="basic_arithmetic", seed="x", index="0"), "", {}, 5)
    with pytest.raises(InvalidRequest, match="no reasoning-gym dataset"):
        rg_scorer.score(traj("1", seed="1", index="0"), "", {}, 5)
    with pytest.raises(InvalidRequest, match="dataset_config"):
        rg_scorer.score(traj("1", dataset="basic_arithmetic", seed="1", index="0", dataset_config="[1"), "", {}, 5)


def test_answer_extraction():
    assert rg_scorer.extract("a <answer> 1 </answer> b <answer>2</answer>", "answer") == "2"
    assert rg_scorer.extract("  plain ", "answer") == "plain"
    assert rg_scorer.extract("<answer>x</answer>", "none") == "<answer>x</answer>"


# ------------------------------------------------------------------------------------------------------ game


def test_game_aggregates_env_rewards():
    t = traj("move", task="gem:game:Sokoban-v0", turns=3, rewards=[0.0, -0.1, 1.0])
    assert game.score(t, {}).reward == pytest.approx(0.9)
    assert game.score(t, {"aggregate": "last"}).reward == 1.0
    assert game.score(t, {"aggregate": "max"}).reward == 1.0
    assert game.score(t, {"aggregate": "mean"}).reward == pytest.approx(0.3)
    won = game.score(t, {"success_threshold": "0.5"})
    lost = game.score(t, {"success_threshold": "1.5"})
    assert (won.reward, won.components["won"]) == (1.0, 1.0) and (lost.reward, lost.components["won"]) == (0.0, 0.0)
    closed = traj("x", task="textarena:TicTacToe", turns=2, final_reward="-1")
    assert game.score(closed, {"metadata_field": "final_reward"}).reward == -1.0


def test_game_bad_requests():
    with pytest.raises(InvalidRequest, match="aggregate"):
        game.score(traj("x", rewards=[1.0]), {"aggregate": "median"})
    with pytest.raises(InvalidRequest, match="no turns"):
        game.score(traj(turns=0), {})
    with pytest.raises(InvalidRequest, match="number"):
        game.score(traj("x", rewards=[1.0]), {"success_threshold": "high"})


# ------------------------------------------------------------------------------------------------- registry


@pytest.mark.parametrize(
    "task, metadata, kind, name",
    [
        ("math", {}, SK.SCORER_KIND_MATH, ""),
        ("math:gsm8k", {}, SK.SCORER_KIND_MATH, ""),
        ("rg:basic_arithmetic", {}, SK.SCORER_KIND_REASONING_GYM, "basic_arithmetic"),
        ("reasoning_gym:chain_sum", {}, SK.SCORER_KIND_REASONING_GYM, "chain_sum"),
        ("code:humaneval", {}, SK.SCORER_KIND_CODE, ""),
        ("gem:game:Sokoban-v0", {}, SK.SCORER_KIND_GAME, ""),
        ("textarena:TicTacToe-v0", {}, SK.SCORER_KIND_GAME, ""),
        ("swe:repo1", {}, SK.SCORER_KIND_GAME, ""),
        ("judge", {}, SK.SCORER_KIND_LLM_JUDGE, ""),
        ("whatever", {"reward_kind": "custom", "reward_scorer": "mine"}, SK.SCORER_KIND_CUSTOM, "mine"),
    ],
)
def test_scorer_derived_from_the_trajectory(task, metadata, kind, name):
    spec = registry.resolve(traj("x", task=task, **metadata), c.RewardSpec())
    assert (spec.kind, spec.scorer) == (kind, name)


def test_explicit_spec_wins_and_unknown_tasks_are_invalid():
    spec = registry.resolve(traj("x", task="math"), c.RewardSpec(kind=SK.SCORER_KIND_GAME, options={"a": "b"}))
    assert spec.kind == SK.SCORER_KIND_GAME and spec.options["a"] == "b"
    with pytest.raises(InvalidRequest, match="cannot derive"):
        registry.resolve(traj("x", task="unknown-task"), c.RewardSpec())
    with pytest.raises(InvalidRequest, match="reward_kind"):
        registry.resolve(traj("x", task="math", reward_kind="magic"), c.RewardSpec())
    with pytest.raises(InvalidRequest, match="unknown scorer kind"):
        registry.resolve(traj("x"), c.RewardSpec(kind=99))


def test_scorer_failure_is_never_a_reward():
    failure = ScorerFailure("judge_unreachable", "down", retryable=True).verdict()
    timeout = ScorerFailure("math_verify_timeout", "slow", timeout=True).verdict()
    assert (failure.status, failure.retryable) == (FAILED, True)
    assert timeout.status == TIMEOUT
