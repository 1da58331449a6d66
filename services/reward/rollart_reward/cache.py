"""The idempotency cache: the first successful answer for a trajectory id, kept in a bounded LRU and, when
configured, in Redis (shared by replicas and kept across restarts).

Only OK results are stored: a failure or a timeout may be retried and then answered properly.
"""

from __future__ import annotations

import collections
import logging
from typing import cast

from rollart.v1 import reward_pb2

log = logging.getLogger(__name__)


class ResultCache:
    def __init__(
        self, capacity: int, redis_url: str | None = None, key_prefix: str = "rollart:reward:", ttl: float = 86400
    ) -> None:
        self.capacity = capacity
        self._lru: collections.OrderedDict[str, bytes] = collections.OrderedDict()
        self._prefix = key_prefix + "result:"
        self._ttl = max(1, int(ttl))
        self._redis = None
        if redis_url:
            import redis.asyncio as aioredis

            self._redis = aioredis.from_url(redis_url)

    def __len__(self) -> int:
        return len(self._lru)

    async def start(self) -> None:
        if self._redis is not None:
            await self._redis.ping()

    async def close(self) -> None:
        if self._redis is not None:
            await self._redis.aclose()

    def _remember(self, tid: str, data: bytes) -> None:
        self._lru[tid] = data
        self._lru.move_to_end(tid)
        while len(self._lru) > self.capacity:
            self._lru.popitem(last=False)

    async def get(self, tid: str) -> reward_pb2.ScoreResult | None:
        data = self._lru.get(tid)
        if data is not None:
            self._lru.move_to_end(tid)
        elif self._redis is not None:
            try:
                data = cast(bytes | None, await self._redis.get(self._prefix + tid))  # replies are not decoded
            except Exception as exc:  # noqa: BLE001 - Redis trouble: the local LRU still answers
                log.warning("redis cache read failed: %s", exc)
                data = None
            if data is not None:
                self._remember(tid, data)
        return reward_pb2.ScoreResult.FromString(data) if data is not None else None

    async def put(self, tid: str, result: reward_pb2.ScoreResult) -> reward_pb2.ScoreResult:
        """Store ``result`` unless an answer is already stored; returns the stored (first) answer."""
        data = result.SerializeToString()
        if self._redis is not None:
            try:
                # SET NX: among replicas scoring the same trajectory, the first answer wins everywhere.
                stored = await self._redis.set(self._prefix + tid, data, nx=True, ex=self._ttl)
                if not stored:
                    existing = cast(bytes | None, await self._redis.get(self._prefix + tid))
                    if existing is not None:
                        data = existing
            except Exception as exc:  # noqa: BLE001
                log.warning("redis cache write failed: %s", exc)
        if tid in self._lru:
            data = self._lru[tid]
        self._remember(tid, data)
        return reward_pb2.ScoreResult.FromString(data)
