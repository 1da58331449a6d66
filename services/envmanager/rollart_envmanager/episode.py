"""One episode: open the environment on its sandbox, reset, then turn after turn generate an action through
the LLMProxy (the whole token history each time) and step the environment; close. The result is a
``rollart.v1.Trajectory`` whose status says how it ended.

Blocking environment calls run on the envmanager's thread pool; the asyncio task of an episode can be
cancelled at any await (a lease cancellation aborts at once): the abandoned environment is killed and closed
in the background once its thread is free, and the proxy is told to abort the trajectory's generation.

Failures are typed, never a reward:
- :class:`InfraFailure` (status INFRA_FAILURE or TIMEOUT, with a cause): a sandbox failure, an actor lost
  after the bounded retries, a generation deadline, a broken environment.
- ``FINISH_REASON_ABORTED`` from the proxy (someone aborted the trajectory): :class:`ExternalAbort`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import grpc
from google.protobuf.timestamp_pb2 import Timestamp
from grpc import aio

from rollart.runtime import ids, telemetry, timeutil
from rollart.runtime.telemetry import trajectory_scope
from rollart.v1 import common_pb2
from rollart.v1 import ledger_pb2 as lp
from rollart.v1 import llmproxy_pb2 as pp

from . import metrics
from .chat import ChatFrame, FrameError, learn_frame, messages
from .envs.base import ActionError, EnvConfigError, EnvError, EnvStateError, EnvUnavailable, UnknownEnvironment
from .envs.registry import EnvRegistry, TaskConfig
from .hosting import HostedEnv, open_env
from .latency import LatencySampler
from .peers import PeerUnavailable
from .sandbox import FailureCause, SandboxFailure

log = logging.getLogger(__name__)

TS = common_pb2.TrajectoryStatus
OK, INFRA, TIMEOUT, CANCELLED = (TS.TRAJECTORY_STATUS_OK, TS.TRAJECTORY_STATUS_INFRA_FAILURE,
                                 TS.TRAJECTORY_STATUS_TIMEOUT, TS.TRAJECTORY_STATUS_CANCELLED)
_TIMEOUT_CAUSES = (FailureCause.TIMEOUT, FailureCause.BUDGET)
MD_RETRYABLE = "rollart-retryable"
GENERATE_METHOD = "/rollart.v1.LLMProxy/Generate"
MD_FAILED_ACTOR = "rollart-failed-actor"
FINAL_OBSERVATION_CHARS = 4000
UNKNOWN_HASH = bytes(32)  # for a version the ledger does not know: settlement then says UNKNOWN_VERSION


class InfraFailure(Exception):
    """The episode failed for infrastructure reasons (not the agent's): reported with its cause."""

    def __init__(self, cause: str, message: str, status: common_pb2.TrajectoryStatus = INFRA) -> None:
        super().__init__(f"[{cause}] {message}")
        self.cause = cause
        self.message = message
        self.status = status


class ExternalAbort(Exception):
    """The proxy ended a generation with FINISH_REASON_ABORTED (Abort by someone else, a lease cancellation)."""


def now_ts() -> Timestamp:
    return timeutil.now()


def new_trajectory_id() -> str:
    return ids.new_id("traj", nbytes=16)


def sandbox_failure(exc: SandboxFailure) -> InfraFailure:
    status = TIMEOUT if exc.cause in _TIMEOUT_CAUSES else INFRA
    return InfraFailure(exc.cause.value, exc.message, status)


@dataclass
class EpisodeSpec:
    """Everything one episode needs, resolved from a loop group's EnvironmentSpec and a lease's prompt."""

    config: TaskConfig
    task: str
    sampling: common_pb2.SamplingParams
    max_context_tokens: int
    generation_timeout_s: float
    reward: common_pb2.RewardSpec
    seed: int | None = None
    prompt_text: str = ""
    prompt_messages: list[common_pb2.ChatMessage] = field(default_factory=list)
    metadata: dict[str, str] = field(default_factory=dict)
    preferred_actor: str = ""


@dataclass
class Generated:
    token_ids: list[int]
    logprobs: list[float]
    versions: list[int]
    text: str
    finish_reason: int
    actor_id: str
    seconds: float
    # h(v) per version as the actor reported it (last chunk): what it really generated with.
    version_hashes: dict[int, bytes] = field(default_factory=dict)


@dataclass
class Episode:
    """A trajectory in flight (what ListTrajectories shows)."""

    trajectory_id: str
    loop_id: str
    environment: str
    task: str
    lease: lp.Lease | None = None
    started_at: Timestamp = field(default_factory=now_ts)
    turns: int = 0
    tokens_generated: int = 0
    versions: set[int] = field(default_factory=set)
    # version -> the h(v) the actors reported for it, across turns (more than one: actors disagree).
    reported_hashes: dict[int, set[bytes]] = field(default_factory=dict)
    actor_id: str = ""
    sandbox_id: str = ""
    # Why it is being aborted (set before its task is cancelled): "cancelled", "aborted", "shutdown", "expired".
    abort_kind: str = ""
    abort_reason: str = ""
    abort_at: float = 0.0
    work: dict[str, list[float]] = field(default_factory=dict)  # actor -> [tokens, seconds]
    handle: EnvHandle | None = None

    @property
    def lease_id(self) -> str:
        return self.lease.lease_id if self.lease is not None else ""


class EnvHandle:
    """An open environment plus the thread call it may be in (an abandoned episode waits for it to return)."""

    def __init__(self, env: HostedEnv, executor: concurrent.futures.Executor) -> None:
        self.env = env
        self.executor = executor
        self.busy: concurrent.futures.Future | None = None
        self.broken = False

    async def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        fut = self.executor.submit(fn, *args)
        self.busy = fut
        return await asyncio.wrap_future(fut)

    def kill(self) -> None:
        """Stops a hosted child at once (its in-flight call then fails); no-op for in-process hosts."""
        kill = getattr(self.env.host, "kill", None)
        if kill is not None:
            try:
                kill()
            except Exception:  # noqa: BLE001 - best effort; close() follows
                pass

    def close_blocking(self, wait_s: float) -> None:
        busy = self.busy
        if busy is not None and not busy.done():
            try:
                busy.result(timeout=wait_s)
            except BaseException:  # noqa: BLE001 - the abandoned call's outcome no longer matters
                pass
        try:
            self.env.close()
        except Exception as exc:  # noqa: BLE001
            log.debug("closing an environment failed: %s", exc)


async def run_blocking(executor: concurrent.futures.Executor, fn: Callable[..., Any], *args: Any) -> Any:
    return await asyncio.wrap_future(executor.submit(fn, *args))


class EpisodeContext:
    """What episodes share within one envmanager: peers, threads, chat frames and version hashes."""

    def __init__(self, cfg: Any, peers: Any, registry: EnvRegistry, executor: concurrent.futures.Executor) -> None:
        self.cfg = cfg
        self.peers = peers
        self.registry = registry
        self.executor = executor
        self.tracer = telemetry.tracer("rollart.envmanager")
        self.frames: dict[str, ChatFrame] = {}
        self.hashes: dict[int, bytes] = {}
        self._frame_locks: dict[str, asyncio.Lock] = {}

    # -- tokenization --------------------------------------------------------------------------------------------
    async def tokenize(self, task: str, inp: common_pb2.ModelInput) -> common_pb2.TokenizeResponse:
        stub = await self._proxy()
        try:
            return await stub.Tokenize(
                pp.ProxyTokenizeRequest(task=task, request=common_pb2.TokenizeRequest(input=inp)),
                timeout=self.cfg.rpc_timeout_seconds,
            )
        except aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.UNAVAILABLE:
                await self.peers.llmproxy.forget()
                raise InfraFailure("llmproxy-unavailable", f"Tokenize: {exc.details()}") from None
            if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                raise InfraFailure("llmproxy-timeout", f"Tokenize: {exc.details()}", TIMEOUT) from None
            raise InfraFailure("tokenize-rejected", f"Tokenize: {exc.code().name}: {exc.details()}") from None

    async def frame(self, task: str) -> ChatFrame:
        frame = self.frames.get(task)
        if frame is not None:
            return frame
        lock = self._frame_locks.setdefault(task, asyncio.Lock())
        async with lock:
            if task not in self.frames:
                try:
                    self.frames[task] = await learn_frame(lambda inp: self.tokenize(task, inp))
                except FrameError as exc:
                    raise InfraFailure("chat-template", str(exc)) from None
        return self.frames[task]

    async def _proxy(self) -> Any:
        try:
            return await self.peers.llmproxy.stub()
        except PeerUnavailable as exc:
            raise InfraFailure("llmproxy-unavailable", str(exc)) from None

    # -- versions --------------------------------------------------------------------------------------------------
    async def version_hash(self, version: int, lease: lp.Lease | None) -> bytes:
        if lease is not None and version == lease.version and lease.version_hash:
            return lease.version_hash
        known = self.hashes.get(version)
        if known is not None:
            return known
        if not self.peers.ledger.known:
            return UNKNOWN_HASH
        try:
            stub = await self.peers.ledger.stub()
            pv = await stub.GetVersion(lp.GetVersionRequest(version=version), timeout=self.cfg.rpc_timeout_seconds)
        except aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.NOT_FOUND:
                return UNKNOWN_HASH
            raise InfraFailure("ledger-unavailable", f"GetVersion({version}): {exc.details()}") from None
        except Exception as exc:  # noqa: BLE001 - no ledger at all (RunEpisode without one)
            log.debug("no hash for version %s: %s", version, exc)
            return UNKNOWN_HASH
        self.hashes[version] = pv.hash
        return pv.hash

    async def settled_hash(self, version: int, ep: Episode) -> bytes:
        """The h(v) the trajectory reports for ``version``: the actor's own when it reported one (settlement
        then catches an actor that ran other weights under v), else what the lease or the ledger says."""
        reported = ep.reported_hashes.get(version)
        if not reported:
            return await self.version_hash(version, ep.lease)
        if len(reported) == 1:
            return next(iter(reported))
        # Actors disagree on v's weights: at most one matches the ledger, so report one that does not and let
        # settlement refuse the trajectory rather than vouch for tokens from the wrong weights.
        expected = await self.version_hash(version, ep.lease)
        return next((h for h in sorted(reported) if h != expected), expected)

    # -- generation --------------------------------------------------------------------------------------------
    async def generate(self, ep: Episode, spec: EpisodeSpec, context: list[int], turn: int,
                       max_tokens: int) -> Generated:
        """One turn, resent (new request id, same history) after a lost actor, a bounded number of times."""
        deadline = time.monotonic() + spec.generation_timeout_s
        attempts = 1 + self.cfg.generation_retries
        last, cause = "", "actor-lost"
        for attempt in range(attempts):
            if attempt:
                metrics.GENERATION_RETRIES.inc()
                await asyncio.sleep(min(self.cfg.generation_retry_backoff_seconds * (2 ** (attempt - 1)), 5.0))
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            try:
                return await self._generate_once(ep, spec, context, turn, attempt, max_tokens, remaining)
            except aio.AioRpcError as exc:
                code = exc.code()
                if code == grpc.StatusCode.UNAVAILABLE:
                    md = dict(exc.trailing_metadata() or ())
                    failed = md.get(MD_FAILED_ACTOR, "")
                    if md.get(MD_RETRYABLE) == "true":
                        last = f"actor {failed or '?'} lost: {exc.details()}"
                        cause = "actor-lost"
                    else:
                        last = f"llmproxy unreachable: {exc.details()}"
                        cause = "llmproxy-unavailable"
                        await self.peers.llmproxy.forget()
                    log.info("turn resent", extra={"trajectory_id": ep.trajectory_id, "turn": turn,
                                                   "attempt": attempt + 1, "why": last})
                    continue
                if code == grpc.StatusCode.DEADLINE_EXCEEDED:
                    raise InfraFailure("generation-timeout", f"turn {turn}: {exc.details()}", TIMEOUT) from None
                if code == grpc.StatusCode.CANCELLED:
                    raise ExternalAbort(f"generation cancelled: {exc.details()}") from None
                raise InfraFailure("generation-rejected", f"turn {turn}: {code.name}: {exc.details()}") from None
        if not last:
            raise InfraFailure("generation-timeout", f"turn {turn}: no time left in its "
                                                     f"{spec.generation_timeout_s:g}s budget", TIMEOUT)
        raise InfraFailure(cause, f"turn {turn} failed {attempts} times; last: {last}")

    async def _generate_once(self, ep: Episode, spec: EpisodeSpec, context: list[int], turn: int, attempt: int,
                             max_tokens: int, timeout: float) -> Generated:
        try:
            generate = await self.peers.llmproxy.unary_stream(
                GENERATE_METHOD,
                pp.TrajectoryGenerateRequest.SerializeToString,
                pp.TrajectoryGenerateResponse.FromString,
            )
        except PeerUnavailable as exc:
            raise InfraFailure("llmproxy-unavailable", str(exc)) from None
        sampling = common_pb2.SamplingParams()
        sampling.CopyFrom(spec.sampling)
        sampling.max_tokens = max_tokens
        deadline = Timestamp()
        deadline.FromNanoseconds(time.time_ns() + int(timeout * 1e9))
        req = pp.TrajectoryGenerateRequest(
            trajectory_id=ep.trajectory_id,
            request_id=f"{ep.trajectory_id}-t{turn}-a{attempt}",
            turn=turn,
            task=spec.task,
            input=common_pb2.ModelInput(token_ids=context),
            sampling=sampling,
            deadline=deadline,
            preferred_actor_id=spec.preferred_actor,
            lease_id=ep.lease_id,
            return_text=True,
            job_id=self.cfg.llmproxy_job_id,
        )
        t0 = time.monotonic()
        call = generate(req, timeout=timeout, metadata=self.peers.llmproxy.metadata())
        ids: list[int] = []
        logprobs: list[float] = []
        versions: list[int] = []
        text: list[str] = []
        hashes: dict[int, bytes] = {}
        finish, actor, route_version = 0, "", None
        try:
            async for resp in call:
                if resp.HasField("route"):
                    actor = resp.route.actor_id or actor
                    route_version = resp.route.actor_version
                    ep.actor_id = actor
                c = resp.chunk
                if c.actor_id:
                    actor = c.actor_id
                n = len(c.token_ids)
                if n:
                    ids.extend(c.token_ids)
                    if len(c.logprobs) == n:
                        logprobs.extend(c.logprobs)
                    if len(c.versions) == n:
                        versions.extend(c.versions)
                    elif route_version is not None:  # a proxy that reports no per-token version: the route's
                        versions.extend([route_version] * n)
                    ep.tokens_generated += n
                text.append(c.text)
                hashes.update(c.version_hashes)
                if c.finish_reason:
                    finish = c.finish_reason
        except asyncio.CancelledError:
            # Aborted mid-generation: tell the proxy first (it ends the request on the actor at once and
            # counts it as aborted), then drop the stream. One loopback round trip, bounded.
            try:
                await asyncio.wait_for(self.abort_generation(ep.trajectory_id, "trajectory aborted"), 2.0)
            except BaseException:  # noqa: BLE001 - best effort: cancelling the stream ends it too
                pass
            raise
        finally:
            if not call.done():
                call.cancel()
        if finish == common_pb2.FINISH_REASON_ABORTED:
            raise ExternalAbort(f"turn {turn} aborted by the proxy")
        if len(versions) != len(ids):
            raise InfraFailure("generation-malformed", f"turn {turn}: {len(ids)} tokens but {len(versions)} versions")
        if len(logprobs) != len(ids):
            logprobs = []
        return Generated(ids, logprobs, versions, "".join(text), finish, actor, time.monotonic() - t0, hashes)

    async def abort_generation(self, trajectory_id: str, reason: str) -> None:
        """Ends any request of the trajectory on the proxy (idempotent; best effort)."""
        try:
            stub = await self.peers.llmproxy.stub()
            await stub.Abort(pp.ProxyAbortRequest(trajectory_ids=[trajectory_id], reason=reason[:200]),
                             timeout=self.cfg.rpc_timeout_seconds)
        except Exception as exc:  # noqa: BLE001 - an unreachable proxy has nothing of ours to abort
            log.debug("proxy abort of %s failed: %s", trajectory_id, exc)

    # -- the episode --------------------------------------------------------------------------------------------
    async def open(self, spec: EpisodeSpec, ep: Episode) -> EnvHandle:
        try:
            env = await run_blocking(self.executor, lambda: open_env(spec.config, registry=self.registry,
                                                                     apply_latency=False))
        except SandboxFailure as exc:
            raise sandbox_failure(exc) from None
        except (UnknownEnvironment, EnvUnavailable, EnvConfigError) as exc:
            raise InfraFailure("env-unavailable", f"{spec.config.environment}: {exc}") from None
        handle = EnvHandle(env, self.executor)
        ep.handle = handle
        return handle

    async def run(self, ep: Episode, spec: EpisodeSpec, handle: EnvHandle | None, latency: LatencySampler | None,
                  on_state: Callable[[str], None], before_turn: Callable[[int], Awaitable[None]] | None = None,
                  ) -> tuple[common_pb2.Trajectory, EnvHandle]:
        """Runs the episode; returns the trajectory (status OK) and the environment (open, for reuse or close).

        ``before_turn(t)`` is awaited before turn t is generated (the batch-level barrier; None: no wait).

        Raises InfraFailure, ExternalAbort, or CancelledError (aborted by the loop).
        """
        attrs = {"rollart.trajectory_id": ep.trajectory_id, "rollart.environment": spec.config.environment,
                 "rollart.task": spec.task, "rollart.lease_id": ep.lease_id}
        # One span per trajectory (a root span in a loop); every call inside carries the trajectory id as baggage.
        with self.tracer.start_as_current_span("trajectory", attributes=attrs), trajectory_scope(ep.trajectory_id):
            on_state("RESETTING")
            if handle is None:
                handle = await self.open(spec, ep)
            ep.handle = handle
            env = handle.env
            try:
                obs = await handle.call(env.reset, spec.seed)
                ep.sandbox_id = env.sandbox_id
                frame = await self.frame(spec.task)
                system = spec.config.system_prompt or env.system_prompt
                first = f"{spec.prompt_text}\n\n{obs}" if spec.prompt_text else obs
                conv = list(spec.prompt_messages) or (messages([("system", system)]) if system else [])
                conv += messages([("user", first)])
                prompt = await self.tokenize(spec.task, common_pb2.ModelInput(messages=conv))
                traj = common_pb2.Trajectory(trajectory_id=ep.trajectory_id, task=spec.task,
                                             prompt_token_ids=prompt.token_ids, started_at=ep.started_at)
                context = list(prompt.token_ids)
                end = "done"
                obs_ids: list[int] = []
                while True:
                    remaining = (spec.max_context_tokens - len(context)) if spec.max_context_tokens else None
                    if remaining is not None and remaining <= 0:
                        end = "context"
                        break
                    if before_turn is not None:
                        await before_turn(ep.turns)
                    on_state("GENERATING")
                    max_tokens = spec.sampling.max_tokens or self.cfg.default_max_tokens
                    if remaining is not None:
                        max_tokens = min(max_tokens, remaining)
                    gen = await self.generate(ep, spec, context, ep.turns, max_tokens)
                    metrics.GENERATION_SECONDS.observe(gen.seconds)
                    metrics.TOKENS.inc(len(gen.token_ids))
                    w = ep.work.setdefault(gen.actor_id or "unknown", [0, 0.0])
                    w[0] += len(gen.token_ids)
                    w[1] += gen.seconds
                    ep.versions.update(gen.versions)
                    for v, h in gen.version_hashes.items():
                        if h:
                            ep.reported_hashes.setdefault(v, set()).add(h)
                    turn = traj.turns.add(observation=obs, observation_token_ids=obs_ids, action=gen.text,
                                          action_token_ids=gen.token_ids, action_logprobs=gen.logprobs,
                                          action_versions=gen.versions, actor_id=gen.actor_id)
                    context += gen.token_ids
                    on_state("STEPPING")
                    t0 = time.monotonic()
                    result = await handle.call(env.step, gen.text)
                    if latency is not None:
                        delay = latency.sample()
                        if delay > 0:
                            await asyncio.sleep(delay)
                    metrics.STEP_SECONDS.observe(time.monotonic() - t0)
                    metrics.TURNS.inc()
                    ep.turns += 1
                    turn.env_reward = float(result.reward or 0.0)
                    obs = result.observation
                    if result.done:
                        end = "max_turns" if result.info.get("truncated") else "done"
                        break
                    obs_ids = frame.pending_closing(gen.token_ids)
                    obs_ids += (await self.tokenize(spec.task, common_pb2.ModelInput(
                        text=frame.observation_text(obs)))).token_ids
                    if spec.max_context_tokens and len(context) + len(obs_ids) >= spec.max_context_tokens:
                        end = "context"
                        break
                    context += obs_ids
            except SandboxFailure as exc:
                handle.broken = True
                raise sandbox_failure(exc) from None
            except (ActionError, EnvStateError) as exc:
                handle.broken = True
                raise InfraFailure("env-error", f"{type(exc).__name__}: {exc}") from None
            except EnvError as exc:
                handle.broken = True
                raise InfraFailure("env-error", f"{type(exc).__name__}: {exc}") from None
            except (InfraFailure, ExternalAbort):
                handle.broken = True
                raise
            if not traj.turns:
                raise InfraFailure("context-exceeded", f"the first prompt ({len(context)} tokens) leaves no room "
                                                        f"within max_context_tokens={spec.max_context_tokens}")
            traj.status = OK
            traj.finished_at.CopyFrom(now_ts())
            md = dict(spec.metadata)
            md.update(env.metadata)
            md.update(environment=spec.config.environment, env_seed="" if spec.seed is None else str(spec.seed),
                      end=end, truncated="true" if end != "done" else "false",
                      final_observation=obs[-FINAL_OBSERVATION_CHARS:])
            traj.metadata.update(md)
            for v in sorted(ep.versions):
                traj.version_hashes[v] = await self.settled_hash(v, ep)
            return traj, handle
