"""The elastic pool of a real reward service: scale-up from zero, scale to zero, deadlines, killed workers."""

from __future__ import annotations

import os
import signal
import threading
import time

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration

from rollart.v1 import reward_pb2 as r

from .conftest import custom, start_reward, traj

SS = r.ScoreStatus
WS = r.RewardWorkerState
IDLE_S = 1.0


@pytest.fixture(scope="module")
def pool(module_services, module_channel):
    return start_reward(
        module_services,
        module_channel,
        ROLLART_POOL__MAX_WORKERS="2",
        ROLLART_POOL__IDLE_TIMEOUT_SECONDS=str(IDLE_S),
        ROLLART_POOL__PRELOAD="[]",
        ROLLART_POOL__CRASH_RETRIES="1",
        ROLLART_LLMPROXY="127.0.0.1:1",  # nothing listens there
    )


def score(pool, request, timeout=30):
    return pool.stub.Score(request, metadata=pool.md, timeout=timeout)


def at_zero(pool):
    return pool.wait_for(lambda st: not st.workers, timeout=IDLE_S * 6, what="pool at zero workers")


def in_background(fn):
    out: dict = {}
    thread = threading.Thread(target=lambda: out.setdefault("result", fn()), daemon=True)
    thread.start()
    return thread, out


def test_scale_up_from_zero_and_back_to_zero(pool):
    st = at_zero(pool)
    m = pool.metrics()
    assert st.min_workers == 0 and st.max_workers == 2
    assert sum(v for k, v in m.items() if k.startswith("rollart_reward_workers{")) == 0
    ups, downs = st.scale_ups, st.scale_downs

    # Three slow scorings at once: the pool starts two workers (its maximum), the third job waits in the queue.
    jobs = [custom(f"scale-{i}", "sleepy", seconds="1.0") for i in range(3)]
    thread, out = in_background(lambda: list(pool.stub.ScoreMany(iter(jobs), metadata=pool.md, timeout=30)))
    busy = pool.wait_for(
        lambda s: sum(w.state == WS.REWARD_WORKER_STATE_BUSY for w in s.workers) == 2, what="two busy workers"
    )
    assert busy.in_flight == 2 and busy.queued == 1 and busy.scale_ups == ups + 2
    m = pool.metrics()
    assert m['rollart_reward_workers{state="busy"}'] == 2 and m["rollart_reward_in_flight"] == 2
    assert m["rollart_reward_queue_depth"] == 1
    thread.join(30)
    results = out["result"]
    assert [res.status for res in results] == [SS.SCORE_STATUS_OK] * 3
    assert len({res.worker_id for res in results}) == 2 and pool.status().scale_ups == ups + 2
    # Queue time includes starting a worker from zero (and, for the third, waiting for a free one).
    assert all(res.queue_time.ToNanoseconds() > 50_000_000 for res in results)
    assert max(res.queue_time.ToNanoseconds() for res in results) > 900_000_000

    # Idle past the timeout: back to zero, and the metrics say so.
    st = at_zero(pool)
    assert st.scale_downs == downs + 2 and st.last_scale_at.seconds > 0
    m = pool.metrics()
    assert sum(v for k, v in m.items() if k.startswith("rollart_reward_workers{")) == 0
    assert m["rollart_reward_scale_ups_total"] >= ups + 2 and m["rollart_reward_scale_downs_total"] >= downs + 2


def test_min_workers_keeps_the_pool_warm(pool):
    at_zero(pool)
    st = pool.stub.ConfigurePool(
        r.ConfigureRewardPoolRequest(min_workers=1, max_workers=3, idle_timeout=Duration(nanos=500_000_000)),
        metadata=pool.md,
        timeout=5,
    )
    assert (st.min_workers, st.max_workers, st.idle_timeout.nanos) == (1, 3, 500_000_000)
    pool.wait_for(lambda s: [w.state for w in s.workers] == [WS.REWARD_WORKER_STATE_IDLE], what="one warm worker")
    time.sleep(1.2)  # well past the idle timeout
    assert len(pool.status().workers) == 1
    pool.stub.ConfigurePool(
        r.ConfigureRewardPoolRequest(min_workers=0, max_workers=2, idle_timeout=Duration(seconds=1)),
        metadata=pool.md,
        timeout=5,
    )
    at_zero(pool)


def test_a_scorer_past_its_deadline_is_killed_and_reported_as_timeout(pool):
    kills = pool.metrics().get("rollart_reward_worker_kills_total", 0)
    request = custom("slow-1", "sleepy", seconds="30")
    request.timeout.FromNanoseconds(600_000_000)
    t0 = time.monotonic()
    res = score(pool, request)
    assert time.monotonic() - t0 < 5
    assert (res.status, res.cause, res.retryable) == (SS.SCORE_STATUS_TIMEOUT, "deadline", True)
    assert "was killed" in res.error and not res.HasField("outcome")
    assert pool.metrics()["rollart_reward_worker_kills_total"] == kills + 1
    assert all(w.trajectory_id != "slow-1" for w in pool.status().workers)
    # The pool goes on, and a timeout is not cached: the same trajectory can be scored again.
    again = custom("slow-1", "sleepy", seconds="0")
    assert score(pool, again).status == SS.SCORE_STATUS_OK


def test_sigkill_of_a_worker_mid_score_is_retried_on_a_new_worker(pool):
    crashes = pool.metrics().get("rollart_reward_worker_crashes_total", 0)
    thread, out = in_background(lambda: score(pool, custom("victim", "sleepy", seconds="1.0", reward="0.25")))
    st = pool.wait_for(lambda s: any(w.trajectory_id == "victim" for w in s.workers), what="victim being scored")
    worker = next(w for w in st.workers if w.trajectory_id == "victim")
    os.kill(int(worker.handle), signal.SIGKILL)
    thread.join(30)
    res = out["result"]
    assert (res.status, res.outcome.reward, res.attempts) == (SS.SCORE_STATUS_OK, 0.25, 2)
    assert res.worker_id != worker.worker_id
    assert pool.metrics()["rollart_reward_worker_crashes_total"] == crashes + 1
    assert worker.worker_id not in {w.worker_id for w in pool.status().workers}


def test_a_scorer_that_kills_its_worker_fails_clearly(pool):
    res = score(pool, custom("crash-1", "crashy"))
    assert (res.status, res.cause, res.retryable, res.attempts) == (SS.SCORE_STATUS_FAILED, "worker_crashed", True, 2)
    assert "SIGKILL" in res.error and not res.HasField("outcome")
    # The service and its pool are fine.
    assert score(pool, custom("after-crash", "whoami")).status == SS.SCORE_STATUS_OK


def test_unreachable_judge_is_a_failure_not_a_zero(pool):
    res = score(pool, r.ScoreRequest(trajectory=traj("judge-down", "Paris", task="judge", answer="Paris")))
    assert (res.status, res.cause, res.retryable) == (SS.SCORE_STATUS_FAILED, "judge_unreachable", True)
    assert "UNAVAILABLE" in res.error


def test_unknown_method_and_health(pool, module_channel):
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    health = health_pb2_grpc.HealthStub(module_channel(pool.address))
    resp = health.Check(health_pb2.HealthCheckRequest(service="rollart.v1.Reward"), timeout=5)
    assert resp.status == health_pb2.HealthCheckResponse.SERVING
    raw = module_channel(pool.address).unary_unary("/rollart.v1.Reward/NoSuchMethod")
    with pytest.raises(grpc.RpcError) as exc:
        raw(b"", metadata=pool.md, timeout=5)
    assert exc.value.code() == grpc.StatusCode.UNIMPLEMENTED


def test_a_hung_worker_is_killed_at_the_budget_mid_score_or_before_it_reads_the_job(pool):
    """SIGSTOP (alive, answering nothing): mid-score, and while idle before a job too big for its pipe arrives
    (sending it blocks until the worker reads): both end at the job's budget with the worker killed."""
    kills = pool.metrics().get("rollart_reward_worker_kills_total", 0)
    request = custom("stopped-mid-score", "sleepy", seconds="0.5")
    request.timeout.FromNanoseconds(2_000_000_000)
    thread, out = in_background(lambda: score(pool, request))
    st = pool.wait_for(lambda s: any(w.trajectory_id == "stopped-mid-score" for w in s.workers), what="scoring")
    worker = next(w for w in st.workers if w.trajectory_id == "stopped-mid-score")
    os.kill(int(worker.handle), signal.SIGSTOP)
    thread.join(30)
    res = out["result"]
    assert (res.status, res.cause, res.retryable) == (SS.SCORE_STATUS_TIMEOUT, "deadline", True), res
    assert worker.worker_id not in {w.worker_id for w in pool.status().workers}

    pool.stub.ConfigurePool(r.ConfigureRewardPoolRequest(min_workers=1, max_workers=1), metadata=pool.md, timeout=5)
    try:
        st = pool.wait_for(lambda s: [w.state for w in s.workers] == [WS.REWARD_WORKER_STATE_IDLE], what="warm")
        os.kill(int(st.workers[0].handle), signal.SIGSTOP)
        big = custom("stopped-idle", "whoami")
        big.trajectory.metadata["padding"] = "x" * (4 << 20)  # far beyond a pipe's buffer
        big.timeout.FromNanoseconds(1_000_000_000)
        t0 = time.monotonic()
        res = score(pool, big)
        assert time.monotonic() - t0 < 10
        assert (res.status, res.cause) == (SS.SCORE_STATUS_TIMEOUT, "deadline"), res
        assert pool.metrics()["rollart_reward_worker_kills_total"] == kills + 2
        # the pool replaces it and goes on
        assert score(pool, custom("after-hang", "whoami")).status == SS.SCORE_STATUS_OK
    finally:
        pool.stub.ConfigurePool(
            r.ConfigureRewardPoolRequest(min_workers=0, max_workers=2, idle_timeout=Duration(seconds=1)),
            metadata=pool.md,
            timeout=5,
        )
