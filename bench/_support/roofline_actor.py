"""Roofline-emulated GPU actors for the hardware-affinity benchmark ONLY (``bench affinity``): real gRPC servers
speaking ``rollart.v1.Actor`` (Generate, Tokenize, Abort, GetStatus), registered with the real resource manager
in a pool of their kind, whose generation time is what a Qwen3-8B-sized model would take on an H800
(compute-optimised) or an H20 (bandwidth-optimised) GPU by a roofline model. No GPU of either kind is on the
benchmark machine; everything around the actors (LLMProxy, ledger, envmanager, reward, resource manager) is real.

Engine model (one emulated GPU per actor, continuous batching like vLLM with chunked prefill):

- every engine step decodes one token for each running sequence and prefills up to ``max_batched_tokens`` minus
  that many prompt tokens of the waiting requests (first come, first served; a long prompt spans steps);
- a step takes max(FLOPs / peak FLOP/s, bytes / memory bandwidth): FLOPs = 2 * params per token plus attention
  (4 * layers * hidden * context per token); bytes = the weights once plus the KV cache each decoded sequence
  reads (its context * KV bytes per token) and the KV the prefill chunk writes;
- a prefix cache per trajectory: the prompt tokens of a trajectory's previous turn on this actor are not prefilled
  again (LRU, bounded by the KV memory left after the weights); so re-prefill cost is only the new tokens,
  unless the trajectory moves to another actor;
- PD: a prefill-phase request computes its prompt and returns one token; a decode-phase request first waits for
  its KV to cross the link (uncached prompt tokens * KV bytes / ``link_gbps``), then decodes.

Peak figures, used as they are (no efficiency factor, the same for both kinds): H800 989 TFLOP/s bf16 dense,
3.35 TB/s, 80 GB; H20 148 TFLOP/s, 4.0 TB/s, 96 GB. Model: Qwen3-8B (8.2e9 parameters, bf16 weights 16.4 GB,
36 layers, hidden 4096, 8 KV heads of 128: 147,456 KV bytes per token).

Time runs ``dilation`` times slower than the model says (the emulated seconds are reported); steps are scheduled
on an absolute clock so that late wake-ups on a loaded host do not accumulate, and the lag is reported.

    python bench/_support/roofline_actor.py --kind h800 --count 2 --pool h800 --resource-manager ADDR --ready FILE
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from grpc import aio

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "libs"))

from rollart.v1 import actor_pb2, actor_pb2_grpc, common_pb2  # noqa: E402
from rollart.v1 import resource_manager_pb2 as rm  # noqa: E402
from rollart.v1 import resource_manager_pb2_grpc as rm_grpc  # noqa: E402


@dataclass(frozen=True)
class Gpu:
    name: str
    kind: str  # the pool kind it registers as
    flops: float  # peak dense bf16 FLOP/s
    bandwidth: float  # bytes/s
    memory: float  # bytes


GPUS = {
    "h800": Gpu("H800", "gpu-compute", 989e12, 3.35e12, 80e9),
    "h20": Gpu("H20", "gpu-bandwidth", 148e12, 4.0e12, 96e9),
}
POOL_KINDS = {"gpu-compute": common_pb2.POOL_KIND_GPU_COMPUTE, "gpu-bandwidth": common_pb2.POOL_KIND_GPU_BANDWIDTH}


@dataclass(frozen=True)
class Model:
    params: float = 8.2e9
    weight_bytes: float = 16.4e9
    layers: int = 36
    hidden: int = 4096
    kv_bytes_per_token: float = 36 * 2 * 8 * 128 * 2  # layers * (K, V) * kv heads * head dim * bf16

    def flops(self, tokens: int, context: float) -> float:
        """FLOPs of ``tokens`` new tokens attending to ``context`` tokens each on average."""
        return tokens * (2 * self.params + 4 * self.layers * self.hidden * context)


QWEN3_8B = Model()


@dataclass(eq=False)
class Request:
    request_id: str
    trajectory_id: str
    prompt: int  # prompt tokens
    to_prefill: int  # not served from the prefix cache
    max_tokens: int
    phase: int
    chunk_tokens: int
    out: asyncio.Queue = field(default_factory=asyncio.Queue)
    prefilled: int = 0
    generated: int = 0
    aborted: bool = False

    @property
    def context(self) -> int:
        return self.prompt + self.generated


class Engine:
    """One emulated GPU: the step loop of continuous batching, timed by the roofline."""

    def __init__(self, gpu: Gpu, model: Model, dilation: float, max_batched_tokens: int, max_num_seqs: int) -> None:
        self.gpu, self.model, self.dilation = gpu, model, dilation
        self.max_batched_tokens, self.max_num_seqs = max_batched_tokens, max_num_seqs
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.cache: OrderedDict[str, int] = OrderedDict()  # trajectory -> cached prompt tokens
        self.cache_capacity = int((gpu.memory - model.weight_bytes) * 0.9 / model.kv_bytes_per_token)
        self.wake = asyncio.Event()
        self.busy_s = 0.0  # emulated seconds spent in steps
        self.lag_s = 0.0  # wall seconds the loop woke up later than scheduled (summed)
        self.steps = 0
        self.generated_total = 0
        self.prompt_total = 0

    def cached(self, trajectory_id: str, prompt: int) -> int:
        n = self.cache.get(trajectory_id, 0)
        if n:
            self.cache.move_to_end(trajectory_id)
        return min(n, prompt)

    def remember(self, trajectory_id: str, tokens: int) -> None:
        self.cache[trajectory_id] = tokens
        self.cache.move_to_end(trajectory_id)
        # A running sequence's prompt KV is its cache entry; only what it generated since is extra.
        in_use = sum(r.generated for r in self.running)
        while self.cache and sum(self.cache.values()) + in_use > self.cache_capacity:
            self.cache.popitem(last=False)

    def step_seconds(self, decode: list[Request], prefill: list[tuple[Request, int]]) -> float:
        m = self.model
        flops = sum(m.flops(1, r.context) for r in decode)
        flops += sum(m.flops(n, r.prompt - r.to_prefill + r.prefilled + n / 2) for r, n in prefill)
        read = m.weight_bytes + sum(r.context * m.kv_bytes_per_token for r in decode)
        read += sum((r.prompt - r.to_prefill + r.prefilled + n) * m.kv_bytes_per_token for r, n in prefill)
        return max(flops / self.gpu.flops, read / self.gpu.bandwidth)

    async def run(self) -> None:
        clock = time.monotonic()
        while True:
            self.running = [r for r in self.running if not r.aborted]
            if not self.running and not self.waiting:
                self.wake.clear()
                await self.wake.wait()
                clock = time.monotonic()
                continue
            decode = list(self.running)
            budget = self.max_batched_tokens - len(decode)
            prefill: list[tuple[Request, int]] = []
            for r in self.waiting:
                if budget <= 0 or len(decode) + len(prefill) >= self.max_num_seqs:
                    break
                n = min(r.to_prefill - r.prefilled, budget)
                prefill.append((r, n))
                budget -= n
            seconds = self.step_seconds(decode, prefill)
            self.busy_s += seconds
            self.steps += 1
            clock += seconds * self.dilation
            delay = clock - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            else:
                self.lag_s -= delay
                clock = time.monotonic()
            for r in decode:
                if r.aborted:
                    continue
                r.generated += 1
                self.generated_total += 1
                if r.generated >= r.max_tokens or r.generated % r.chunk_tokens == 0:
                    r.out.put_nowait(r.generated)
            self.running = [r for r in self.running if r.generated < r.max_tokens and not r.aborted]
            for r, n in prefill:
                r.prefilled += n
                if r.prefilled >= r.to_prefill:
                    self.waiting.remove(r)
                    self.prompt_total += r.prompt
                    self.remember(r.trajectory_id, r.prompt)
                    # The prefill's last step samples the first token.
                    r.generated = 1
                    self.generated_total += 1
                    r.out.put_nowait(r.generated)
                    if r.generated < r.max_tokens:
                        self.running.append(r)

    def submit(self, r: Request) -> None:
        if r.to_prefill <= 0:  # everything cached (or KV transferred): straight to decoding
            r.to_prefill = 0
            self.remember(r.trajectory_id, r.prompt)
            r.generated = 0
            self.running.append(r)
        else:
            self.waiting.append(r)
        self.wake.set()


class RooflineActor(actor_pb2_grpc.ActorServicer):
    def __init__(self, actor_id: str, pool: str, engine: Engine, link_gbps: float) -> None:
        self.actor_id, self.pool, self.engine = actor_id, pool, engine
        self.link_bytes_per_s = link_gbps * 1e9 / 8
        self.requests: dict[str, Request] = {}

    async def Generate(self, request, context):
        e = self.engine
        prompt = len(request.input.token_ids) or max(len(request.input.text), 1)
        max_tokens = max(request.sampling.max_tokens, 1)
        phase = request.pd_phase
        if phase == actor_pb2.PD_PHASE_PREFILL:
            max_tokens = 1
        cached = e.cached(request.trajectory_id, prompt)
        r = Request(
            request.request_id, request.trajectory_id, prompt, prompt - cached, max_tokens, phase,
            max(request.chunk_tokens, 1),
        )
        self.requests[r.request_id] = r
        sent = 0
        try:
            if phase == actor_pb2.PD_PHASE_DECODE:
                # The prefill actor computed the prompt: its KV (the part this actor lacks) crosses the link.
                await asyncio.sleep((prompt - cached) * e.model.kv_bytes_per_token / self.link_bytes_per_s * e.dilation)
                r.to_prefill = 0
            e.submit(r)
            sent = 0
            while sent < max_tokens:
                upto = await r.out.get()
                if r.aborted:
                    yield common_pb2.GenerationChunk(
                        request_id=r.request_id, trajectory_id=r.trajectory_id, actor_id=self.actor_id, offset=sent,
                        finish_reason=common_pb2.FINISH_REASON_ABORTED,
                    )
                    return
                k = upto - sent
                chunk = common_pb2.GenerationChunk(
                    request_id=r.request_id, trajectory_id=r.trajectory_id, actor_id=self.actor_id, offset=sent,
                    token_ids=[65 + (sent + j) % 26 for j in range(k)], logprobs=[-0.5] * k, versions=[0] * k,
                    text="".join(chr(65 + (sent + j) % 26) for j in range(k)) if request.return_text else "",
                )
                sent = upto
                if sent >= max_tokens:
                    chunk.finish_reason = common_pb2.FINISH_REASON_LENGTH
                    chunk.usage.CopyFrom(common_pb2.GenerationUsage(
                        prompt_tokens=prompt, completion_tokens=sent, cached_prompt_tokens=prompt - r.to_prefill))
                    if phase == actor_pb2.PD_PHASE_PREFILL:
                        chunk.kv_transfer_params_json = "{}"
                yield chunk
        finally:
            r.aborted = r.aborted or sent < max_tokens  # the caller went away: free the slot
            self.requests.pop(r.request_id, None)

    async def Abort(self, request, context):
        ids = set(request.request_ids)
        tids = set(request.trajectory_ids)
        done = []
        for r in list(self.requests.values()):
            if r.request_id in ids or r.trajectory_id in tids:
                r.aborted = True
                r.out.put_nowait(r.generated)
                done.append(r.request_id)
        return actor_pb2.ActorAbortResponse(aborted_request_ids=done)

    async def Tokenize(self, request, context):
        """One token per byte of the rendered chat (like the envmanager benchmarks' generator)."""
        inp = request.input
        if inp.messages:
            text = "".join(f"<s>{m.role}\n{m.content}</s>\n" for m in inp.messages)
            text += "" if inp.no_generation_prompt else "<s>assistant\n"
        else:
            text = inp.text
        return common_pb2.TokenizeResponse(token_ids=list(text.encode()) or [0], rendered=text)

    async def GetStatus(self, request, context):
        e = self.engine
        return actor_pb2.ActorStatus(
            actor_id=self.actor_id, model="qwen3-8b-roofline", engine=f"roofline {e.gpu.name} (bench/_support/roofline_actor.py)",
            pool=self.pool, ready=True, pd_role=common_pb2.PD_ROLE_UNIFIED,
            weights=common_pb2.ActorWeightState(loaded=True, active_version=0),
            running_requests=len(e.running), waiting_requests=len(e.waiting), max_model_len=40960,
        )


async def register(stub, actor_id: str, address: str, pool: str, gpu: Gpu, md) -> None:
    kind = POOL_KINDS[gpu.kind]
    pools = await stub.ListPools(rm.ListPoolsRequest(), metadata=md)
    if pool not in {p.name for p in pools.pools}:
        hw = common_pb2.Hardware(accelerator=gpu.name, count=1, memory_gib=gpu.memory / 2**30)
        await stub.RegisterPool(rm.RegisterPoolRequest(pool=rm.Pool(name=pool, kind=kind, capacity=64, hardware=hw)),
                                metadata=md)
    worker = rm.Worker(
        worker_id=actor_id, role="actor", endpoint=address, pool=pool, ttl_seconds=3.0,
        hardware=common_pb2.Hardware(accelerator=gpu.name, count=1, memory_gib=gpu.memory / 2**30,
                                     tags=[f"kind:{gpu.kind}"]),
    )
    await stub.RegisterWorker(rm.RegisterWorkerRequest(worker=worker), metadata=md)


async def serve(args: argparse.Namespace) -> None:
    gpu = GPUS[args.kind]
    token = os.environ.get("ROLLART_JOB_TOKEN", "")
    md = [("authorization", f"Bearer {token}")] if token else []
    ch = aio.insecure_channel(args.resource_manager)
    stub = rm_grpc.ResourceManagerStub(ch)
    servers, actors, engines, addresses = [], {}, [], {}
    for i in range(args.count):
        actor_id = f"{args.pool}-{i}"
        engine = Engine(gpu, QWEN3_8B, args.dilation, args.max_batched_tokens, args.max_num_seqs)
        engines.append(asyncio.get_running_loop().create_task(engine.run()))
        server = aio.server(options=[("grpc.max_concurrent_streams", 10_000)])
        actor = RooflineActor(actor_id, args.pool, engine, args.link_gbps)
        actor_pb2_grpc.add_ActorServicer_to_server(actor, server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        servers.append(server)
        actors[actor_id] = actor
        addresses[actor_id] = f"127.0.0.1:{port}"
        await register(stub, actor_id, addresses[actor_id], args.pool, gpu, md)

    async def heartbeats() -> None:
        while True:
            await asyncio.sleep(1.0)
            for actor_id in actors:
                try:
                    await stub.Heartbeat(rm.HeartbeatRequest(worker_id=actor_id), metadata=md, timeout=2)
                except aio.AioRpcError as exc:
                    if exc.code() == grpc.StatusCode.NOT_FOUND:  # expired while the host was busy: again
                        await register(stub, actor_id, addresses[actor_id], args.pool, gpu, md)

    hb = asyncio.get_running_loop().create_task(heartbeats())
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGUSR1, lambda: _dump(actors, args.stats))
    Path(args.ready).write_text(json.dumps({"pid": os.getpid(), "actors": list(actors)}))
    await stop.wait()
    _dump(actors, args.stats)
    hb.cancel()
    for t in engines:
        t.cancel()
    for s in servers:
        await s.stop(0)
    await ch.close()


def _dump(actors: dict[str, RooflineActor], path: str) -> None:
    if not path:
        return
    out = {
        aid: {"busy_s": a.engine.busy_s, "lag_s": a.engine.lag_s, "steps": a.engine.steps,
              "generated": a.engine.generated_total, "prompt": a.engine.prompt_total}
        for aid, a in actors.items()
    }
    tmp = Path(path + ".tmp")
    tmp.write_text(json.dumps(out))
    tmp.replace(path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kind", choices=sorted(GPUS), required=True)
    ap.add_argument("--count", type=int, default=1)
    ap.add_argument("--pool", required=True)
    ap.add_argument("--resource-manager", required=True)
    ap.add_argument("--ready", required=True)
    ap.add_argument("--stats", default="")
    ap.add_argument("--dilation", type=float, default=1.0)
    ap.add_argument("--max-batched-tokens", type=int, default=8192)
    ap.add_argument("--max-num-seqs", type=int, default=256)
    ap.add_argument("--link-gbps", type=float, default=400.0, help="PD KV link (400 Gb/s RDMA NIC)")
    asyncio.run(serve(ap.parse_args()))


if __name__ == "__main__":
    main()
