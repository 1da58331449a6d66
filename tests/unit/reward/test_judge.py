"""LLM judge: the prompt it builds, the verdicts it parses, the Generate request it sends."""

from __future__ import annotations

import pytest

from rollart.v1 import common_pb2 as c
from rollart_reward.scorers.base import InvalidRequest, ScorerFailure
from rollart_reward.scorers.judge import JudgeClient, JudgeSettings, build_messages, parse_verdict


def traj(*turns: tuple[str, str], **metadata: str) -> c.Trajectory:
    return c.Trajectory(
        trajectory_id="tj-7",
        task="judge",
        turns=[c.Turn(observation=o, action=a) for o, a in turns],
        metadata=metadata,
    )


def test_prompt_carries_question_reference_rubric_and_response():
    t = traj(("What is the capital of France?", "It is Paris."), answer="Paris")
    system, user = build_messages(t, {"rubric": "Accept the city name in any language."})
    assert system.role == "system" and user.role == "user"
    text = user.content
    assert "What is the capital of France?" in text  # question from the first observation
    assert "## Reference answer\nParis" in text
    assert "Accept the city name" in text
    assert "## Response to grade\nIt is Paris." in text
    assert "VERDICT: CORRECT" in text and "SCORE:" not in text
    # Order: question, reference, rubric, response, task.
    assert text.index("Question") < text.index("Reference") < text.index("Rubric") < text.index("Response")


def test_prompt_variants():
    t = traj(("turn one", "a1"), ("turn two", "final answer"), question="Explicit question")
    (_, user) = build_messages(t, {"scale": "score"})
    assert "Explicit question" in user.content and "turn one" in user.content  # earlier turns included
    assert "## Response to grade\nfinal answer" in user.content
    assert "SCORE: <0-10>" in user.content and "Reference answer" not in user.content
    long = traj(("q", "x" * 50_000))
    assert len(build_messages(long, {})[1].content) < 10_000  # clipped
    with pytest.raises(InvalidRequest, match="scale"):
        build_messages(t, {"scale": "stars"})
    with pytest.raises(InvalidRequest, match="no turns"):
        build_messages(traj(), {})


@pytest.mark.parametrize(
    "reply, reward",
    [
        ("The response matches.\nVERDICT: CORRECT", 1.0),
        ("Wrong city.\nVERDICT: INCORRECT", 0.0),
        ("verdict: correct", 1.0),
        ("**VERDICT: INCORRECT**", 0.0),
        # The last verdict line wins (a judge that changes its mind).
        ("VERDICT: CORRECT ... wait, no.\nVERDICT: INCORRECT", 0.0),
        ("VERDICT = PASS", 1.0),
    ],
)
def test_binary_verdicts(reply, reward):
    v = parse_verdict(reply, "binary")
    assert v.reward == reward and v.explanation.endswith(reply[-20:])


@pytest.mark.parametrize(
    "reply, reward", [("SCORE: 7", 0.7), ("Score: 10/10", 1.0), ("SCORE: 3/5", 0.6), ("SCORE: 15", 1.0)]
)
def test_score_verdicts(reply, reward):
    assert parse_verdict(reply, "score").reward == pytest.approx(reward)


@pytest.mark.parametrize(
    "reply, scale", [("I think it is right.", "binary"), ("VERDICT: CORRECT", "score"), ("", "binary")]
)
def test_unparseable_reply_is_a_retryable_failure_not_a_zero(reply, scale):
    with pytest.raises(ScorerFailure) as exc:
        parse_verdict(reply, scale)
    assert exc.value.cause == "judge_unparseable" and exc.value.retryable


def test_generate_request_uses_the_judge_route():
    client = JudgeClient("127.0.0.1:1", token="t", settings=JudgeSettings(route="judge-pool", max_tokens=64))
    req = client.request(traj(("q", "a"), answer="a"), {}, budget=5.0)
    assert req.task == "judge-pool" and req.trajectory_id == "tj-7/judge" and req.return_text
    assert req.sampling.max_tokens == 64 and req.sampling.temperature == 0.0
    assert [m.role for m in req.input.messages] == ["system", "user"]
    assert req.deadline.seconds > 0
    routed = client.request(traj(("q", "a")), {"judge_route": "big-judge", "max_tokens": "9"}, budget=5.0)
    assert routed.task == "big-judge" and routed.sampling.max_tokens == 9
    with pytest.raises(InvalidRequest, match="max_tokens"):
        client.request(traj(("q", "a")), {"max_tokens": "many"}, budget=5.0)
