"""The ledger's status: one consistent snapshot of its counters, versions, actors, buffer and settlement.

Read-only. See docs/ledger.md.
"""

from __future__ import annotations

from rollart.v1 import ledger_pb2 as lp

from . import codec
from . import policy as pol
from .scripts import now_ms
from .store import LATEST_VERSION, Part
from .tasks import task_pools


class Status(Part):
    """GetStatus."""

    async def status(self, request: lp.LedgerStatusRequest) -> lp.LedgerStatus:
        now = now_ms()
        pipe = self.redis.pipeline(transaction=True)  # one consistent snapshot of the counters
        for name in ("pol", "cur", "cnt", "stats"):
            pipe.hgetall(self.k(name))
        for name in (
            "latest",
            "buf:n",
            "buf:scored",
            "ready:n",
            "buf:reserved",
            "med",
            "ttl",
            "cmd:seq",
            "inflight",
        ):
            pipe.get(self.k(name))
        pipe.zcard(self.k("pool"))
        pipe.scard(self.k("gopen"))
        pipe.zcard(self.k("ready"))
        pipe.zrange(self.k("buf:byver"), 0, 0, withscores=True)
        pipe.zcount(self.k("holders"), now - 60_000, "+inf")
        pipe.zcard(self.k("active"))
        pipe.zrevrange(self.k("batches"), 0, 0, withscores=True)
        pipe.get(self.k("bsz"))
        (
            pol_h, cur, cnt, stats, latest, buf_n, buf_scored, ready_n, reserved, med, ttl, cmd_seq,
            _inflight, pending, open_groups, ready_groups, oldest, holders, active, last_batch, bsz,
        ) = await pipe.execute()  # fmt: skip
        policy = pol.numbers(pol_h)
        cur = codec.hdict(cur)
        batch = int(cur.get("B", 0) or 0)
        if latest is not None:
            LATEST_VERSION.set(int(latest))
        status = lp.LedgerStatus(
            current_step=int(cur.get("step", 0) or 0),
            current_version=int(cur["v"]) if "v" in cur else -1,
            latest_version=int(latest) if latest is not None else -1,
            open_groups=open_groups,
            latest_command_sequence=int(cmd_seq or 0),
            server_time=codec.ts_ms(now),
            lease_ttl=codec.dur_ms(float(ttl) if ttl is not None else policy["ttl0"]),
        )
        if pol_h.get(b"blob"):
            status.policy.ParseFromString(pol_h[b"blob"])
        if med is not None:
            status.median_completion_time.CopyFrom(codec.dur_ms(float(med)))
        status.versions.extend(await self.versions("-inf", "+inf", request.versions_limit or 10))
        actors = await self.actors()
        live = (lp.ACTOR_LIVENESS_ALIVE, lp.ACTOR_LIVENESS_DRAINING)
        status.actors.extend(
            a for a in actors.values() if request.include_inactive_actors or a.liveness in live
        )
        c = {int(k): int(v) for k, v in cnt.items()}
        status.leases.CopyFrom(
            lp.LeaseCounts(
                pending=pending,
                active=c.get(lp.LEASE_STATE_ACTIVE, 0),
                settled=c.get(lp.LEASE_STATE_SETTLED, 0),
                rejected=c.get(lp.LEASE_STATE_REJECTED, 0),
                expired=c.get(lp.LEASE_STATE_EXPIRED, 0),
                cancelled=c.get(lp.LEASE_STATE_CANCELLED, 0),
                released=c.get(lp.LEASE_STATE_RELEASED, 0),
            )
        )
        s = {k.decode(): int(v) for k, v in stats.items()}
        status.buffer.CopyFrom(
            lp.BufferStats(
                samples=int(buf_n or 0),
                scored_samples=int(buf_scored or 0),
                ready_groups=ready_groups,
                ready_samples=int(ready_n or 0),
                capacity=pol.derived_capacity(
                    policy,
                    max(holders, active),
                    batch or int(bsz or 0),
                    int(policy["G"]),
                    ahead=max(0, (int(last_batch[0][1]) if last_batch else -1) - int(cur.get("step", 0) or 0) + 1)
                    if "v" in cur
                    else None,
                ),
                evicted_total=s.get("evicted", 0),
                oldest_version=int(oldest[0][1]) if oldest else -1,
                reserved_samples=int(reserved or 0),
            )
        )
        status.accounting.CopyFrom(codec.accounting(s))
        status.settlement.CopyFrom(
            lp.SettlementStats(
                admitted=s.get("admitted", 0),
                duplicates=s.get("dup", 0),
                rejected={
                    lp.RejectionReason.Name(int(k[4:])): v
                    for k, v in s.items()
                    if k.startswith("rej:") and int(k[4:]) in lp.RejectionReason.values()
                },
            )
        )
        status.task_pools.extend(await task_pools(self.redis, self.p, status.policy))  # multi-task jobs
        return status
