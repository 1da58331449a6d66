"""Per-task pools of a multi-task job, as GetStatus reports them (``LedgerStatus.task_pools``).

The store keeps one pool of pending slots per task tag (``P pool:t:<task>``), one in-flight count per task
(``P inflight:t:<task>``, samples of started groups not yet in a batch) and the ready groups of every task
in one index (``P ready``, each group's hash naming its task). Reads only; not one consistent snapshot
(the counters may move between reads: a status, not an invariant).
"""

from __future__ import annotations

from typing import cast

import redis.asyncio as aioredis

from rollart.v1 import ledger_pb2 as lp

from . import policy as pol

#: Ready groups read to count them by task (more are reported as counted so far).
MAX_READY_SCAN = 10_000


async def task_pools(redis: aioredis.Redis, prefix: str, policy: lp.JobPolicy) -> list[lp.TaskPoolStatus]:
    """The pool of each task of the policy's shares and of each task with ready groups, by task tag."""
    shares = pol.task_shares(policy)
    ready = cast(list[bytes], await redis.zrange(prefix + "ready", 0, MAX_READY_SCAN - 1))
    pipe = redis.pipeline(transaction=False)
    for gid in ready:
        pipe.hget(prefix + "g:" + gid.decode(), "task")
    ready_by_task: dict[str, int] = {}
    for task in await pipe.execute():
        if task is not None:
            name = task.decode()
            ready_by_task[name] = ready_by_task.get(name, 0) + 1
    tasks = sorted(set(shares) | set(ready_by_task))
    pipe = redis.pipeline(transaction=False)
    for t in tasks:
        pipe.zcard(prefix + "pool:t:" + t)
        pipe.get(prefix + "inflight:t:" + t)
    replies = await pipe.execute()
    return [
        lp.TaskPoolStatus(
            task=t,
            share=shares.get(t, 0.0),
            pending_slots=int(replies[2 * i] or 0),
            ready_groups=ready_by_task.get(t, 0),
            inflight_samples=int(replies[2 * i + 1] or 0),
        )
        for i, t in enumerate(tasks)
    ]
