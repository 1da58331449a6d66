"""The ledger's settlement and batches: results admitted or rejected, rewards recorded, batches handed out.

Each method does one request's work on the store after the servicer checked the request (``validators``);
the verdict (admitted, duplicate, or rejected with a reason) is the scripts' (scripts.py). See docs/ledger.md.
"""

from __future__ import annotations

import time

from prometheus_client import Counter

from rollart.runtime import errors
from rollart.v1 import common_pb2
from rollart.v1 import ledger_pb2 as lp

from . import codec, validators
from .errors import LedgerError
from .leases import item_error
from .scripts import BatchRecord, Submission, Verdict
from .store import Part

SUBMISSIONS = Counter("rollart_ledger_submissions_total", "Submit verdicts", ["verdict"])


class Settlement(Part):
    """Submissions, rewards and batches."""

    @staticmethod
    def submit_response(verdict: Verdict, resp: lp.SubmitResponse | None = None) -> lp.SubmitResponse:
        """The verdict as a SubmitResponse, written into ``resp`` when given (a batch's result, no copy)."""
        if resp is None:
            resp = lp.SubmitResponse()
        resp.admitted = verdict.admitted
        resp.reason = verdict.reason
        resp.detail = verdict.detail
        resp.duplicate = verdict.duplicate
        resp.group_complete = verdict.group_complete
        resp.group_admitted = verdict.group_admitted
        resp.awaiting_reward = verdict.awaiting_reward
        if verdict.lease is not None:
            resp.lease.CopyFrom(verdict.lease)
        SUBMISSIONS.labels(
            "duplicate"
            if verdict.duplicate
            else ("admitted" if verdict.admitted else lp.RejectionReason.Name(verdict.reason))
        ).inc()
        return resp

    async def submit(self, submission: Submission) -> lp.SubmitResponse:
        verdict = await self.scripts.settle(submission)
        if not verdict.duplicate:
            self.signal.fire()
        return self.submit_response(verdict)

    async def submit_batch(self, request: lp.SubmitBatchRequest) -> lp.SubmitBatchResponse:
        """Settles every well-formed item (the batch as a whole checked by ``validators.submit_batch``); a
        malformed item is refused alone, as Submit would refuse it."""
        n = len(request.submissions)
        tau_window_ms = int(self.cfg.tau_window_seconds * 1000)
        results = [lp.SubmitBatchResult() for _ in range(n)]
        valid: list[tuple[int, Submission]] = []
        for i, sub in enumerate(request.submissions):
            try:
                valid.append((i, validators.submission(sub, tau_window_ms, f"submissions[{i}].")))
            except errors.ServiceError as exc:
                results[i].error.CopyFrom(item_error(exc))
        fire = False
        if valid:
            verdicts = await self.scripts.submit_batch([x for _, x in valid])
            for (i, _), verdict in zip(valid, verdicts):
                if isinstance(verdict, LedgerError):
                    results[i].error.CopyFrom(item_error(verdict, f"submissions[{i}]: "))
                    continue
                self.submit_response(verdict, results[i].response)
                fire = fire or not verdict.duplicate
        if fire:
            self.signal.fire()
        return lp.SubmitBatchResponse(results=results)

    async def record_reward(self, request: lp.RecordRewardRequest) -> lp.RecordRewardResponse:
        out = await self.scripts.record_reward(
            trajectory_id=request.trajectory_id, failed=request.failed, reward=request.reward.reward
        )
        if out.recorded:
            self.signal.fire()
        return lp.RecordRewardResponse(
            recorded=out.recorded,
            reward=out.reward,
            unknown_trajectory=out.unknown_trajectory,
            group_ready=out.group_ready,
        )

    async def list_unscored(
        self, request: lp.ListUnscoredRequest, max_samples: int, after: tuple[int, str] | None
    ) -> lp.ListUnscoredResponse:
        page = await self.scripts.list_unscored(
            holder_prefix=request.holder_prefix, max_samples=max_samples, after=after
        )
        return lp.ListUnscoredResponse(
            samples=[
                lp.UnscoredSample(
                    lease=u.lease,
                    trajectory=common_pb2.Trajectory.FromString(u.trajectory),
                    admitted_at=codec.ts_ms(u.admitted_ms),
                )
                for u in page.samples
            ],
            next_page_token=f"{page.after[0]}:{page.after[1]}" if page.after else "",
        )

    async def get_batch(self, request: lp.GetBatchRequest, wait: float) -> lp.Batch:
        """The step's batch once enough complete, scored groups are buffered, waiting up to ``wait`` seconds."""
        started = time.monotonic()
        deadline = started + wait
        evicted = evicted_tokens = 0
        while True:
            event = self.signal.current()
            current: int | None = request.current_version
            if current == 0:
                cur = await self.redis.hget(self.k("cur"), "v") or await self.redis.get(self.k("latest"))
                current = int(cur) if cur is not None else None
            policy = await self.policy()
            floor = None if current is None else int(current - policy["alpha"])
            remaining = deadline - time.monotonic()
            partial = request.allow_partial and remaining <= 0
            attempt = await self.scripts.get_batch(
                step=request.step,
                batch_size=request.batch_size,
                floor=floor,
                partial=partial,
                evicted_before=evicted,
                evicted_tokens_before=evicted_tokens,
                drop_zero_variance=request.drop_zero_variance,
                max_groups=request.max_groups,
            )
            if attempt.batch is not None:
                return await self._batch(request.step, attempt.batch, time.monotonic() - started)
            evicted += attempt.evicted_now
            evicted_tokens += attempt.evicted_tokens_now
            if attempt.evicted_now or attempt.filtered_now:  # buffer space freed: acquire may go on
                self.signal.fire()
            if remaining <= 0:
                if request.allow_partial:
                    return lp.Batch(
                        step=request.step,
                        evicted=evicted,
                        evicted_tokens=evicted_tokens,
                        partial=True,
                        waited=codec.dur_ms((time.monotonic() - started) * 1000),
                        accounting=await self.accounting(),
                    )
                raise errors.DeadlineExceeded(
                    f"{attempt.ready_samples} of {request.batch_size} samples are in complete, scored groups"
                    f" after {wait:.1f}s",
                )
            await self.signal.wait(event, min(remaining, self.cfg.poll_interval_seconds))

    async def _batch(self, step: int, record: BatchRecord, waited: float) -> lp.Batch:
        gids = record.group_ids
        pipe = self.redis.pipeline(transaction=False)
        for gid in gids:
            pipe.hgetall(self.k("g:" + gid))
        ghs = [codec.hdict(h) for h in await pipe.execute()]
        tids: list[list[str]] = []
        for h in ghs:
            slots = [codec.text(h.get(f"s{i}", b"X")) for i in range(int(codec.num(h, "n")))]
            tids.append([s[2:] for s in slots if s.startswith("D:")])
        pipe = self.redis.pipeline(transaction=False)
        for group in tids:
            for tid in group:
                pipe.hmget(self.k("s:" + tid), "blob", "rw", "idx")
        samples = iter(await pipe.execute())
        batch = lp.Batch(
            batch_id=record.batch_id,
            step=step,
            samples=record.samples,
            min_version=record.min_version,
            max_version=record.max_version,
            evicted=record.evicted,
            evicted_tokens=record.evicted_tokens,
            waited=codec.dur_ms(waited * 1000),
            partial=record.partial,
            accounting=await self.accounting(),
            filtered_groups=record.filtered_groups,
            filtered_samples=record.filtered_samples,
            filtered_tokens=record.filtered_tokens,
        )
        for gid, h, group in zip(gids, ghs, tids):
            trajectories = []
            for _tid in group:
                blob, rw, idx = next(samples)
                traj = common_pb2.Trajectory.FromString(blob or b"")
                traj.reward = float(rw or 0)
                traj.scored = True
                trajectories.append((int(idx or 0), traj))
            trajectories.sort(key=lambda x: x[0])
            batch.groups.append(
                lp.SampleGroup(
                    group_id=gid,
                    prompt_id=codec.text(h.get("pid", b"")),
                    trajectories=[t for _, t in trajectories],
                )
            )
        return batch

    async def ack_batch(self, request: lp.AckBatchRequest) -> lp.AckBatchResponse:
        released = await self.scripts.ack_batch(step=request.step, batch_id=request.batch_id)
        if released:
            self.signal.fire()
        return lp.AckBatchResponse(released=released)
