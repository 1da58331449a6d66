"""The lockstep barrier of batch-level interaction (rollart_envmanager.waves)."""

from __future__ import annotations

import asyncio

import pytest

from rollart_envmanager.waves import ENDED, SCORED, Waves


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def waiter(waves: Waves, member: str, point: int) -> asyncio.Task:
    return asyncio.create_task(waves.arrive(member, point))


async def started(names: list[str]) -> Waves:
    waves = Waves()
    for n in names:
        waves.register(n)
    for n in names:
        assert await waves.start(n) == 1
    return waves


async def test_a_point_opens_only_when_every_member_arrived() -> None:
    waves = await started(["a", "b", "c"])
    ta, tb = waiter(waves, "a", 0), waiter(waves, "b", 0)
    await settle()
    assert not ta.done() and not tb.done()
    await waves.arrive("c", 0)  # the last one passes at once and releases the others
    await settle()
    assert ta.done() and tb.done()
    # next point: a member further ahead does not hold back a lower point
    tc = waiter(waves, "c", 2)
    await settle()
    await asyncio.wait_for(asyncio.gather(waves.arrive("a", 1), waves.arrive("b", 1)), 1)
    assert not tc.done()
    tc.cancel()


async def test_leaving_releases_the_waiters() -> None:
    waves = await started(["a", "b", "c"])
    ta, tb = waiter(waves, "a", 0), waiter(waves, "b", 0)
    await settle()
    waves.leave("c")  # e.g. no lease: the wave goes on with the others
    await asyncio.wait_for(asyncio.gather(ta, tb), 1)
    await waves.arrive("c", 5)  # no longer a member: passes at once, blocks nobody
    assert not waves.in_wave("c")


async def test_an_ended_episode_never_blocks_a_turn_but_the_end_waits_for_all() -> None:
    waves = await started(["a", "b"])
    end_a = waiter(waves, "a", ENDED)
    await settle()
    assert not end_a.done()
    for turn in range(4):  # b goes on alone, turn after turn
        await asyncio.wait_for(waves.arrive("b", turn), 1)
    assert not end_a.done()
    end_b = waiter(waves, "b", ENDED)
    await asyncio.wait_for(asyncio.gather(end_a, end_b), 1)
    sa = waiter(waves, "a", SCORED)  # settling waits until the whole wave is scored
    await settle()
    assert not sa.done()
    await asyncio.wait_for(waves.arrive("b", SCORED), 1)
    await asyncio.wait_for(sa, 1)


async def test_failures_and_cancellations_do_not_deadlock() -> None:
    waves = await started([f"m{i}" for i in range(6)])

    async def member(i: int) -> str:
        name = f"m{i}"
        try:
            for turn in range(10):
                if turn == i:  # each one fails at another turn (the last one never)
                    raise RuntimeError("episode failed")
                await waves.arrive(name, turn)
                await asyncio.sleep(0.001 * i)
            await waves.arrive(name, ENDED)
            return "ok"
        except RuntimeError:
            return "failed"
        finally:
            waves.leave(name)  # what the loop does whatever happened

    results = await asyncio.wait_for(asyncio.gather(*(member(i) for i in range(6))), 5)
    assert results == ["failed"] * 6
    # a member cancelled in the middle of a step (or while waiting) leaves in its finally: nobody waits for it
    waves = await started(["x", "y", "z"])

    async def cancelled_member(name: str, point: int) -> None:
        try:
            await waves.arrive(name, point)
            await asyncio.Event().wait()  # a step that never returns
        finally:
            waves.leave(name)

    tx = asyncio.create_task(cancelled_member("x", 0))  # waits for z at point 0
    ty = waiter(waves, "y", 0)
    await settle()
    tx.cancel()
    await settle()
    assert tx.cancelled() and not ty.done()
    tz = asyncio.create_task(cancelled_member("z", 0))  # z arrives, everyone passes point 0; z hangs in its step
    await asyncio.wait_for(ty, 1)
    ty = waiter(waves, "y", 1)
    await settle()
    assert not ty.done()
    tz.cancel()
    await asyncio.wait_for(ty, 1)
    with pytest.raises(asyncio.CancelledError):
        await tz


async def test_generations_start_after_every_member_left() -> None:
    waves = await started(["a", "b"])
    assert waves.generation == 1
    waves.leave("a")
    nxt = asyncio.create_task(waves.start("a"))  # a finished early: it waits for b's wave to end
    await settle()
    assert not nxt.done()
    # a loop that leaves and comes back while the wave runs is not re-admitted to it
    assert not waves.in_wave("a") and waves.in_wave("b")
    waves.leave("b")
    assert await asyncio.wait_for(nxt, 1) == 2
    assert waves.in_wave("a") and waves.in_wave("b")  # every registered loop is in the new wave
    assert await waves.start("b") == 2
    # an unregistered (stopped) loop is no member of later waves and does not block them
    waves.unregister("b")
    waves.leave("a")
    assert await waves.start("a") == 3
    assert waves.members == {"a"}
    await asyncio.wait_for(waves.arrive("a", 0), 1)


async def test_start_gives_up_when_asked() -> None:
    waves = await started(["a", "b"])
    waves.leave("a")
    stopping = False
    t = asyncio.create_task(waves.start("a", lambda: stopping))
    await settle()
    assert not t.done()
    stopping = True
    waves.notify()
    assert await asyncio.wait_for(t, 1) is None
