"""LoRA mode of the actor's engine: the adapter versions vLLM holds, per job, and the switch at a safe point.

The base is loaded once; each job served (``""``, the actor's own job, and any other job sharing the fleet) has
its own adapter versions. A request carries the LoRARequest of its job's active version from admission to its
end (its tokens stamped with that version, nothing re-prefilled across a switch); a version leaves the engine,
and its folder the disk, once it is neither its job's active version nor used by a request in flight. A job
dropped from the actor keeps its versions only while requests still use them.

vLLM names an adapter by an integer id: the actor's own job uses ``version + 1`` (as before jobs were shared),
every other job ids drawn from ``OTHER_JOB_IDS`` up, so no two (job, version) pairs ever share one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .engine import ActorEngine, UpdateStats

log = logging.getLogger(__name__)

OTHER_JOB_IDS = 1 << 30


@dataclass
class JobAdapters:
    """One job's adapter versions in the engine."""

    version: int = 0
    active: Any = None  # the LoRARequest new requests of the job carry (None: the base, version 0)
    loaded: dict[int, Any] = field(default_factory=dict)  # version -> LoRARequest held by the engine


class EngineAdapters:
    def __init__(self, engine: ActorEngine, version: int) -> None:
        self.engine = engine
        self.jobs: dict[str, JobAdapters] = {"": JobAdapters(version)}
        self._dropped: list[JobAdapters] = []  # dropped jobs whose versions requests in flight still use
        self._next_id = OTHER_JOB_IDS
        self._pruning: asyncio.Task | None = None

    def of(self, job: str) -> JobAdapters:
        """The job's adapters; NOT_FOUND (an EngineError) for a job this actor does not serve."""
        from .engine import EngineError

        found = self.jobs.get(job)
        if found is None:
            raise EngineError("NOT_FOUND", f"this actor serves no job {job!r} (jobs: {sorted(self.jobs)})")
        return found

    def add_job(self, job: str, version: int = 0) -> JobAdapters:
        """Serve ``job`` (its requests run on the base until its first adapter version)."""
        return self.jobs.setdefault(job, JobAdapters(version))

    def for_request(self, job: str) -> tuple[int, Any]:
        """The (version, LoRARequest) a request of ``job`` admitted now runs with."""
        j = self.of(job)
        return (j.version if job else self.engine.version), j.active

    def _lora_id(self, job: str, version: int) -> int:
        if not job:
            return version + 1
        self._next_id += 1
        return self._next_id

    async def switch(
        self,
        folder: str,
        to_version: int,
        job: str,
        *,
        mode: str,
        wait_timeout: float | None,
        after_load: Callable[[], None] | None,
    ) -> UpdateStats:
        """The safe point of ``job``: register ``folder`` (a peft adapter) as ``to_version`` and make it the
        adapter the job's new requests carry. Admissions close for the switch only (every job's: the engine has
        one gate; it lasts the adapter's registration); requests in flight keep the version they started with.
        Raises EngineError (nothing changed) when the engine refuses the adapter."""
        from vllm.lora.request import LoRARequest

        from .engine import ABORT, WAIT, EngineError, UpdateStats

        eng = self.engine
        j = self.of(job)
        async with eng._control:
            eng.updating, eng.updating_to = True, to_version
            eng._update_since = time.time()
            t_closed = time.monotonic()
            eng._gate.clear()  # admissions wait for the switch (requests in flight go on)
            from_version = j.version
            aborted = 0
            try:
                mine = [r for r, t in eng.tracks.items() if t.task and not t.finished and t.job == job]
                if mode == ABORT:
                    aborted = len(await eng.abort(mine))
                elif mode == WAIT:
                    deadline = None if wait_timeout is None else time.monotonic() + wait_timeout
                    while any(t.task is not None and not t.finished and t.job == job for t in eng.tracks.values()):
                        if deadline is not None and time.monotonic() >= deadline:
                            break
                        await asyncio.sleep(0.01)
                    t_closed = time.monotonic()  # the wait is not part of the switch
                t_load = time.monotonic()
                old = j.loaded.pop(to_version, None)
                if old is not None:  # the same version again (a reload): its old folder's copy goes
                    await eng.llm.remove_lora(old.lora_int_id)
                name = f"v{to_version}" if not job else f"{job}@v{to_version}"
                req = LoRARequest(lora_name=name, lora_int_id=self._lora_id(job, to_version), lora_path=folder)
                try:
                    ok = await eng.llm.add_lora(req)
                except Exception as exc:  # noqa: BLE001 - vLLM validates the adapter before it is used
                    msg = str(exc).replace("Call to collective_rpc method failed: ", "")
                    raise EngineError("FAILED_PRECONDITION", f"the engine refused the adapter: {msg}") from None
                if not ok:
                    raise EngineError("FAILED_PRECONDITION", f"the engine did not load the adapter {folder}")
                t_loaded = time.monotonic()
                if after_load is not None:
                    after_load()
                j.loaded[to_version] = req
                j.active, j.version = req, to_version
                if not job:
                    eng.version = to_version
            finally:
                if not eng.user_pause.paused:
                    eng._gate.set()
                eng.updating = False
            window = time.monotonic() - t_closed
        await self.prune()
        log.info(
            "adapter %sv%d -> v%d: load %.3f s, admissions closed %.3f s",
            f"{job}: " if job else "",
            from_version,
            to_version,
            t_loaded - t_load,
            window,
        )
        live = sum(1 for t in eng.tracks.values() if t.task is not None and not t.finished)
        return UpdateStats(
            from_version=from_version,
            to_version=to_version,
            requests_recomputed=0,
            recomputed_tokens=0,
            prefix_cache_reset=False,
            pause_window_s=window,
            load_s=t_loaded - t_load,
            aborted=aborted,
            rpc={"tensors": 0, "adapter": folder, "in_flight_kept": live},
            completed_at=time.time(),
        )

    async def drop_job(self, job: str) -> None:
        """Stop serving ``job`` (not the actor's own): new requests naming it are refused; its versions leave
        once no request uses them."""
        from .engine import EngineError

        if not job:
            raise EngineError("INVALID_ARGUMENT", "the actor's own job cannot be dropped")
        j = self.jobs.pop(job, None)
        if j is not None:
            self._dropped.append(j)
            await self.prune()

    def schedule_prune(self) -> None:
        if self._pruning is None or self._pruning.done():
            self._pruning = asyncio.ensure_future(self.prune())

    async def prune(self) -> list[tuple[str, int]]:
        """Remove every adapter version that is not its job's active one and that no request in flight uses
        (with its folder)."""
        eng = self.engine
        used = {id(t.lora) for t in eng.tracks.values() if not t.finished and t.lora is not None}
        gone: list[tuple[str, int]] = []
        holders = [(name, j, j.active) for name, j in self.jobs.items()]
        holders += [("(dropped)", j, None) for j in self._dropped]
        for name, j, keep in holders:
            for v in [v for v, req in j.loaded.items() if req is not keep and id(req) not in used]:
                req = j.loaded.pop(v)
                with contextlib.suppress(Exception):
                    await eng.llm.remove_lora(req.lora_int_id)
                shutil.rmtree(req.lora_path, ignore_errors=True)
                gone.append((name, v))
        self._dropped = [j for j in self._dropped if j.loaded]
        return gone
