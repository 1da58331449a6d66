"""The Actor gRPC service: generation on a vLLM engine, weight staging and safe-point updates, status.

Generation streams token ids with their logprobs and the policy version of every token; a weight update
in the middle of a request shows as a VersionChange at the token where the new weights took over (the KV
of prompt + tokens so far is recomputed under them). Weights arrive as pushed delta segments
(StageDelta), from a relay through the delta subscriber (when a relay is configured), as Mooncake buckets
(PullBuckets) or as a full checkpoint (LoadCheckpoint); Commit applies a staged chain at a safe point.

The weight state (active, staged, executed orders) has one owner, ``weights.WeightManager``; this
servicer validates requests and calls it. The actor registers with the resource manager (pool, hardware
tags) and, when a ledger is configured, with the ledger through ``ledger_agent.LedgerAgent`` (heartbeats
with its version state and tokens/s; the ledger's commands), for which it implements ``ActorCommands``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from grpc import aio

from rollart.discovery import Registration, resource_manager_channel
from rollart.runtime import errors
from rollart.runtime.telemetry import log_fields
from rollart.runtime.timeutil import duration as _dur
from rollart.runtime.timeutil import timestamp as _ts
from rollart.v1 import actor_pb2, actor_pb2_grpc, common_pb2, ledger_pb2
from rollart.v1 import resource_manager_pb2 as rm
from rollart.v1 import resource_manager_pb2_grpc as rm_grpc

from . import job_slots, validators
from .adapters import AdapterHost, await_first_adapter, load_adapter_host
from .config import ActorConfig
from .engine import ABORT, KEEP, WAIT, ActorEngine, EngineError, Track
from .hardware import detect_hardware
from .job_slots import JobSlot
from .ledger_agent import ActorReport, LedgerAgent
from .weights import HostWeights, WeightError, WeightManager

log = logging.getLogger(__name__)

MAX_ID_CHARS = validators.MAX_ID_CHARS
MAX_STOP_STRINGS = validators.MAX_STOP_STRINGS
PAUSE_MODES = {
    actor_pb2.PAUSE_MODE_UNSPECIFIED: KEEP,
    actor_pb2.PAUSE_MODE_KEEP: KEEP,
    actor_pb2.PAUSE_MODE_WAIT: WAIT,
    actor_pb2.PAUSE_MODE_ABORT: ABORT,
}
MODE_ENUM = {KEEP: actor_pb2.PAUSE_MODE_KEEP, WAIT: actor_pb2.PAUSE_MODE_WAIT, ABORT: actor_pb2.PAUSE_MODE_ABORT}
FINISH = {
    "stop": common_pb2.FINISH_REASON_STOP,
    "length": common_pb2.FINISH_REASON_LENGTH,
    "abort": common_pb2.FINISH_REASON_ABORTED,
}
PD_ROLES = {
    "unified": common_pb2.PD_ROLE_UNIFIED,
    "prefill": common_pb2.PD_ROLE_PREFILL,
    "decode": common_pb2.PD_ROLE_DECODE,
}
POOL_KINDS = {
    "cpu": common_pb2.POOL_KIND_CPU,
    "gpu-compute": common_pb2.POOL_KIND_GPU_COMPUTE,
    "gpu-bandwidth": common_pb2.POOL_KIND_GPU_BANDWIDTH,
}


def _template_kwargs(raw: dict[str, str]) -> dict[str, Any]:
    """Chat-template kwargs arrive as strings: JSON values ("false", "3", "[...]") become typed."""
    out: dict[str, Any] = {}
    for k, v in raw.items():
        try:
            out[k] = json.loads(v)
        except (ValueError, TypeError):
            out[k] = v
    return out


def _adapter_host(cfg: ActorConfig) -> HostWeights:
    from .host_weights import load_weight_files

    base, _ = load_weight_files(str(cfg.model))
    return load_adapter_host(base, cfg)


class ActorService(actor_pb2_grpc.ActorServicer):
    name = "actor"
    service_names = [actor_pb2.DESCRIPTOR.services_by_name["Actor"].full_name]

    def __init__(self, cfg: ActorConfig) -> None:
        self.cfg = cfg
        self.engine = ActorEngine(cfg, version=cfg.weight_version)
        self.host: HostWeights | None = None
        self.manager: WeightManager | None = None  # the one owner of the weight state (from start())
        self.actor_id = cfg.actor_id or ""
        self.endpoint = ""
        self.hardware = common_pb2.Hardware()
        ws = cfg.weight_source
        self.weight_source = actor_pb2.WeightSource(
            relay_endpoint=ws.relay_endpoint or "",
            fallback_endpoints=ws.fallback_endpoints,
            streams=ws.streams,
            checkpoint_store=ws.checkpoint_store or "",
            mooncake_master=cfg.mooncake_master or "",
        )
        self.registration: Registration | None = None
        self.ledger: LedgerAgent | None = None
        self.jobs: dict[str, JobSlot] = {}  # LoRA: jobs served besides the own one (AttachJob; job_slots.py)
        self.draining = False
        self._tasks: set[asyncio.Task] = set()

    # ---------------------------------------------------------------------------------------------- lifecycle

    def add_to_server(self, server: aio.Server) -> None:
        actor_pb2_grpc.add_ActorServicer_to_server(self, server)

    async def start(self) -> None:
        cfg = self.cfg
        model = Path(str(cfg.model))
        if not model.exists():
            raise SystemExit(f"rollart-actor: model {model} does not exist")
        try:
            if cfg.lora is not None:  # the base stays in the engine; the host copy is the adapter
                self.host = await asyncio.to_thread(_adapter_host, cfg)
            else:
                self.host = await asyncio.to_thread(HostWeights.load, model, cfg.weight_version, cfg.initial_hash())
        except WeightError as exc:
            raise SystemExit(f"rollart-actor: cannot read the weights of {model}: {exc}") from None
        t0 = time.perf_counter()
        self.engine.start()  # on this (main) thread: see rollart_actor.worker
        log.info(
            "engine ready",
            extra=log_fields(
                seconds=round(time.perf_counter() - t0, 2), engine=self.engine.engine_desc, model=str(model)
            ),
        )
        self.manager = WeightManager(
            self.host,
            self.engine,
            self.engine.work_dir,
            key=cfg.key(),
            job=cfg.job_id,
            max_staged_versions=cfg.max_staged_versions,
        )
        self._spawn(self._watch_engine())
        if cfg.lora is not None:
            await self._start_adapter()

    async def _start_adapter(self) -> None:
        """LoRA: register the start version's adapter, or (pending) load the first one the store gets."""
        assert self.manager is not None and self.host is not None
        host, store_uri = self.host, self.cfg.weight_source.checkpoint_store
        if store_uri:
            from rollart.weights.checkpoint_store import open_store

            self.manager.adapter_store = open_store(store_uri)
        if not host.pending:
            folder = host.adapter_dir(self.engine.work_dir, host.version)
            await asyncio.to_thread(host.write, folder)
            await self.engine.update_weights(str(folder), host.version)
        elif store_uri:
            assert isinstance(host, AdapterHost)
            self._spawn(await_first_adapter(self.manager, host))

    async def on_serving(self, address: str) -> None:
        self.endpoint = address
        host, _, port = address.rpartition(":")
        if not self.actor_id:
            self.actor_id = f"actor-{socket.gethostname()}-{port}"
        self.hardware = detect_hardware(self.cfg, self.engine.device)
        if self.cfg.resource_manager:
            await self._register_rm()
        if self.cfg.ledger:
            self.ledger = LedgerAgent(
                endpoint=self.cfg.ledger,
                actor_id=self.actor_id,
                actor=self,
                token=self.cfg.token(),
                tls=self.cfg.tls,
                heartbeat_seconds=self.cfg.ledger_heartbeat_seconds,
            )
            self.ledger.start()
        if self.weight_source.relay_endpoint:
            self._follow_relay()

    def ready_info(self) -> dict[str, Any]:
        return {"actor_id": self.actor_id, "model": self.engine.model_name, "version": self.engine.version}

    async def stop(self) -> None:
        for slot in list(self.jobs.values()):
            with contextlib.suppress(Exception):
                await slot.stop()
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.manager is not None:
            with contextlib.suppress(Exception):
                await self.manager.unfollow()
        if self.ledger is not None:
            await self.ledger.stop()
        if self.registration is not None:
            await self.registration.stop()
        for track in list(self.engine.tracks.values()):
            if track.task is not None:
                track.task.cancel()
        self.engine.shutdown()

    def _spawn(self, coro: Any) -> asyncio.Task:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _watch_engine(self) -> None:
        # A dead engine makes a zombie actor: leave (SIGTERM to ourselves drains and exits) so that a
        # supervisor restarts it and clients fail over on UNAVAILABLE.
        while True:
            await asyncio.sleep(1.0)
            if self.engine.errored:
                log.error("the inference engine died; shutting down")
                os.kill(os.getpid(), 15)
                return

    async def _register_rm(self) -> None:
        cfg = self.cfg
        assert cfg.resource_manager is not None
        if cfg.register_pool:
            ch = resource_manager_channel(cfg.resource_manager, cfg.token(), cfg.tls)
            try:
                stub = rm_grpc.ResourceManagerStub(ch)
                pools = await stub.ListPools(rm.ListPoolsRequest())
                if cfg.pool not in {p.name for p in pools.pools}:
                    await stub.RegisterPool(
                        rm.RegisterPoolRequest(
                            pool=rm.Pool(
                                name=cfg.pool,
                                kind=POOL_KINDS[cfg.pool_kind],
                                hardware=self.hardware,
                                capacity=64,
                                region=cfg.region,
                            )
                        )
                    )
            finally:
                await ch.close()
        worker = rm.Worker(
            worker_id=self.actor_id,
            role="actor",
            endpoint=self.endpoint,
            pool=cfg.pool,
            hardware=self.hardware,
            region=cfg.region,
            labels={
                "model": self.engine.model_name,
                "engine": self.engine.engine_desc,
                "pd_role": cfg.pd_role,
                "max_model_len": str(self.engine.max_model_len),
            },
            ttl_seconds=cfg.registration_ttl_seconds,
        )
        self.registration = Registration(cfg.resource_manager, worker, token=cfg.token(), tls=cfg.tls)
        await self.registration.start()

    # -------------------------------------------------------------------------------------------- input

    def _render(self, inp: common_pb2.ModelInput, add_special_tokens: bool) -> tuple[list[int], str]:
        """Token ids of an input (token ids as is; messages through the chat template; raw text)."""
        validators.model_input(inp)
        tok = self.engine.tokenizer
        if inp.token_ids:
            ids = np.asarray(inp.token_ids, dtype=np.int64)
            if int(ids.min()) < 0 or int(ids.max()) >= self.engine.vocab_size:
                raise errors.InvalidArgument("input.token_ids", f"token ids must be in [0, {self.engine.vocab_size})")
            return list(inp.token_ids), ""
        if inp.messages:
            msgs = [{"role": m.role, "content": m.content} for m in inp.messages]
            kwargs = _template_kwargs(dict(inp.chat_template_kwargs))
            try:
                if inp.no_generation_prompt:
                    try:
                        rendered = tok.apply_chat_template(
                            msgs, tokenize=False, add_generation_prompt=False, continue_final_message=True, **kwargs
                        )
                    except ValueError:
                        rendered = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=False, **kwargs)
                else:
                    rendered = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True, **kwargs)
            except Exception as exc:  # noqa: BLE001 - a template error is the caller's input
                raise errors.InvalidArgument("input.messages", f"the chat template failed: {exc}") from None
            return list(tok.encode(rendered, add_special_tokens=False)), str(rendered)
        return list(tok.encode(inp.text, add_special_tokens=add_special_tokens)), inp.text

    def _prepare(self, req: actor_pb2.ActorGenerateRequest) -> tuple[Track, Any, int]:
        top_p, top_k, rep = validators.generate(req, priority_scheduling=self.cfg.scheduling_policy == "priority")
        s = req.sampling
        if s.stop_token_ids:
            st = np.asarray(s.stop_token_ids, dtype=np.int64)
            if int(st.min()) < 0 or int(st.max()) >= self.engine.vocab_size:
                raise errors.InvalidArgument(
                    "sampling.stop_token_ids", f"sampling.stop_token_ids must be in [0, {self.engine.vocab_size})"
                )
        prompt, _ = self._render(req.input, add_special_tokens=False)
        if not prompt:
            raise errors.InvalidArgument("input", "the input is empty")
        if len(prompt) >= self.engine.max_model_len:
            raise errors.ResourceExhausted(
                f"the prompt has {len(prompt)} tokens; the context holds {self.engine.max_model_len}",
            )
        extra: dict[str, Any] | None = None
        max_tokens = s.max_tokens
        phase = req.pd_phase
        if phase in (actor_pb2.PD_PHASE_PREFILL, actor_pb2.PD_PHASE_DECODE):
            if self.cfg.kv_transfer_config is None:
                raise errors.FailedPrecondition(
                    "this actor has no KV-transfer connector (kv_transfer_config): it runs both phases only",
                )
            if phase == actor_pb2.PD_PHASE_PREFILL:
                extra = {"kv_transfer_params": {"do_remote_decode": True, "do_remote_prefill": False}}
                max_tokens = 1
            else:
                try:
                    kv = json.loads(req.kv_transfer_params_json)
                except ValueError:
                    kv = None
                if not isinstance(kv, dict):
                    raise errors.InvalidArgument(
                        "kv_transfer_params_json",
                        "PD_PHASE_DECODE needs kv_transfer_params_json: the prefill's JSON object",
                    )
                extra = {"kv_transfer_params": kv}
        try:
            params = self._sampling(s, top_p, top_k, rep, max_tokens, req, extra)
        except (ValueError, TypeError) as exc:  # vLLM's own checks of the combination
            raise errors.InvalidArgument("sampling", f"sampling: {exc}") from None
        track = Track(req.request_id, req.trajectory_id, prompt)
        track.job = "" if req.job_id in ("", self.cfg.job_id) else req.job_id
        if track.job and self.cfg.lora is None:
            raise errors.FailedPrecondition(f"job_id {req.job_id!r}: this full-weight actor serves {self.cfg.job_id!r}")
        self.engine.adapters.of(track.job)  # NOT_FOUND for a job not attached
        return track, params, int(req.priority)

    def _sampling(self, s: Any, top_p: float, top_k: int, rep: float, max_tokens: int, req: Any, extra: Any) -> Any:
        return self.engine.sampling_params(
            temperature=float(s.temperature),
            top_p=float(top_p),
            top_k=int(top_k),
            max_tokens=int(max_tokens),
            stop=list(s.stop),
            stop_token_ids=list(s.stop_token_ids),
            seed=int(s.seed) if s.seed else None,
            logprobs=bool(s.logprobs),
            repetition_penalty=float(rep),
            ignore_eos=bool(s.ignore_eos),
            detokenize=bool(req.return_text or s.stop),
            extra_args=extra,
        )

    # --------------------------------------------------------------------------------------- generation

    async def Generate(
        self, request: actor_pb2.ActorGenerateRequest, context: aio.ServicerContext
    ) -> AsyncIterator[common_pb2.GenerationChunk]:
        if not self.engine.ready or self.engine.errored:
            raise errors.Unavailable("the inference engine is not running")
        track, params, priority = self._prepare(request)
        self.engine.register(track)  # EngineError: a runtime.errors.Coded error, mapped by the server
        try:
            await self.engine.wait_admission(track, context.time_remaining())
            if not track.finished:
                v = self.engine.adapters.of(track.job).version if track.job else self.engine.version
                if v < request.min_version:
                    raise EngineError(
                        "FAILED_PRECONDITION", f"the active version is {v}, the request needs >= {request.min_version}"
                    )
                self.engine.start_request(track, params, priority)
            async for chunk in self._stream(track, request, context):
                yield chunk
        finally:
            # Client gone, deadline passed or the stream ended: make sure the engine forgets the request
            # (cancelling the pump makes vLLM abort it).
            if track.task is not None and not track.task.done():
                track.task.cancel()
            self.engine.unregister(track)

    async def _stream(
        self, track: Track, req: actor_pb2.ActorGenerateRequest, context: aio.ServicerContext
    ) -> AsyncIterator[common_pb2.GenerationChunk]:
        sent = text_sent = marks_sent = 0
        first = True
        every = max(req.chunk_tokens, 0)
        want_lp = req.sampling.logprobs
        while True:
            track.changed.clear()
            n = len(track.tokens)
            done = track.finished
            if track.error is not None:
                raise track.error
            pending = n - sent
            if not done and (pending == 0 or pending < every):
                await track.changed.wait()
                continue
            chunk = common_pb2.GenerationChunk(
                request_id=track.request_id,
                trajectory_id=track.trajectory_id,
                actor_id=self.actor_id,
                offset=sent,
                token_ids=track.tokens[sent:n],
                versions=track.versions[sent:n],
            )
            if want_lp:
                chunk.logprobs.extend(track.logprobs[sent:n])
            if req.return_text:
                chunk.text = track.text[text_sent:]
                text_sent = len(track.text)
            while marks_sent < len(track.marks) and (track.marks[marks_sent].token_index <= n or done):
                m = track.marks[marks_sent]
                chunk.version_changes.append(
                    common_pb2.VersionChange(
                        token_index=m.token_index,
                        from_version=m.from_version,
                        to_version=m.to_version,
                        kv_recomputed=True,
                        recomputed_tokens=m.recomputed_tokens,
                        paused=_dur(m.paused_s),
                    )
                )
                marks_sent += 1
            if first:
                chunk.prompt_token_ids.extend(track.prompt_ids)
                first = False
            sent = n
            if done:
                reason = track.finish_reason or "abort"
                if reason not in FINISH:
                    raise errors.Internal(f"generation ended with {reason!r}")
                chunk.finish_reason = FINISH[reason]
                chunk.stop_reason = track.stop_reason
                chunk.usage.CopyFrom(self._usage(track))
                if track.kv_transfer_params is not None:
                    chunk.kv_transfer_params_json = json.dumps(track.kv_transfer_params)
                slot = self.jobs.get(track.job) if track.job else None
                host = slot.host if slot is not None else None if track.job else self.host
                if host is not None:
                    # The hashes of the weights these tokens actually came from (the track's job's): settlement
                    # compares them with the ledger's h(v), which catches an actor that ran other weights under v.
                    for v, h in host.hashes_for(track.versions).items():
                        chunk.version_hashes[v] = h
                yield chunk
                return
            yield chunk

    @staticmethod
    def _usage(t: Track) -> common_pb2.GenerationUsage:
        u = common_pb2.GenerationUsage(
            prompt_tokens=len(t.prompt_ids), completion_tokens=len(t.tokens), cached_prompt_tokens=t.cached_tokens
        )
        admitted = t.admitted if t.admitted is not None else time.monotonic()
        u.queue_time.CopyFrom(_dur(admitted - t.arrived))
        if t.first_token_at is not None:
            u.time_to_first_token.CopyFrom(_dur(t.first_token_at - admitted))
        if t.last_token_at is not None:
            u.generation_time.CopyFrom(_dur(t.last_token_at - admitted))
        return u

    async def Tokenize(self, request: common_pb2.TokenizeRequest, context: aio.ServicerContext):
        if not self.engine.ready:
            raise errors.Unavailable("the inference engine is not running")
        ids, rendered = self._render(request.input, add_special_tokens=request.add_special_tokens)
        return common_pb2.TokenizeResponse(
            token_ids=ids,
            rendered=rendered,
            model=self.engine.model_name,
            max_model_len=self.engine.max_model_len,
        )

    async def Abort(self, request: actor_pb2.ActorAbortRequest, context: aio.ServicerContext):
        validators.abort(request)
        aborted = await self.engine.abort(request.request_ids, request.trajectory_ids)
        if aborted:
            log.info("aborted %d requests (%s)", len(aborted), request.reason or "no reason given")
        return actor_pb2.ActorAbortResponse(aborted_request_ids=aborted)

    def _pause_proto(self) -> actor_pb2.ActorPauseState:
        st = self.engine.pause_state()
        msg = actor_pb2.ActorPauseState(paused=st.paused, reason=st.reason)
        if st.paused:
            msg.mode = MODE_ENUM.get(st.mode, actor_pb2.PAUSE_MODE_KEEP)
            msg.since.CopyFrom(_ts(st.since))
        return msg

    async def Pause(self, request: actor_pb2.ActorPauseRequest, context: aio.ServicerContext):
        timeout = validators.pause(request)
        remaining = context.time_remaining()
        if remaining is not None:
            timeout = remaining * 0.9 if timeout is None else min(timeout, remaining * 0.9)
        _, aborted, kept = await self.engine.pause(PAUSE_MODES[request.mode], timeout, request.reason)
        return actor_pb2.ActorPauseResponse(state=self._pause_proto(), aborted=aborted, kept=kept)

    async def Resume(self, request: actor_pb2.ActorResumeRequest, context: aio.ServicerContext):
        paused_for = await self.engine.resume()
        return actor_pb2.ActorResumeResponse(state=self._pause_proto(), paused_for=_dur(paused_for))

    # ------------------------------------------------------------------------------------------ weights

    async def StageDelta(self, request_iterator: Any, context: aio.ServicerContext):
        assert self.manager is not None
        accepted = duplicates = 0
        touched: list[int] = []
        async for msg in request_iterator:
            slot = self.jobs.get(msg.job_id)  # an attached job's segment goes to its own staging
            manager = slot.manager if slot is not None else self.manager
            new = manager.stage_segment(msg, source="push")  # WeightError: mapped by the server
            if new:
                accepted += 1
            else:
                duplicates += 1
            if msg.version not in touched:
                touched.append(msg.version)
        staged = [s for v in touched for s in manager.staged(v)] if touched else []
        return actor_pb2.StageDeltaResponse(staged=staged, accepted=accepted, duplicates=duplicates)

    async def GetStaging(self, request: actor_pb2.GetStagingRequest, context: aio.ServicerContext):
        if self.manager is None:
            return actor_pb2.GetStagingResponse()
        resp = actor_pb2.GetStagingResponse(staged=self.manager.staged(request.version))
        for v, seqs in self.manager.missing(request.version).items():
            resp.missing[v].sequences.extend(seqs)
        return resp

    async def Commit(self, request: actor_pb2.ActorCommitRequest, context: aio.ServicerContext):
        validators.commit(request)
        order = request.order
        if order.actor_ids and self.actor_id not in order.actor_ids:
            raise errors.FailedPrecondition(f"the order is for {list(order.actor_ids)}, not {self.actor_id}")
        job = "" if request.job_id in ("", self.cfg.job_id) else request.job_id
        if job and job not in self.jobs:
            raise errors.NotFound(f"job_id {job!r}: not attached to this actor")
        if request.no_wait:
            self._spawn(self._commit(order, job))
            return actor_pb2.ActorCommitResponse()
        result, duplicate = await self._commit(order, job)
        return actor_pb2.ActorCommitResponse(result=result, duplicate=duplicate)

    async def _commit(self, order: common_pb2.CommitOrder, job: str = "") -> tuple[actor_pb2.WeightUpdateResult, bool]:
        """Apply an order (the manager gathers missing deltas from the relay when one is followed)."""
        manager = self.jobs[job].manager if job else self.manager
        assert manager is not None
        outcome, duplicate = await manager.commit(order)
        if outcome.error is not None:
            raise outcome.error
        return outcome.result, duplicate

    async def LoadCheckpoint(self, request: actor_pb2.LoadCheckpointRequest, context: aio.ServicerContext):
        assert self.manager is not None and self.host is not None
        validators.load_checkpoint(request)
        return await self.manager.load_checkpoint(
            request.uri,
            request.version,
            hash_=request.hash,
            replay_to=request.replay_to_version,
            mode=PAUSE_MODES[request.pause_mode],
        )

    async def PullBuckets(self, request: actor_pb2.PullBucketsRequest, context: aio.ServicerContext):
        assert self.manager is not None
        master = request.mooncake_master or self.weight_source.mooncake_master
        validators.pull_buckets(request)
        if not master:
            raise errors.FailedPrecondition("no Mooncake master (mooncake_master) is configured")
        validators.pause_mode(request.pause_mode, "pause_mode")
        return await self.manager.pull_buckets(
            master,
            request.version,
            hash_=request.hash,
            bucket_keys=list(request.bucket_keys),
            apply=request.apply,
            mode=PAUSE_MODES[request.pause_mode],
        )

    async def ResetPrefixCache(self, request: actor_pb2.ResetPrefixCacheRequest, context: aio.ServicerContext):
        return actor_pb2.ResetPrefixCacheResponse(reset=await self.engine.reset_prefix_cache())

    async def AttachJob(self, request: actor_pb2.AttachJobRequest, context: aio.ServicerContext):
        return await job_slots.attach(self, request)

    async def DetachJob(self, request: actor_pb2.DetachJobRequest, context: aio.ServicerContext):
        return await job_slots.detach(self, request)

    async def SetWeightSource(self, request: actor_pb2.SetWeightSourceRequest, context: aio.ServicerContext):
        src = request.source
        validators.weight_source(src)
        new = actor_pb2.WeightSource(
            relay_endpoint=src.relay_endpoint,
            fallback_endpoints=src.fallback_endpoints,
            streams=src.streams or self.cfg.weight_source.streams,
            checkpoint_store=src.checkpoint_store,
            mooncake_master=src.mooncake_master,
        )
        self.weight_source = new
        assert self.manager is not None
        await self.manager.unfollow()
        if new.relay_endpoint:
            self._follow_relay()  # WeightError: mapped by the server
        return self._weight_source_proto()

    def _weight_source_proto(self) -> actor_pb2.WeightSource:
        out = actor_pb2.WeightSource()
        out.CopyFrom(self.weight_source)
        source = self.manager.source if self.manager is not None else None
        if source is not None:
            out.active_endpoint = source.active_endpoint or ""
            out.connected = bool(source.connected)
        return out

    def _follow_relay(self) -> None:
        """Follow the configured relay: its deltas stage in the manager, its commit orders commit there."""
        ws = self.weight_source
        store = None
        if ws.checkpoint_store:
            from rollart.weights.checkpoint_store import open_store

            store = open_store(ws.checkpoint_store)
        assert self.manager is not None
        self.manager.follow(
            subscriber_id=self.actor_id,
            token=self.cfg.token(),
            sources=[ws.relay_endpoint, *ws.fallback_endpoints],
            streams=ws.streams or 4,
            region=self.cfg.region,
            tls=self.cfg.tls,
            checkpoint_store=store,
        )
        log.info("following relay %s", ws.relay_endpoint)

    # ------------------------------------------------------------------------------------------- status

    def weight_state(self) -> common_pb2.ActorWeightState:
        host = self.host
        st = common_pb2.ActorWeightState(
            loaded=host is not None and self.engine.ready,
            active_version=self.engine.version,
            active_hash=host.hash if host is not None else b"",
            staged=self.manager.staged() if self.manager is not None else [],
        )
        if self.engine.updating:
            st.updating = True
            st.updating_to = self.engine.updating_to
        elif self.manager is not None and self.manager.updating_to is not None:
            st.updating = True
            st.updating_to = self.manager.updating_to
        last = self.manager.last_update if self.manager is not None else None
        if last is not None:
            st.last_update_at.CopyFrom(last.completed_at)
            st.last_pause.CopyFrom(last.pause_window)
        return st

    async def GetStatus(self, request: actor_pb2.ActorStatusRequest, context: aio.ServicerContext):
        e = self.engine
        tracks = list(e.tracks.values())
        in_engine = sum(1 for t in tracks if t.task is not None and not t.finished)
        queued = min(e.stats.waiting, in_engine)  # in the engine's queue (as of its last step)
        running = in_engine - queued
        st = actor_pb2.ActorStatus(
            actor_id=self.actor_id,
            model=e.model_name,
            engine=e.engine_desc,
            endpoint=self.endpoint,
            pool=self.cfg.pool,
            region=self.cfg.region,
            hardware=self.hardware,
            pd_role=PD_ROLES[self.cfg.pd_role],
            ready=e.ready and not e.errored,
            weights=self.weight_state(),
            weight_source=self._weight_source_proto(),
            pause=self._pause_proto(),
            running_requests=running,
            waiting_requests=len(tracks) - in_engine + queued,  # at a pause, or queued in the engine
            in_flight_trajectories=len(e.by_trajectory),
            tokens_per_s=e.tokens_per_s(),
            generated_tokens_total=e.generated_total,
            prompt_tokens_total=e.prompt_total,
            kv_cache_usage=e.stats.kv_cache_usage,
            prefix_cache_hit_rate=e.stats.prefix_hit_rate,
            max_model_len=e.max_model_len,
            last_update_error=self.manager.last_error if self.manager is not None else "",
            draining=self.draining,
        )
        st.started_at.CopyFrom(_ts(e.started_at))
        st.job_id = self.cfg.job_id
        for name, slot in self.jobs.items():
            st.job_weights[name].CopyFrom(slot.weight_state())
        if self.manager is not None and self.manager.last_update is not None:
            st.last_update.CopyFrom(self.manager.last_update)
        if request.include_requests:
            for t in tracks:
                info = actor_pb2.ActorRequestInfo(
                    request_id=t.request_id,
                    trajectory_id=t.trajectory_id,
                    prompt_tokens=len(t.prompt_ids),
                    generated_tokens=len(t.tokens),
                    version=t.versions[-1] if t.versions else e.version,
                )
                info.started_at.CopyFrom(_ts(t.arrived_wall))
                st.requests.append(info)
        return st

    # ------------------------------------------------------------------------ the ledger agent's view

    def ledger_actor(self) -> ledger_pb2.LedgerActor:
        return ledger_pb2.LedgerActor(
            actor_id=self.actor_id,
            endpoint=self.endpoint,
            region=self.cfg.region,
            pool=self.cfg.pool,
            hardware=self.hardware,
            weights=self.weight_state(),
            pd_role=PD_ROLES[self.cfg.pd_role],
            labels={"model": self.engine.model_name},
        )

    def report(self) -> ActorReport:
        return ActorReport(
            weights=self.weight_state(),
            generated_tokens=self.engine.generated_total,
            in_flight_requests=self.engine.in_flight(),
            draining=self.draining,
        )

    async def commit(self, order: common_pb2.CommitOrder) -> str:
        try:
            await self._commit(order)
        except WeightError as exc:
            return f"{exc.code}: {exc}"
        return ""

    async def cancel_leases(self, trajectory_ids: Sequence[str]) -> str:
        await self.engine.abort((), trajectory_ids)
        return ""

    async def set_draining(self, draining: bool) -> str:
        self.draining = draining
        return ""

    async def switch_relay(self, endpoint: str) -> str:
        self.weight_source.relay_endpoint = endpoint
        assert self.manager is not None
        await self.manager.unfollow()
        if endpoint:
            try:
                self._follow_relay()
            except WeightError as exc:
                return str(exc)
        return ""
