"""The warm start's FrozenLake dialogs are the ones the envmanager's loops produce.

The warm start plays gymnasium's FrozenLake itself (the tooling imports no service), so its text must stay
word for word the envmanager's wrapper (``gymnasium:FrozenLake-v1``): the policy is warm-started on the
observations it later sees. Both are played side by side here, move for move.
"""

from __future__ import annotations

import random

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
