"""The ledger's prompt pool and leases: prompts become groups of samples, samples are leased to holders.

Each method does one request's work on the store after the servicer checked the request (``validators``);
admission (who gets a lease, within the policy's staleness and capacity bounds) is the scripts' (scripts.py).
See docs/ledger.md.
"""

from __future__ import annotations

import time
from typing import Any, cast

from prometheus_client import Counter

from rollart.runtime import errors
from rollart.v1 import ledger_pb2 as lp

from . import codec
from .errors import LedgerError
from .scripts import AcquireArgs, Acquired, NewGroup
from .store import Part

LEASES_ISSUED = Counter("rollart_ledger_leases_issued_total", "Sample leases issued")


def retry_after(got: Acquired) -> Any:
    """When to ask again after an acquire that got nothing: later while no version is registered."""
    return codec.dur_ms(1000 if got.status == "noversion" else 250)


def item_error(exc: errors.ServiceError, prefix: str = "") -> lp.BatchItemError:
    """The status one refused item of a batch would have ended its own call with (``prefix`` names the item)."""
    message = errors.truncate_bytes(prefix + exc.details(), errors.MAX_DETAILS_BYTES)
    return lp.BatchItemError(code=exc.status.value[0], message=message)


class Leases(Part):
    """Prompts and leases."""

    async def add_prompts(self, request: lp.AddPromptsRequest, groups: list[NewGroup]) -> lp.AddPromptsResponse:
        """Adds ``groups`` (the request's prompts, checked by ``validators.add_prompts``)."""
        policy = await self.policy()
        group = request.group_size or int(policy["G"])
        redundancy = request.redundancy if request.HasField("redundancy") else int(policy["R"])
        added = await self.scripts.add_prompts(
            group_size=group, redundancy=redundancy, step=request.step, priority=request.priority, groups=groups
        )
        self.signal.fire()
        return lp.AddPromptsResponse(
            group_ids=added.group_ids, groups_created=added.groups_created, samples_added=added.samples_added
        )

    async def acquire(self, args: AcquireArgs, wait: float) -> lp.AcquireLeasesResponse:
        """Leases for ``args``, waiting up to ``wait`` seconds (bounded) for one to become available."""
        deadline = time.monotonic() + wait
        while True:
            event = self.signal.current()
            got = await self.scripts.acquire(
                holder=args.holder,
                max_leases=args.max_leases,
                region=args.region,
                group_id=args.group_id,
                tasks=args.tasks,
            )
            if got.status == "ok":
                LEASES_ISSUED.inc(len(got.leases))
                return lp.AcquireLeasesResponse(leases=got.leases)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return lp.AcquireLeasesResponse(retry_after=retry_after(got))
            await self.signal.wait(event, min(remaining, self.cfg.poll_interval_seconds))

    async def acquire_batch(self, args: list[AcquireArgs], wait: float) -> lp.AcquireLeasesBatchResponse:
        """One result per request of ``args``; answers once any got a lease, all failed, or ``wait`` passed."""
        deadline = time.monotonic() + wait
        n = len(args)
        results = [lp.AcquireLeasesBatchResult() for _ in range(n)]
        open_items = list(range(n))  # requests without a lease or an error yet
        while True:
            event = self.signal.current()
            got = await self.scripts.acquire_batch([args[i] for i in open_items])
            leased = False
            for i, g in zip(open_items, got):
                if isinstance(g, LedgerError):
                    results[i].error.CopyFrom(item_error(g, f"requests[{i}]: "))
                elif g.status == "ok":
                    LEASES_ISSUED.inc(len(g.leases))
                    results[i].response.leases.extend(g.leases)
                    leased = True
                else:
                    results[i].response.retry_after.CopyFrom(retry_after(g))
            open_items = [i for i, g in zip(open_items, got) if not isinstance(g, LedgerError)]
            remaining = deadline - time.monotonic()
            if leased or not open_items or remaining <= 0:
                return lp.AcquireLeasesBatchResponse(results=results)
            await self.signal.wait(event, min(remaining, self.cfg.poll_interval_seconds))

    async def renew(self, request: lp.RenewLeaseRequest) -> lp.RenewLeaseResponse:
        lease = await self.scripts.renew(lease_id=request.lease_id, holder=request.holder)
        if lease.state == lp.LEASE_STATE_EXPIRED:
            self.signal.fire()
        return lp.RenewLeaseResponse(lease=lease)

    async def release(self, request: lp.ReleaseLeaseRequest) -> lp.Lease:
        released = await self.scripts.release(
            lease_id=request.lease_id,
            holder=request.holder,
            reason=request.reason or lp.RELEASE_REASON_ABANDONED,
            generated_tokens=request.generated_tokens,
        )
        if released.changed:
            self.signal.fire()
        return released.lease

    async def cancel(self, request: lp.CancelLeasesRequest) -> lp.CancelLeasesResponse:
        cancelled = await self.scripts.cancel(
            reason=request.reason or lp.CANCEL_REASON_MANUAL,
            lease_ids=list(request.lease_ids),
            group_ids=list(request.group_ids),
        )
        self.signal.fire()
        return lp.CancelLeasesResponse(cancelled_lease_ids=cancelled)

    async def lease(self, lease_id: str) -> lp.Lease | None:
        h = codec.hdict(await self.redis.hgetall(self.k("l:" + lease_id)))
        if not h:
            return None
        pipe = self.redis.pipeline(transaction=False)
        pipe.hget(self.k("g:" + h["gid"].decode()), "prompt")
        pipe.hget(self.k("vhash"), h["ver"].decode())
        prompt, vhash = await pipe.execute()
        return codec.lease_from(h, prompt or b"", vhash or b"")

    async def get_lease(self, lease_id: str) -> lp.Lease:
        lease = await self.lease(lease_id)
        if lease is None:
            raise errors.NotFound(f"no lease {lease_id}")
        return lease

    async def list_leases(self, request: lp.ListLeasesRequest, after: int) -> lp.ListLeasesResponse:
        """A page of leases after score ``after`` (the page token, checked by ``validators.list_leases``)."""
        size = request.page_size or 100
        states = {str(s).encode() for s in request.states}
        holder = request.holder.encode()
        group = request.group_id.encode()
        out: list[lp.Lease] = []
        scanned = 0
        while len(out) < size and scanned < 50 * size:
            ids = cast(
                list[tuple[bytes, float]],
                await self.redis.zrangebyscore(
                    self.k("leases"), f"({after}", "+inf", start=0, num=size, withscores=True
                ),
            )
            if not ids:
                break
            pipe = self.redis.pipeline(transaction=False)
            for lid, _ in ids:
                pipe.hgetall(self.k("l:" + lid.decode()))
            rows = await pipe.execute()
            for (_lid, score), h in zip(ids, rows):
                scanned += 1
                after = int(score)
                if not h or (states and h[b"st"] not in states):
                    continue
                if (holder and h[b"holder"] != holder) or (group and h[b"gid"] != group):
                    continue
                out.append(codec.lease_from(codec.hdict(h), b"", b""))
                if len(out) == size:
                    break
        more = await self.redis.zcount(self.k("leases"), f"({after}", "+inf")
        next_token = str(after) if more else ""
        await self._fill_prompts(out)
        return lp.ListLeasesResponse(leases=out, next_page_token=next_token)

    async def _fill_prompts(self, leases: list[lp.Lease]) -> None:
        gids = sorted({le.group_id for le in leases})
        versions = sorted({str(le.version) for le in leases})
        if not leases:
            return
        pipe = self.redis.pipeline(transaction=False)
        for gid in gids:
            pipe.hget(self.k("g:" + gid), "prompt")
        prompts = dict(zip(gids, await pipe.execute()))
        hashes = dict(zip(versions, cast(list[bytes | None], await self.redis.hmget(self.k("vhash"), versions))))
        for le in leases:
            if prompts.get(le.group_id):
                le.prompt.ParseFromString(prompts[le.group_id])
            le.version_hash = hashes.get(str(le.version)) or b""
