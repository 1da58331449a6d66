"""A bare grpc.aio relay, the floor under the LLMProxy's per-turn and per-chunk CPU (``bench llmproxy --floor``).

It serves ``rollart.v1.LLMProxy/Generate`` and passes each turn to one actor's ``Generate`` (with the job token
of ``ROLLART_JOB_TOKEN``): no interceptors, no auth check, validation, routing or accounting; each actor chunk is forwarded as received inside a
``TrajectoryGenerateResponse`` (field 2), never parsed. What the proxy costs above this relay is the proxy's own
work; what this relay costs is one Python gRPC hop. Variants, side by side in the benchmark:

- ``--mode yield``: the handler is an async generator (as the proxy's), ``--mode write``: it writes each response
  with ``context.write`` and reads the actor's with ``call.read()`` (the "reader/writer" API, no generators);
- ``--options JSON``: channel arguments for both the server and the actor channel (e.g. ``grpc.minimal_stack``,
  ``grpc.experimental.tcp_read_chunk_size``);
- ``--loop asyncio``: the standard library's event loop instead of uvloop (which every RollArt service runs on).

    python bench/_support/bare_relay.py --actor 127.0.0.1:PORT --ready-file F [--mode write] [--options '[["k", 1]]']

The ready file (JSON: address, pid) is written once it serves, like a RollArt service's.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import grpc
from grpc import aio

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "libs"))

from rollart.delta.leb128 import encode_int as _varint  # noqa: E402  (a protobuf length is unsigned LEB128)
from rollart.v1 import actor_pb2  # noqa: E402
from rollart.v1 import llmproxy_pb2 as pp  # noqa: E402


def _actor_request(data: bytes) -> bytes:
    r = pp.TrajectoryGenerateRequest.FromString(data)
    return actor_pb2.ActorGenerateRequest(
        request_id=f"{r.trajectory_id}:{r.turn}",
        trajectory_id=r.trajectory_id,
        input=r.input,
        sampling=r.sampling,
        chunk_tokens=r.chunk_tokens,
    ).SerializeToString()


async def serve(actor: str, ready_file: Path, mode: str, options: list[tuple[str, object]]) -> None:
    channel = aio.insecure_channel(actor, options=options)
    generate = channel.unary_stream("/rollart.v1.Actor/Generate", request_serializer=None, response_deserializer=None)
    token = os.environ.get("ROLLART_JOB_TOKEN")  # a real actor wants the job token; the caller's is not checked
    metadata = (("authorization", f"Bearer {token}"),) if token else ()

    async def relay_yield(request: bytes, context: aio.ServicerContext):
        async for raw in generate(_actor_request(request), metadata=metadata):
            yield b"\x12" + _varint(len(raw)) + raw

    async def relay_write(request: bytes, context: aio.ServicerContext) -> None:
        call = generate(_actor_request(request), metadata=metadata)
        while (raw := await call.read()) is not aio.EOF:
            await context.write(b"\x12" + _varint(len(raw)) + raw)

    handler = grpc.unary_stream_rpc_method_handler(relay_write if mode == "write" else relay_yield)
    server = aio.server(options=options)
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler("rollart.v1.LLMProxy", {"Generate": handler}),)
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    tmp = ready_file.with_suffix(".tmp")
    tmp.write_text(json.dumps({"address": f"127.0.0.1:{port}", "pid": os.getpid()}))
    tmp.replace(ready_file)
    await server.wait_for_termination()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--actor", required=True, help="the actor's address")
    p.add_argument(
        "--ready-file", type=Path, default=os.environ.get("ROLLART_READY_FILE"), help="default: $ROLLART_READY_FILE"
    )
    p.add_argument("--mode", choices=("yield", "write"), default="yield")
    p.add_argument("--options", default="[]", help="JSON list of [name, value] channel arguments")
    p.add_argument("--loop", choices=("uvloop", "asyncio"), default="uvloop")
    a = p.parse_args(argv)
    options = [(str(k), v) for k, v in json.loads(a.options)]
    if a.loop == "asyncio":
        import asyncio

        asyncio.run(serve(a.actor, a.ready_file, a.mode, options))
    else:
        import uvloop  # as every RollArt service (rollart.runtime.server.run_service)

        uvloop.run(serve(a.actor, a.ready_file, a.mode, options))
    return 0


if __name__ == "__main__":
    sys.exit(main())
