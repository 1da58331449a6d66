"""The reward service as a real process: every scorer, the code sandbox, idempotency, bad and unauthenticated
requests, streaming. One service for the module (workers stay warm); pool scaling is in test_pool.py."""

from __future__ import annotations

import os
import time
from pathlib import Path

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration

from rollart.v1 import common_pb2 as c
from rollart.v1 import reward_pb2 as r

from .conftest import custom, start_reward, traj

SS = r.ScoreStatus


@pytest.fixture(scope="module")
def rs(module_services, module_channel, fake_proxy):
    return start_reward(
        module_services,
        module_channel,
        ROLLART_POOL__MAX_WORKERS="2",
        ROLLART_POOL__IDLE_TIMEOUT_SECONDS="60",
        ROLLART_LLMPROXY=fake_proxy.address,
    )


def score(rs, request, timeout=30):
    return rs.stub.Score(request, metadata=rs.md, timeout=timeout)


def req(t: c.Trajectory, **kw) -> r.ScoreRequest:
    return r.ScoreRequest(trajectory=t, **kw)


def secs(s: float) -> Duration:
    d = Duration()
    d.FromNanoseconds(int(s * 1e9))
    return d


def code_of(call) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as exc:
        call()
    return exc.value.code(), exc.value.details()


# ------------------------------------------------------------------------------------------ auth and bad input


def test_unauthenticated_calls_are_rejected(rs):
    good = req(traj("auth-1", "\\boxed{1}", answer="1"))
    for md in ([], [("authorization", "Bearer not-the-token")]):
        code, _ = code_of(lambda md=md: rs.stub.Score(good, metadata=md, timeout=5))
        assert code == grpc.StatusCode.UNAUTHENTICATED
        code, _ = code_of(lambda md=md: list(rs.stub.ScoreMany(iter([good]), metadata=md, timeout=5)))
        assert code == grpc.StatusCode.UNAUTHENTICATED
        code, _ = code_of(lambda md=md: rs.stub.GetPoolStatus(r.RewardPoolStatusRequest(), metadata=md, timeout=5))
        assert code == grpc.StatusCode.UNAUTHENTICATED
    assert rs.status().scored_total == 0  # nothing was scored for them


@pytest.mark.parametrize(
    "request_, needle",
    [
        (req(traj("", "\\boxed{1}", answer="1")), "trajectory_id: is required"),
        (req(traj("bad-task", "1", task="poetry")), "cannot derive a scorer"),
        (req(traj("bad-kind", "1"), spec=c.RewardSpec(kind=42)), "unknown scorer kind"),
        (
            req(
                c.Trajectory(
                    trajectory_id="infra",
                    task="math",
                    status=c.TRAJECTORY_STATUS_INFRA_FAILURE,
                    failure_cause="sandbox crashed",
                )
            ),
            "INFRA_FAILURE (sandbox crashed)",
        ),
        (req(traj("too-long", "1", answer="1"), timeout=secs(10_000)), "exceeds the maximum"),
        (req(traj("negative", "1", answer="1"), timeout=Duration(seconds=-1)), "negative"),
        (custom("no-such", "not-registered"), "no custom scorer named"),
        # Found out inside the worker: the scorer's own validation.
        (req(traj("no-gold", "\\boxed{1}")), "no gold answer"),
        (req(traj("no-ds", "1", task="rg:no_such_dataset", seed="1", index="0")), "unknown reasoning-gym dataset"),
        (req(traj("no-tests", "def f(): pass", task="code")), "no pytest file"),
        (req(traj("bad-file", "x", task="code", tests="def test(): pass", test_file="../x.py")), "test_file"),
    ],
)
def test_invalid_requests_are_invalid_argument(rs, request_, needle):
    code, details = code_of(lambda: score(rs, request_))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and needle in details


def test_malformed_bytes_and_bad_pool_settings(rs, module_channel):
    raw = module_channel(rs.address).unary_unary("/rollart.v1.Reward/Score")
    code, details = code_of(lambda: raw(b"\xff\xff\xff", metadata=rs.md, timeout=5))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "malformed" in details
    for bad in (
        r.ConfigureRewardPoolRequest(min_workers=0, max_workers=0),
        r.ConfigureRewardPoolRequest(min_workers=3, max_workers=2),
        r.ConfigureRewardPoolRequest(min_workers=-1, max_workers=2),
        r.ConfigureRewardPoolRequest(max_workers=2, idle_timeout=Duration(seconds=-5)),
        # Out-of-range durations (were UNKNOWN "Value out of range"): INVALID_ARGUMENT naming the field.
        r.ConfigureRewardPoolRequest(max_workers=2, idle_timeout=Duration(seconds=2**63 - 1)),
        r.ConfigureRewardPoolRequest(max_workers=2, idle_timeout=Duration(nanos=-5)),
        r.ConfigureRewardPoolRequest(max_workers=2, idle_timeout=Duration(seconds=8 * 24 * 3600)),
    ):
        code, _ = code_of(lambda bad=bad: rs.stub.ConfigurePool(bad, metadata=rs.md, timeout=5))
        assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert rs.status().max_workers == 2  # unchanged


# ------------------------------------------------------------------------------------------------- scorers


def test_math_is_scored_in_worker_processes(rs):
    right = score(rs, req(traj("math-right", "so \\boxed{\\frac{1}{2}}", answer="0.5")))
    wrong = score(rs, req(traj("math-wrong", "so \\boxed{\\frac{1}{3}}", answer="0.5")))
    assert (right.status, right.outcome.reward, right.outcome.components["correct"]) == (SS.SCORE_STATUS_OK, 1.0, 1.0)
    assert (wrong.status, wrong.outcome.reward) == (SS.SCORE_STATUS_OK, 0.0)
    assert right.outcome.spec.kind == c.SCORER_KIND_MATH and right.outcome.trajectory_id == "math-right"
    assert right.worker_id and right.attempts == 1 and right.outcome.scoring_time.ToNanoseconds() > 0
    # math-verify ran in a pool worker: a child process of the service, not the service itself.
    workers = {w.worker_id: int(w.handle) for w in rs.status().workers}
    pid = workers[right.worker_id]
    assert pid != rs.pid
    assert b"rollart_reward.worker" in Path(f"/proc/{pid}/cmdline").read_bytes()
    assert int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1]) == rs.pid


def test_reasoning_gym_scorer(rs):
    import reasoning_gym

    entry = reasoning_gym.create_dataset("chain_sum", seed=5, size=4)[3]
    meta = {"seed": "5", "index": "3"}
    right = score(rs, req(traj("rg-right", f"<answer>{entry['answer']}</answer>", task="rg:chain_sum", **meta)))
    wrong = score(rs, req(traj("rg-wrong", "<answer>-99999</answer>", task="rg:chain_sum", **meta)))
    assert (right.status, right.outcome.reward) == (SS.SCORE_STATUS_OK, 1.0)
    assert wrong.status == SS.SCORE_STATUS_OK and wrong.outcome.reward < 1.0
    assert right.outcome.spec.scorer == "chain_sum"


def test_game_outcome(rs):
    t = traj("game-1", "left", task="gem:game:Sokoban-v0")
    t.turns.add(observation="o", action="right", env_reward=1.0)
    t.turns[0].env_reward = -0.5
    summed = score(rs, req(t))
    assert (summed.status, summed.outcome.reward) == (SS.SCORE_STATUS_OK, 0.5)
    t.trajectory_id = "game-2"
    won = score(
        rs, req(t, spec=c.RewardSpec(kind=c.SCORER_KIND_GAME, options={"aggregate": "last", "success_threshold": "1"}))
    )
    assert won.outcome.reward == 1.0 and won.outcome.components["won"] == 1.0
    assert won.worker_id == ""  # cheap: scored in the service, not in the pool


TESTS = "from solution import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n\n\ndef test_zero():\n    assert add(0, 0) == 0\n"
ESCAPE = "/work/main/.reward-sandbox-escape" if Path("/work/main").is_dir() else "/var/tmp/.reward-sandbox-escape"
CANDIDATES = {
    "right": ("```python\ndef add(a, b):\n    return a + b\n```", SS.SCORE_STATUS_OK, ""),
    "wrong": ("```python\ndef add(a, b):\n    return a * b\n```", SS.SCORE_STATUS_OK, ""),
    "network": (
        "import socket\n\ndef add(a, b):\n    socket.create_connection(('1.1.1.1', 53), timeout=2)\n    return a + b\n",
        SS.SCORE_STATUS_FAILED,
        "network_denied",
    ),
    "escape": (
        f"def add(a, b):\n    open({ESCAPE!r}, 'w').write('out')\n    return a + b\n",
        SS.SCORE_STATUS_FAILED,
        "write_denied",
    ),
    "forkbomb": (
        "import os\n\ndef add(a, b):\n    while True:\n        os.fork()\n",
        SS.SCORE_STATUS_FAILED,
        "process_limit",
    ),
    "membomb": (
        "def add(a, b):\n    hog = bytearray(64 * 1024 ** 3)\n    return a + b\n",
        SS.SCORE_STATUS_FAILED,
        "memory_limit",
    ),
    "loop": ("def add(a, b):\n    while True:\n        pass\n", SS.SCORE_STATUS_TIMEOUT, "time_limit"),
}


def test_code_in_the_sandbox_right_wrong_and_contained(rs):
    requests = [
        req(traj(f"code-{name}", action, task="code", tests=TESTS), timeout=secs(6.0))
        for name, (action, _, _) in CANDIDATES.items()
    ]
    # File names recorded by the EnvManager's code tasks are honoured.
    named = traj(
        "code-named",
        "def add(a, b):\n    return a + b\n",
        task="code:builtin",
        tests=TESTS.replace("from solution", "from impl"),
        solution_file="impl.py",
        test_file="test_impl.py",
    )
    requests.append(req(named, timeout=secs(6.0)))
    t0 = time.monotonic()
    results = {res.trajectory_id: res for res in rs.stub.ScoreMany(iter(requests), metadata=rs.md, timeout=60)}
    assert results["code-named"].outcome.reward == 1.0
    assert time.monotonic() - t0 < 60
    for name, (_, status, cause) in CANDIDATES.items():
        res = results[f"code-{name}"]
        assert (res.status, res.cause) == (status, cause), f"{name}: {res}"
    assert results["code-right"].outcome.reward == 1.0
    assert results["code-wrong"].outcome.reward == 0.0 and "assert 6 == 5" in results["code-wrong"].outcome.explanation
    assert "Network is unreachable" in results["code-network"].error
    assert "Read-only file system" in results["code-escape"].error
    assert "MemoryError" in results["code-membomb"].error
    assert "time budget" in results["code-loop"].error and results["code-loop"].retryable
    assert not results["code-forkbomb"].retryable and not os.path.exists(ESCAPE)
    # Sandbox violations are failures, never a zero reward, and never cached.
    assert all(
        not results[f"code-{n}"].HasField("outcome") for n in ("network", "escape", "forkbomb", "membomb", "loop")
    )
    again = score(rs, requests[2])
    assert again.status == SS.SCORE_STATUS_FAILED and not again.cached


def test_llm_judge_through_the_llmproxy(rs, fake_proxy):
    t = traj("judge-1", "It is Paris.", task="judge", answer="Paris", question="What is the capital of France?")
    res = score(rs, req(t, spec=c.RewardSpec(kind=c.SCORER_KIND_LLM_JUDGE, options={"rubric": "City name only."})))
    assert (res.status, res.outcome.reward) == (SS.SCORE_STATUS_OK, 1.0)
    sent = fake_proxy.requests[-1]
    assert sent.task == "judge" and sent.trajectory_id == "judge-1/judge" and sent.return_text
    prompt = sent.input.messages[-1].content
    assert "What is the capital of France?" in prompt and "It is Paris." in prompt and "City name only." in prompt
    assert fake_proxy.metadata[-1]["authorization"].endswith("test-job-token-0123456789")
    try:
        fake_proxy.reply = "Not the same city.\nVERDICT: INCORRECT"
        assert score(rs, req(traj("judge-2", "Lyon", task="judge", answer="Paris"))).outcome.reward == 0.0
        fake_proxy.reply = "I cannot decide."
        res = score(rs, req(traj("judge-3", "Lyon", task="judge", answer="Paris")))
        assert (res.status, res.cause, res.retryable) == (SS.SCORE_STATUS_FAILED, "judge_unparseable", True)
    finally:
        fake_proxy.reply = "The response agrees with the reference.\nVERDICT: CORRECT"


def test_list_scorers(rs):
    scorers = rs.stub.ListScorers(r.ListScorersRequest(), metadata=rs.md, timeout=5).scorers
    kinds = {s.kind: s for s in scorers if s.kind != c.SCORER_KIND_CUSTOM}
    assert set(kinds) == {
        c.SCORER_KIND_MATH,
        c.SCORER_KIND_REASONING_GYM,
        c.SCORER_KIND_CODE,
        c.SCORER_KIND_GAME,
        c.SCORER_KIND_LLM_JUDGE,
    }
    assert all(s.available and s.description for s in kinds.values())
    assert "answer_field" in kinds[c.SCORER_KIND_MATH].options
    assert {s.name for s in scorers if s.kind == c.SCORER_KIND_CUSTOM} == {"sleepy", "crashy", "whoami"}


# ------------------------------------------------------------------------------------ idempotency, streaming


def test_same_trajectory_id_twice_returns_the_first_answer(rs):
    first = score(rs, custom("idem-1", "whoami"))
    before = rs.status().scored_total
    # Same id, different request: the first answer comes back, nothing is scored again.
    again = score(rs, custom("idem-1", "sleepy", seconds="0", reward="0"))
    assert first.status == SS.SCORE_STATUS_OK and not first.cached
    assert again.cached and again.outcome == first.outcome and again.outcome.reward == 1.0
    # Concurrent duplicates in one stream: scored once, the second one shares the answer.
    dupes = [custom("idem-2", "sleepy", seconds="0.5"), custom("idem-2", "sleepy", seconds="0.5")]
    results = list(rs.stub.ScoreMany(iter(dupes), metadata=rs.md, timeout=30))
    assert [res.trajectory_id for res in results] == ["idem-2", "idem-2"]
    assert sorted(res.cached for res in results) == [False, True]
    assert results[0].outcome == results[1].outcome
    assert rs.status().scored_total == before + 1
    assert rs.status().cache_hits >= 2


def test_score_many_answers_as_each_finishes_and_survives_bad_items(rs):
    items = [
        custom("stream-slow", "sleepy", seconds="1.5"),
        req(traj("", "1")),  # invalid: no trajectory id
        custom("stream-fast", "whoami"),
    ]
    results = list(rs.stub.ScoreMany(iter(items), metadata=rs.md, timeout=30))
    assert [res.trajectory_id for res in results] == ["", "stream-fast", "stream-slow"]
    assert results[0].status == SS.SCORE_STATUS_INVALID and "trajectory_id" in results[0].error
    assert all(res.status == SS.SCORE_STATUS_OK for res in results[1:])


def test_call_deadline_is_deadline_exceeded(rs):
    t0 = time.monotonic()
    code, _ = code_of(lambda: score(rs, custom("deadline-1", "sleepy", seconds="20"), timeout=0.7))
    assert code == grpc.StatusCode.DEADLINE_EXCEEDED and time.monotonic() - t0 < 3
    # The scoring stopped with the call: its worker was killed, not left sleeping for 20 s.
    rs.wait_for(lambda st: all(w.trajectory_id != "deadline-1" for w in st.workers), timeout=5, what="worker freed")
