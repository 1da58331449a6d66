"""Batch-level ("lockstep") interaction: the loops of one group advance in waves.

A wave starts when the previous one is over (every member left it) and takes every loop registered at that
moment as a member. Within a wave, members arrive at numbered points: point k opens once every member still
in the wave has arrived at k or beyond. A member that leaves (episode failed or cancelled, no lease, stopping,
settled) no longer counts, so nothing any member does can keep the others waiting for ever.

The envmanager uses point ``t`` before generating turn ``t`` (all steps of turn t-1 done), :data:`ENDED` once
the episode is over (a member that arrived there never blocks a turn point again) and :data:`SCORED` once its
trajectory is scored.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Hashable

ENDED = 1 << 30  # beyond every turn: an ended episode never holds back a turn barrier
SCORED = ENDED + 1


class Waves:
    """A dynamic barrier over the members of successive waves (one asyncio event loop, no threads)."""

    def __init__(self) -> None:
        self.registered: set[Hashable] = set()
        self.generation = 0  # the current (or last) wave's number; 0: none started yet
        self.members: set[Hashable] = set()  # of the current wave, still in it
        self.arrived: dict[Hashable, int] = {}
        self._changed = asyncio.Event()

    def _notify(self) -> None:
        # Wake every waiter once; each re-checks its own condition and waits on the fresh event.
        self._changed.set()
        self._changed = asyncio.Event()

    def notify(self) -> None:
        """Makes waiters re-check (e.g. their give-up condition)."""
        self._notify()

    def register(self, member: Hashable) -> None:
        """A member of every wave from the next one on."""
        self.registered.add(member)

    def unregister(self, member: Hashable) -> None:
        self.registered.discard(member)
        self.leave(member)

    def leave(self, member: Hashable) -> None:
        """Leaves the current wave (idempotent); the wave is over once every member left."""
        if member in self.members:
            self.members.discard(member)
            self.arrived.pop(member, None)
            self._notify()

    def in_wave(self, member: Hashable) -> bool:
        return member in self.members

    async def start(self, member: Hashable, give_up: Callable[[], bool] = lambda: False) -> int | None:
        """Waits until ``member`` is in a wave (the current one, or the next once the current is over); returns
        its generation, or None when ``give_up()`` became true first (call :meth:`notify` to make it look)."""
        self.registered.add(member)
        while True:
            if give_up():
                return None
            if member in self.members:
                return self.generation
            if not self.members:  # the last wave is over: a new one with every registered loop
                self.generation += 1
                self.members = set(self.registered)
                self.arrived = dict.fromkeys(self.members, -1)
                self._notify()
                return self.generation
            await self._changed.wait()

    def is_open(self, point: int) -> bool:
        return all(p >= point for p in self.arrived.values())

    async def arrive(self, member: Hashable, point: int) -> None:
        """Arrives at ``point`` and waits until every member still in the wave is there (or beyond).

        A member not in the wave (it left) passes at once. Cancelling the caller does not leave the wave:
        whoever cancels is expected to :meth:`leave` (the loop does, in its ``finally``).
        """
        if member not in self.members:
            return
        if point > self.arrived[member]:
            self.arrived[member] = point
            self._notify()
        while member in self.members and not self.is_open(point):
            await self._changed.wait()
