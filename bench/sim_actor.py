"""Simulated actors for the control-plane benchmarks ONLY (``bench_control_scale``, the proxy profile of
``bench_llmproxy --sim``): real gRPC servers speaking ``rollart.v1.Actor`` (Generate, Tokenize, Abort,
GetStatus), without an engine. This is a fake inside a benchmark of something else (the proxy): it stands in for
actors that do not fit on the benchmark machine, and its timing model is fixed so that what is measured is the
proxy's own cost.

Timing model of one Generate call: the first chunk is sent ``ttft_s`` after the call arrives (prefill), then one
chunk of ``chunk_tokens`` tokens every ``token_interval_s * chunk_tokens`` seconds (decode) until ``max_tokens``;
every chunk carries token ids, logprobs and versions like a real actor's (request/trajectory/actor ids, offset;
prompt ids on the first, finish reason and usage on the last). Calls do not slow each other down (an engine with
unbounded batch), so any growth of the proxy's added latency with concurrency is the proxy's (or the host's CPU).

Several actors share one process and one event loop (``serve_many``); run that in a process of its own so that
its CPU is not counted as the proxy's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from grpc import aio

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "libs"))

from rollart.v1 import actor_pb2, actor_pb2_grpc, common_pb2  # noqa: E402


@dataclass
class TimingModel:
    ttft_s: float = 0.010
    token_interval_s: float = 0.005


class SimulatedActor(actor_pb2_grpc.ActorServicer):
    def __init__(self, actor_id: str, timing: TimingModel, version: int = 0) -> None:
        self.actor_id = actor_id
        self.timing = timing
        self.version = version
        self.aborted: set[str] = set()
        self.running = 0
        self.generated = 0

    async def Generate(self, request, context):
        rid, tid = request.request_id, request.trajectory_id
        prompt = list(request.input.token_ids) or [1] * max(len(request.input.text) // 3, 1)
        n = request.sampling.max_tokens
        per_chunk = max(request.chunk_tokens, 1)
        self.running += 1
        try:
            await asyncio.sleep(self.timing.ttft_s)
            i = 0
            while i < n:
                if rid in self.aborted:
                    self.aborted.discard(rid)
                    yield common_pb2.GenerationChunk(
                        request_id=rid,
                        trajectory_id=tid,
                        actor_id=self.actor_id,
                        offset=i,
                        finish_reason=common_pb2.FINISH_REASON_ABORTED,
                    )
                    return
                k = min(per_chunk, n - i)
                chunk = common_pb2.GenerationChunk(
                    request_id=rid,
                    trajectory_id=tid,
                    actor_id=self.actor_id,
                    offset=i,
                    token_ids=[(prompt[0] + i + j) % 997 for j in range(k)],
                    logprobs=[-0.25] * k,
                    versions=[self.version] * k,
                )
                if i == 0:
                    chunk.prompt_token_ids.extend(prompt)
                i += k
                if i >= n:
                    chunk.finish_reason = common_pb2.FINISH_REASON_LENGTH
                    chunk.usage.prompt_tokens = len(prompt)
                    chunk.usage.completion_tokens = n
                self.generated += k
                yield chunk
                if i < n and self.timing.token_interval_s:
                    await asyncio.sleep(self.timing.token_interval_s * k)
        finally:
            self.running -= 1

    async def Tokenize(self, request, context):
        text = request.input.text or "".join(m.content for m in request.input.messages)
        return common_pb2.TokenizeResponse(token_ids=[ord(c) % 1000 for c in text], model="sim", max_model_len=4096)

    async def Abort(self, request, context):
        self.aborted.update(request.request_ids)
        return actor_pb2.ActorAbortResponse(aborted_request_ids=list(request.request_ids))

    async def GetStatus(self, request, context):
        return actor_pb2.ActorStatus(
            actor_id=self.actor_id,
            model="sim",
            engine="simulated (bench/sim_actor.py)",
            ready=True,
            pd_role=common_pb2.PD_ROLE_UNIFIED,
            weights=common_pb2.ActorWeightState(loaded=True, active_version=self.version),
            running_requests=self.running,
            tokens_per_s=1.0 / max(self.timing.token_interval_s, 1e-6),
            max_model_len=4096,
        )


async def serve_many(n: int, timing: TimingModel, ready_file: Path | None = None) -> None:
    """``n`` simulated actors, each a gRPC server of its own on a loopback port; writes their addresses as JSON
    (``{"actor-sim-0": "127.0.0.1:PORT", ...}``) to ``ready_file`` and serves until cancelled (SIGTERM)."""
    servers = []
    addresses = {}
    for i in range(n):
        server = aio.server(options=[("grpc.so_reuseport", 0)])
        actor_id = f"sim-{i}"
        actor_pb2_grpc.add_ActorServicer_to_server(SimulatedActor(actor_id, timing), server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        servers.append(server)
        addresses[actor_id] = f"127.0.0.1:{port}"
    if ready_file is not None:
        tmp = ready_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(addresses))
        tmp.replace(ready_file)
    stop = asyncio.Event()
    import signal

    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    for s in servers:
        await s.stop(0)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--actors", type=int, default=1)
    p.add_argument("--ttft-ms", type=float, default=10.0)
    p.add_argument("--token-ms", type=float, default=5.0)
    p.add_argument("--ready-file", type=Path, required=True)
    a = p.parse_args(argv)
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    asyncio.run(serve_many(a.actors, TimingModel(a.ttft_ms / 1e3, a.token_ms / 1e3), a.ready_file))
    return 0


if __name__ == "__main__":
    sys.exit(main())
