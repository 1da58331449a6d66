"""Each job's share of a full fleet (rollart_llmproxy.shares): work-conserving while slots are free, weighted
once the fleet is full; waits end with a slot of the job's own, the deadline or an abort."""

from __future__ import annotations

import asyncio
import time

import pytest

from rollart_llmproxy.config import LLMProxyConfig
from rollart_llmproxy.shares import JobShares, ShareTimeout


def later(seconds: float = 5.0) -> float:
    return time.monotonic() + seconds


async def test_off_never_waits():
    s = JobShares(0)
    for _ in range(100):
        assert await s.acquire("a", later()) < 0.01


async def test_a_job_alone_takes_every_slot_then_another_gets_its_share():
    s = JobShares(4, {"a": 3.0, "b": 1.0})
    for _ in range(4):
        await s.acquire("a", later())  # the fleet was free: a may take it all
    assert s.must_wait("a")  # full, and a (alone: its share is every slot) at its share
    await asyncio.wait_for(s.acquire("b", later()), 1)  # b below its share (1): in at once
    second_b = asyncio.ensure_future(s.acquire("b", later()))
    await asyncio.sleep(0.05)
    assert not second_b.done() and s.limit("b") == 1 and s.limit("a") == 3
    s.release("a")  # still full (a 3 + b 1): b stays at its share
    await asyncio.sleep(0.05)
    assert not second_b.done()
    s.release("b")  # b's own turn ended: its waiting turn goes
    await asyncio.wait_for(second_b, 1)
    assert dict(s.in_flight) == {"a": 3, "b": 1}


async def test_the_deadline_and_an_abort_end_a_wait():
    s = JobShares(1)
    await s.acquire("a", later())
    with pytest.raises(ShareTimeout, match="'a'"):
        await s.acquire("a", later(0.1))
    cancel = asyncio.get_running_loop().create_future()
    waiting = asyncio.ensure_future(s.acquire("a", later()))
    await asyncio.sleep(0.02)
    cancel_task = asyncio.ensure_future(s.acquire("a", later(), cancel))
    await asyncio.sleep(0.02)
    cancel.set_result(None)
    await asyncio.wait_for(cancel_task, 1)  # returns (the caller sees the abort, and releases)
    s.release("a")
    s.release("a")
    await asyncio.wait_for(waiting, 1)


def test_weights_must_be_positive():
    with pytest.raises(ValueError, match="job_shares"):
        LLMProxyConfig(insecure_disable_auth=True, job_shares={"a": 0.0})
    assert LLMProxyConfig(insecure_disable_auth=True, fleet_turn_slots=8, job_shares={"": 2, "b": 1}).job_shares
