"""The warm start's FrozenLake dialogs are the ones the envmanager's loops produce.

The warm start plays gymnasium's FrozenLake itself (the tooling imports no service), so its text must stay
word for word the envmanager's wrapper (``gymnasium:FrozenLake-v1``): the policy is warm-started on the
observations it later sees. Both are played side by side here, move for move.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from rollart_devtools.warmstart import ACTIONS, FrozenLakeText, expert_moves, frozenlake_dialogs
from rollart_envmanager.envs.gymnasium_env import FrozenLakeTextEnv


@pytest.mark.parametrize(
    "options",
    [{}, {"map_name": "8x8"}, {"desc": "SFFF,FHFH,FFFH,HFFG"}, {"is_slippery": "true"}],
    ids=["4x4", "8x8", "desc", "slippery"],
)
def test_text_is_the_envmanagers_word_for_word(options: dict[str, str]) -> None:
    ours, theirs = FrozenLakeText(**options), FrozenLakeTextEnv(**options)
    assert ours.system_prompt == theirs.system_prompt
    rng = random.Random(7)
    steps = 0
    for episode in range(40):
        assert ours.reset(seed=episode) == theirs.reset(seed=episode)
        assert (ours.desc, ours.ncol) == (theirs.desc, theirs.ncol)
        for _ in range(12):
            move = rng.randrange(4)
            observation, reward, done = ours.step(move)
            res = theirs.step(ACTIONS[move])
            steps += 1
            assert (observation, reward, done) == (res.observation, res.reward, res.done)
            assert ours.state == theirs.state
            if done:
                break
    assert steps > 100


def test_expert_moves_lead_to_the_goal() -> None:
    env = FrozenLakeText()
    env.reset(seed=0)
    for _ in range(6):  # the default 4x4 lake is 6 moves from S to G
        row, col = divmod(env.state, env.ncol)
        best = expert_moves(env.desc, row, col)
        assert best
        _, reward, done = env.step(best[0])
    assert done and reward == 1.0
    assert expert_moves(env.desc, 1, 1) == []  # a hole: no way to the goal


def test_dialogs_are_deterministic_and_framed_as_the_envmanager_frames_turns() -> None:
    a, rate_a = frozenlake_dialogs(50, p_expert=0.4, max_turns=8, options={}, seed=0)
    b, rate_b = frozenlake_dialogs(50, p_expert=0.4, max_turns=8, options={}, seed=0)
    assert a == b and rate_a == rate_b
    for msgs in a:
        assert [m["role"] for m in msgs[:2]] == ["system", "user"]
        assert all(m["role"] == "assistant" for m in msgs[2::2]) and all(m["role"] == "user" for m in msgs[3::2])
        assert {m["content"] for m in msgs[2::2]} <= set(ACTIONS)
        assert len(msgs[2::2]) <= 8
    expert, rate = frozenlake_dialogs(20, p_expert=1.0, max_turns=8, options={}, seed=0)
    assert rate == 1.0
    assert all(d[-1]["role"] == "assistant" for d in expert)  # the expert always ends the episode at G


# ---------------------------------------------------------------------------------------- multi-task mix

ARITH = {
    "config": '{"allow_negation": false, "allow_parentheses": false, "max_digits": 1, "max_terms": 2, '
    '"min_digits": 1, "min_terms": 2, "operators": ["+"]}'
}


def test_reasoning_gym_text_is_the_envmanagers_word_for_word() -> None:
    from rollart_devtools import warmstart as ws
    from rollart_envmanager.envs import reasoning_gym_env as rge

    assert (ws.RG_SYSTEM_PROMPT, ws.RG_INSTRUCTION) == (rge.SYSTEM_PROMPT, rge.INSTRUCTION)
    env = rge.ReasoningGymEnv("basic_arithmetic", **ARITH)
    whole = ws._rg_whole("basic_arithmetic", 40, ARITH)
    assert whole is not None  # this generator's entries do not depend on the dataset size
    for seed in (0, 7, 39):
        question, answer = ws.rg_question("basic_arithmetic", seed, ARITH, whole)
        assert env.reset(seed=seed) == question and env.metadata["answer"] == answer


def test_mixed_dialogs_answer_in_tags_with_the_experts_rate() -> None:
    from rollart_devtools import warmstart as ws

    docs, rate = ws.task_dialogs(
        {"task": "reasoning_gym:basic_arithmetic", "episodes": 200, "p_expert": 0.3, "options": ARITH}, seed=0
    )
    assert docs == ws.task_dialogs(
        {"task": "reasoning_gym:basic_arithmetic", "episodes": 200, "p_expert": 0.3, "options": ARITH}, seed=0
    )[0]
    assert 0.2 < rate < 0.4 and all([m["role"] for m in d] == ["system", "user", "assistant"] for d in docs)
    right = 0
    for d in docs:
        said = d[2]["content"]
        assert said.startswith("<answer>") and said.endswith("</answer>")
        a, b = (int(x) for x in d[1]["content"].split("Calculate ")[1].split(".")[0].split(" + "))
        right += said == f"<answer>{a + b}</answer>"
    assert right / len(docs) == rate  # a wrong answer is never the right one by chance
    few, _ = ws.task_dialogs(
        {"task": "reasoning_gym:basic_arithmetic", "episodes": 50, "options": dict(ARITH, size="5")}, seed=0
    )
    assert len({d[1]["content"] for d in few}) == 5  # the environment's size option: entry = seed mod size
    with pytest.raises(ValueError, match="unknown warm-start task"):
        ws.task_dialogs({"task": "chess"}, seed=0)
    with pytest.raises(ValueError, match="reasoning-gym tasks go in a mix"):
        ws.build(Path("/nonexistent"), task="reasoning_gym:basic_arithmetic")
