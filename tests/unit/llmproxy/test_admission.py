"""The admission gate: Suspend holds new turns (bounded by deadlines), Resume releases them in order."""

from __future__ import annotations

import asyncio
import time

import pytest

from rollart_llmproxy.admission import AdmissionGate, AdmissionRefused, AdmissionTimeout


async def test_open_gate_admits_at_once():
    gate = AdmissionGate()
    assert await gate.admit(time.monotonic() + 1) == 0.0


async def test_resume_releases_waiters_in_arrival_order():
    gate = AdmissionGate()
    assert gate.suspend("update", 3) and not gate.suspend("again")
    order: list[int] = []

    async def waiter(i: int) -> None:
        await gate.admit(time.monotonic() + 5)
        order.append(i)

    tasks = [asyncio.create_task(waiter(i)) for i in range(5)]
    await asyncio.sleep(0.05)
    assert gate.waiting == 5 and not order
    released, lasted = gate.resume()
    await asyncio.gather(*tasks)
    assert released == 5 and lasted >= 0.05 and order == [0, 1, 2, 3, 4]
    assert gate.resume() == (0, 0.0)  # idempotent


async def test_waiting_is_bounded_by_the_deadline():
    gate = AdmissionGate()
    gate.suspend()
    start = time.monotonic()
    with pytest.raises(AdmissionTimeout):
        await gate.admit(start + 0.1)
    assert 0.09 <= time.monotonic() - start < 1.0
    assert gate.waiting == 0
    with pytest.raises(AdmissionTimeout):
        await gate.admit(start - 1)


async def test_cancel_future_ends_the_wait_early():
    gate = AdmissionGate()
    gate.suspend()
    cancel = asyncio.get_running_loop().create_future()
    task = asyncio.create_task(gate.admit(time.monotonic() + 5, cancel))
    await asyncio.sleep(0.02)
    cancel.set_result(None)
    waited = await asyncio.wait_for(task, 1)
    assert waited < 1 and gate.waiting == 0


async def test_too_many_waiters_are_refused():
    gate = AdmissionGate(max_waiting=2)
    gate.suspend()
    tasks = [asyncio.create_task(gate.admit(time.monotonic() + 5)) for _ in range(2)]
    await asyncio.sleep(0.01)
    with pytest.raises(AdmissionRefused):
        await gate.admit(time.monotonic() + 5)
    gate.resume()
    await asyncio.gather(*tasks)
