"""The actor under a weight update: start a real `rollart-actor`, keep streams generating, time each update.

Shared by ``bench actor`` (tiny model, deltas of a few layers) and ``bench weights-scale --pause``
(models by size, deltas touching every tensor). One update's figures (:meth:`PauseProbe.measure`):

- ``server_ms``: the actor's own ``WeightUpdateResult.pause_window`` (engine paused -> resumed);
- ``load_ms``: ``WeightUpdateResult.load_time`` (the engine reloading the touched tensors), inside it;
- ``gap_ms``: what the streams saw, the longest time with no token arriving on any stream around the
  update; it also covers the re-prefill of every in-flight request under the new weights;
- ``rpc_ms``: the Commit / LoadCheckpoint call as the client timed it: the pause plus the actor's host
  work before it (applying a delta to its host copy and writing the touched tensors for the engine).
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "bench-actor-token"
MAX_MODEL_LEN = 2048


def prompts(n: int, length: int = 32, vocab: int = 1000, seed: int = 0) -> list[list[int]]:
    """Distinct seeded prompts as token ids (below ``vocab``: inside the tiny tokenizer's 1024 ids)."""
    rng = np.random.default_rng(seed)
    return [rng.integers(10, vocab, length).tolist() for _ in range(n)]


def generate_request(rid: str, p: list[int], tokens: int, seed: int) -> Any:
    """Sampled at temperature 1 with a seed, ignore_eos, the logprob of every token (as rollouts ask)."""
    from rollart.v1 import actor_pb2, common_pb2

    return actor_pb2.ActorGenerateRequest(
        request_id=rid,
        input=common_pb2.ModelInput(token_ids=p),
        sampling=common_pb2.SamplingParams(
            temperature=1.0, max_tokens=tokens, ignore_eos=True, seed=seed, logprobs=True
        ),
    )


async def aiter_of(items: Iterable[Any]) -> AsyncIterator[Any]:
    for x in items:
        yield x


def actor_env(model: Path, work: Path, cache: Path, *, max_num_seqs: int = 64) -> dict[str, str]:
    """The environment of a bench actor: this job's token and key, loopback, no metrics listener."""
    from tests.unit.actor.actor_testlib import JOB, KEY

    env = {k: v for k, v in os.environ.items() if not k.startswith("ROLLART_")}
    env.update(
        ROLLART_MODEL=str(model),
        ROLLART_JOB_TOKEN=TOKEN,
        ROLLART_JOB_ID=JOB,
        ROLLART_JOB_KEY=KEY.decode(),
        ROLLART_LISTEN="127.0.0.1:0",
        ROLLART_METRICS_LISTEN="",
        ROLLART_READY_FILE=str(work / "actor.ready"),
        ROLLART_VLLM_CACHE_DIR=str(cache),
        ROLLART_MAX_MODEL_LEN=str(MAX_MODEL_LEN),
        ROLLART_LOG_FORMAT="text",
        ROLLART_MAX_NUM_SEQS=str(max_num_seqs),
        PYTHONPATH=str(ROOT),
    )
    return env


def start_actor(model: Path, work: Path, cache: Path, *, timeout: float = 900.0, **kw: Any) -> tuple[Any, dict, float]:
    """A real `rollart-actor` serving ``model``: (process, its ready info, seconds from start to serving).

    The caller stops the process (``proc.stop()``), also when this raises after the start.
    """
    from rollart.local.processes import ManagedProcess

    work.mkdir(parents=True, exist_ok=True)
    proc = ManagedProcess(
        "actor",
        [str(Path(sys.executable).parent / "rollart-actor")],
        log_path=work / "actor.log",
        env=actor_env(model, work, cache, **kw),
        ready_file=work / "actor.ready",
    ).start()
    t = time.perf_counter()
    try:
        info = proc.wait_ready(timeout)
    except BaseException:
        proc.stop()
        raise
    return proc, info, time.perf_counter() - t


def segment_messages(raws: Iterable[bytes], key: bytes, job: str) -> tuple[list[Any], bytes]:
    """Raw segments of one ``D_v`` as the DeltaSegment messages of StageDelta, and h(v) from the trailer."""
    from rollart.delta import segment as sg
    from rollart.v1 import common_pb2

    msgs, last = [], None
    for raw in raws:
        last = sg.parse(raw, key)
        msgs.append(
            common_pb2.DeltaSegment(
                job_id=job,
                version=last.version,
                base_version=last.base_version,
                sequence=last.seq,
                trailer=last.is_trailer,
                data=raw,
            )
        )
    if last is None or not last.is_trailer:
        raise ValueError("a delta ends with its trailer")
    return msgs, last.hash


class PauseProbe:
    """``streams`` requests generating on the actor all along (restarted when one ends), and the arrival
    time of every token chunk, from which :meth:`measure` takes the client gap around one update."""

    def __init__(self, stub: Any, md: list, streams: int, *, prompt_len: int = 48, max_tokens: int = 1500) -> None:
        self.stub, self.md, self.streams = stub, md, streams
        self.prompt_len, self.max_tokens = prompt_len, max_tokens
        self.arrivals: list[float] = []
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task] = []

    async def _stream(self, i: int) -> None:
        while not self._stop.is_set():
            call = self.stub.Generate(
                generate_request(
                    f"pw-{time.monotonic_ns()}-{i}",
                    prompts(1, self.prompt_len, seed=100 + i)[0],
                    self.max_tokens,
                    i + 1,
                ),
                metadata=self.md,
                timeout=3600,
            )
            async for c in call:
                if c.token_ids:
                    self.arrivals.append(time.perf_counter())
                if self._stop.is_set():
                    call.cancel()
                    break

    async def start(self, chunks_per_stream: int = 20) -> None:
        """Start the streams; returns once they are in steady generation."""
        self._tasks = [asyncio.create_task(self._stream(i)) for i in range(self.streams)]
        while len(self.arrivals) < self.streams * chunks_per_stream:
            for t in self._tasks:
                if t.done():
                    t.result()  # a stream that failed: raise its error here
            await asyncio.sleep(0.05)

    async def measure(
        self,
        update: Callable[[], Awaitable[Any]],
        *,
        before: float = 0.5,
        after: float = 1.0,
        resume_timeout: float = 300.0,
    ) -> dict[str, float]:
        """Run ``update`` (returns a WeightUpdateResult) after ``before`` s of steady generation; the gap is
        taken from ``before`` s ahead of it until ``after`` s past its end and at least until every stream
        could have delivered a token again (``streams`` arrivals after the update: covers a long re-prefill)."""
        await asyncio.sleep(before)
        t0 = time.perf_counter()
        res = await update()
        t1 = time.perf_counter()
        await asyncio.sleep(after)
        deadline = time.monotonic() + resume_timeout
        while sum(1 for t in self.arrivals[-self.streams :] if t > t1) < self.streams and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        window = sorted(t for t in self.arrivals if t >= t0 - before)
        gap = max((b - a for a, b in zip(window, window[1:])), default=float("nan"))
        return {
            "server_ms": res.pause_window.ToNanoseconds() / 1e6,
            "load_ms": res.load_time.ToNanoseconds() / 1e6,
            "gap_ms": gap * 1e3,
            "rpc_ms": (t1 - t0) * 1e3,
            "tensors": res.tensors_updated,
            "recomputed": res.requests_recomputed,
            "recomputed_tokens": res.recomputed_tokens,  # re-prefilled under the new weights
            "bytes_loaded": res.bytes_loaded,  # what the actor wrote for the engine (0: loaded from the file)
        }

    async def stop(self) -> None:
        self._stop.set()
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


def commit_delta(stub: Any, md: list, version: int, h: bytes, order_id: str) -> Callable[[], Awaitable[Any]]:
    """The update that makes a staged ``D_version`` active: a Commit order, as the trainer's relay sends."""
    from rollart.v1 import actor_pb2, common_pb2

    async def run() -> Any:
        order = common_pb2.CommitOrder(order_id=order_id, version=version, hash=h)
        return (await stub.Commit(actor_pb2.ActorCommitRequest(order=order), metadata=md, timeout=600)).result

    return run


def load_checkpoint(stub: Any, md: list, uri: Path, version: int) -> Callable[[], Awaitable[Any]]:
    """The update that replaces every weight: LoadCheckpoint of a safetensors folder."""
    from rollart.v1 import actor_pb2

    async def run() -> Any:
        return await stub.LoadCheckpoint(
            actor_pb2.LoadCheckpointRequest(uri=str(uri), version=version), metadata=md, timeout=600
        )

    return run


def children(pid: int) -> list[int]:
    """Direct child processes of ``pid`` (from /proc)."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if int((d / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    out.append(int(d.name))
            except (OSError, IndexError, ValueError):
                pass
    return out


def is_engine(pid: int) -> bool:
    """A vLLM engine-core process."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"VLLM::EngineCore")
    except OSError:
        return False


def peak_rss_gib(pids: Iterable[int]) -> float:
    """Sum of the processes' peak resident sets (VmHWM), GiB."""
    total = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    total += int(line.split()[1]) * 1024
        except OSError:
            pass
    return total / 2**30
