"""A fake actor for the proxy's routing unit tests ONLY: a real gRPC server speaking rollart.v1.Actor that
streams deterministic tokens with a controllable pace, honours Abort, reports a version, and records what it
was asked. Integration tests use real vLLM actors (tests/integration/llmproxy)."""

from __future__ import annotations

import asyncio
import json

import grpc
from grpc import aio

from rollart.v1 import actor_pb2, actor_pb2_grpc, common_pb2


class FakeActor(actor_pb2_grpc.ActorServicer):
    def __init__(
        self,
        actor_id: str,
        *,
        version: int = 0,
        delay: float = 0.0,
        model: str = "tiny",
        pd_role: int = common_pb2.PD_ROLE_UNIFIED,
        honour_abort: bool = True,
    ) -> None:
        self.actor_id = actor_id
        self.version = version
        self.delay = delay
        self.model = model
        self.pd_role = pd_role
        self.honour_abort = honour_abort
        self.ready = True
        self.draining = False
        self.requests: list[actor_pb2.ActorGenerateRequest] = []
        self.metadata: list[dict[str, str]] = []  # invocation metadata of each Generate call
        self.aborts: list[actor_pb2.ActorAbortRequest] = []
        self.tokenize_calls = 0
        self.aborted: set[str] = set()
        self.active: dict[str, str] = {}  # request id -> trajectory id
        self.started = asyncio.Event()
        self.server: aio.Server | None = None
        self.address = ""
        self.gate: asyncio.Event | None = None  # when set: tokens wait for it (a stalled engine)
        # When set: status polls and tokens wait for it (a stopped process: connections accepted, no answers).
        self.hung: asyncio.Event | None = None
        self.job_versions: dict[str, int] = {}  # attached LoRA jobs -> their active version

    async def start(self, port: int = 0) -> "FakeActor":
        self.server = aio.server()
        actor_pb2_grpc.add_ActorServicer_to_server(self, self.server)
        bound = self.server.add_insecure_port(f"127.0.0.1:{port}")
        await self.server.start()
        self.address = f"127.0.0.1:{bound}"
        return self

    async def kill(self) -> None:
        """Stops serving at once (in-flight streams break, new calls are refused)."""
        assert self.server is not None
        await self.server.stop(0)

    @staticmethod
    def tokens_of(inp: common_pb2.ModelInput) -> list[int]:
        if inp.token_ids:
            return list(inp.token_ids)
        text = inp.text or "".join(f"<{m.role}>{m.content}" for m in inp.messages)
        return [ord(ch) % 1000 for ch in text]

    async def Generate(self, request, context):
        self.requests.append(request)
        self.metadata.append(dict(context.invocation_metadata() or ()))
        self.started.set()
        if request.job_id and request.job_id not in self.job_versions:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"job {request.job_id!r} not attached")
        version = self.job_versions[request.job_id] if request.job_id else self.version
        if request.min_version and version < request.min_version:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"active version {version} < min")
        if request.request_id in self.active:
            await context.abort(grpc.StatusCode.ALREADY_EXISTS, "in flight")
        prompt = self.tokens_of(request.input)
        rid, tid = request.request_id, request.trajectory_id
        self.active[rid] = tid
        try:
            if request.pd_phase == actor_pb2.PD_PHASE_PREFILL:
                params = json.dumps({"prefilled_by": self.actor_id, "tokens": len(prompt)})
                yield common_pb2.GenerationChunk(
                    request_id=rid,
                    trajectory_id=tid,
                    actor_id=self.actor_id,
                    token_ids=[7],
                    logprobs=[-0.5],
                    versions=[version],
                    prompt_token_ids=prompt,
                    kv_transfer_params_json=params,
                    finish_reason=common_pb2.FINISH_REASON_LENGTH,
                    usage=common_pb2.GenerationUsage(prompt_tokens=len(prompt), completion_tokens=1),
                )
                return
            n = request.sampling.max_tokens
            for i in range(n):
                if self.gate is not None:
                    await self.gate.wait()
                if self.hung is not None:
                    await self.hung.wait()
                if self.delay:
                    await asyncio.sleep(self.delay)
                if rid in self.aborted and self.honour_abort:
                    yield common_pb2.GenerationChunk(
                        request_id=rid,
                        trajectory_id=tid,
                        actor_id=self.actor_id,
                        offset=i,
                        finish_reason=common_pb2.FINISH_REASON_ABORTED,
                    )
                    return
                tok = (sum(prompt) + i) % 997
                chunk = common_pb2.GenerationChunk(
                    request_id=rid,
                    trajectory_id=tid,
                    actor_id=self.actor_id,
                    offset=i,
                    token_ids=[tok],
                    logprobs=[-0.25],
                    versions=[version],
                    text=f"w{tok} " if request.return_text else "",
                )
                if i == 0:
                    chunk.prompt_token_ids.extend(prompt)
                if i == n - 1:
                    chunk.finish_reason = common_pb2.FINISH_REASON_LENGTH
                    chunk.usage.prompt_tokens = len(prompt)
                    chunk.usage.completion_tokens = n
                    if request.pd_phase == actor_pb2.PD_PHASE_DECODE:  # its KV came from the prefill actor
                        chunk.usage.cached_prompt_tokens = len(prompt)
                yield chunk
        finally:
            self.active.pop(rid, None)

    async def Tokenize(self, request, context):
        if self.hung is not None:
            await self.hung.wait()
        self.tokenize_calls += 1
        ids = self.tokens_of(request.input)
        return common_pb2.TokenizeResponse(token_ids=ids, rendered="", model=self.model, max_model_len=4096)

    async def Abort(self, request, context):
        self.aborts.append(request)
        hit = [r for r, t in self.active.items() if r in request.request_ids or t in request.trajectory_ids]
        self.aborted.update(hit)
        return actor_pb2.ActorAbortResponse(aborted_request_ids=hit)

    async def GetStatus(self, request, context):
        if self.hung is not None:
            await self.hung.wait()
        return actor_pb2.ActorStatus(
            actor_id=self.actor_id,
            model=self.model,
            ready=self.ready,
            pd_role=self.pd_role,
            weights=common_pb2.ActorWeightState(loaded=True, active_version=self.version),
            job_id="own",
            job_weights={
                j: common_pb2.ActorWeightState(loaded=True, active_version=v) for j, v in self.job_versions.items()
            },
            running_requests=len(self.active),
            tokens_per_s=100.0,
            max_model_len=4096,
            draining=self.draining,
        )
