"""rollart.runtime.background.Periodic: the reapers' loop."""

from __future__ import annotations

import asyncio

import pytest

from rollart.runtime.background import Periodic


def test_ticks_until_stopped_and_survives_failures():
    async def scenario() -> None:
        calls: list[int] = []

        async def tick() -> None:
            calls.append(len(calls))
            if len(calls) == 2:
                raise RuntimeError("store hiccup")

        p = Periodic(tick, 0.01, name="test-reaper")
        p.start()
        p.start()  # idempotent while running
        for _ in range(200):
            if len(calls) >= 5:
                break
            await asyncio.sleep(0.01)
        assert p.running and len(calls) >= 5 and p.failures == 1
        await p.stop()
        assert not p.running
        seen = len(calls)
        await asyncio.sleep(0.05)
        assert len(calls) == seen  # no tick after stop
        await p.stop()  # stopping twice is fine

    asyncio.run(scenario())


def test_stop_cancels_a_tick_in_flight():
    async def scenario() -> None:
        cancelled = asyncio.Event()

        async def slow() -> None:
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:
                cancelled.set()
                raise

        p = Periodic(slow, 1, name="slow")
        p.start()
        await asyncio.sleep(0.01)
        await asyncio.wait_for(p.stop(), 2)
        assert cancelled.is_set()

    asyncio.run(scenario())


def test_interval_must_be_positive():
    with pytest.raises(ValueError):
        Periodic(lambda: asyncio.sleep(0), 0, name="x")
