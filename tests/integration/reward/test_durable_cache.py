"""Idempotency across a restart: with Redis configured, a SIGKILLed and restarted service still answers a
trajectory it scored before with that first answer."""

from __future__ import annotations

import os
import signal
import time

from rollart.local.processes import pid_alive
from rollart.v1 import reward_pb2 as r

from .conftest import custom, start_reward


def test_first_answer_survives_a_restart(services, channel_factory, redis_url):
    env = {"ROLLART_REDIS_URL": redis_url, "ROLLART_POOL__PRELOAD": "[]"}
    first_service = start_reward(services, channel_factory, **env)
    first = first_service.stub.Score(custom("durable-1", "whoami"), metadata=first_service.md, timeout=30)
    assert first.status == r.SCORE_STATUS_OK and not first.cached
    worker_pids = [int(w.handle) for w in first_service.status().workers]
    assert worker_pids
    os.kill(first_service.pid, signal.SIGKILL)  # the service alone: no graceful anything
    first_service.proc.proc.wait(10)
    # Its pool workers die with it (parent-death signal), they are not left behind.
    deadline = time.monotonic() + 5
    while any(pid_alive(p) for p in worker_pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(pid_alive(p) for p in worker_pids)

    second_service = start_reward(services, channel_factory, **env)
    again = second_service.stub.Score(
        custom("durable-1", "sleepy", seconds="0", reward="0"), metadata=second_service.md, timeout=30
    )
    assert again.cached and again.outcome == first.outcome  # same reward, same explanation (the old worker's pid)
    assert second_service.status().scored_total == 0
    fresh = second_service.stub.Score(custom("durable-2", "whoami"), metadata=second_service.md, timeout=30)
    assert fresh.status == r.SCORE_STATUS_OK and not fresh.cached
