"""Helpers shared by the weight-plane tests: small synthetic bf16 models, digests, an in-process endpoint."""

from __future__ import annotations

import asyncio
import hashlib

import numpy as np

from rollart.delta import WeightSet, encode_delta
from rollart.weights import transport as tp

KEY = b"weights-test-job-key-0123456789abcdef"
OTHER_KEY = b"not-this-jobs-key-0123456789abcdef!!"
JOB = "job1"


def model(rng: np.random.Generator, layers: int = 2, hidden: int = 64, vocab: int = 256) -> WeightSet:
    """A Qwen3-shaped bf16 checkpoint (HF names, bf16 held as uint16 bit patterns), version 0."""
    inter, head_dim = 3 * hidden, hidden // 4
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (vocab, hidden), "model.norm.weight": (hidden,)}
    for i in range(layers):
        p = f"model.layers.{i}."
        shapes |= {
            p + "input_layernorm.weight": (hidden,),
            p + "self_attn.q_proj.weight": (hidden, hidden),
            p + "self_attn.k_proj.weight": (hidden // 2, hidden),
            p + "self_attn.v_proj.weight": (hidden // 2, hidden),
            p + "self_attn.o_proj.weight": (hidden, hidden),
            p + "self_attn.q_norm.weight": (head_dim,),
            p + "mlp.gate_proj.weight": (inter, hidden),
            p + "mlp.up_proj.weight": (inter, hidden),
            p + "mlp.down_proj.weight": (hidden, inter),
        }
    arrays = {}
    for name, shape in shapes.items():
        f = rng.standard_normal(shape, dtype=np.float32) * 0.02
        arrays[name] = (f.view(np.uint32) >> 16).astype(np.uint16)  # bf16 bit patterns
    return WeightSet(arrays, {n: "BF16" for n in arrays}, version=0)


def step(rng: np.random.Generator, ws: WeightSet, density: float = 0.02) -> WeightSet:
    """The next version: about ``density`` of the entries move by 1-3 ulps (a small optimizer step)."""
    out = ws.copy()
    out.applied_hash = None
    for a in out.arrays.values():
        flat = a.reshape(-1)
        pos = np.flatnonzero(rng.random(flat.size) < density)
        flat[pos] = flat[pos] + rng.integers(1, 4, pos.size).astype(np.uint16)
    out.version = (ws.version or 0) + 1
    return out


def digest(ws: WeightSet) -> str:
    h = hashlib.sha256()
    for name in sorted(ws.arrays):
        h.update(name.encode())
        h.update(np.ascontiguousarray(ws.arrays[name]).reshape(-1).view(np.uint8))
    return h.hexdigest()


def segments(
    base: WeightSet, target: WeightSet, version: int, key: bytes = KEY, max_segment_bytes: int = 4096
) -> list[bytes]:
    return list(
        encode_delta(
            base,
            target,
            job=JOB,
            version=version,
            key=key,
            base_version=base.version,
            max_segment_bytes=max_segment_bytes,
            format_version=2,  # many segments per delta: these tests exercise the transport, not packing
        )
    )


class Endpoint:
    """An in-process transport endpoint: push sessions land in TrackerSinks, pull sessions serve ``serve``."""

    def __init__(self, key: bytes = KEY, job: str = JOB, serve: list[bytes] | None = None, **session_kw: float) -> None:
        self.key, self.job = key, job
        self.serve = serve or []
        self.sinks: dict[bytes, tp.TrackerSink] = {}
        self.sessions: dict[bytes, tp._Session] = {}
        self.session_kw = session_kw
        self.on_segment = None
        self.server = tp.TransportServer(key_for=lambda j: self.key if j == self.job else None, admit=self._admit)

    async def start(self) -> str:
        return await self.server.start()

    async def stop(self) -> None:
        for s in self.sessions.values():
            await s.close()
        await self.server.stop()

    async def _admit(self, hello: tp.Hello):
        sid = hello.session_id
        s = self.sessions.get(sid)
        if s is None:
            if hello.role == tp.ROLE_PUSH:
                sink = tp.TrackerSink(tp.SegmentTracker(hello.job, hello.version), self.on_segment)
                sink.keep = True
                self.sinks[sid] = sink
                s = tp.ReceiverSession(
                    key=self.key,
                    sink=sink,
                    job=hello.job,
                    version=hello.version,
                    streams=hello.streams,
                    session_id=sid,
                    **self.session_kw,
                )
            else:
                s = tp.SenderSession(
                    job=hello.job, version=hello.version, streams=hello.streams, session_id=sid, **self.session_kw
                )

                async def feed(session: tp.SenderSession = s) -> None:
                    for raw in self.serve:
                        await session.send(raw)

                asyncio.ensure_future(feed())
            self.sessions[sid] = s
        return lambda conn: s.attach(hello.stream_index, conn)

    def only_sink(self) -> tp.TrackerSink:
        assert len(self.sinks) == 1, self.sinks
        return next(iter(self.sinks.values()))


def relay_env(name: str, cache_dir: str, **env: str) -> dict[str, str]:
    """Environment of a rollart-relay process serving JOB with KEY."""
    out = {
        "ROLLART_JOB_ID": JOB,
        "ROLLART_JOB_KEY": KEY.decode(),
        "ROLLART_RELAY_ID": name,
        "ROLLART_CACHE_DIR": cache_dir,
        "ROLLART_RECONNECT_TIMEOUT_SECONDS": "3",
        "ROLLART_GRACE_SECONDS": "1",
    }
    out.update(env)
    return out


def start_relay(services, name: str, **env: str):  # type: ignore[no-untyped-def]
    """Start a relay process with the ``services`` fixture; returns (process, ready info)."""
    import sys
    from pathlib import Path

    script = str(Path(sys.executable).parent / "rollart-relay")
    cache = env.pop("cache_dir", None) or str(services.tmp / f"cache-{name}")
    return services.start(name, [script], **relay_env(name, cache, **env))
