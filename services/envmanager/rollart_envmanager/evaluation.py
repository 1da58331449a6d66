"""Validation episodes (``EnvManager.Evaluate``): the current policy on held-out prompts, n samples each.

Each episode runs through the same loop as a training trajectory (:meth:`EpisodeContext.run`: the environment
on its sandbox, every turn through the LLMProxy) and is scored as training's are (the reward service, the
task's RewardSpec), but without the ledger: no lease is taken (the proxy routes it like a one-off episode, on
whatever version the actors serve), nothing is settled, nothing can enter a training batch, and the ledger's
in-flight window and staleness never see it. Its tokens are reported in the response, apart from training's.

An episode that fails for infrastructure reasons (a sandbox, a lost actor, the reward service) is counted in
``episodes_failed`` with its cause, never as a zero reward: mean@n and pass@n are over scored episodes.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from rollart.runtime import errors, ids
from rollart.runtime.telemetry import log_fields
from rollart.runtime.timeutil import duration
from rollart.v1 import common_pb2, envmanager_pb2

from . import validators
from .envs.registry import TaskConfig
from .episode import INFRA, Episode, InfraFailure
from .manager import Group, Manager

log = logging.getLogger(__name__)

DEFAULT_CONCURRENCY = validators.EVAL_DEFAULT_CONCURRENCY


@dataclass
class _Result:
    prompt_index: int
    sample: int
    trajectory_id: str
    status: int
    reward: float = 0.0
    failure_cause: str = ""
    turns: int = 0
    tokens: int = 0
    prompt_tokens: int = 0
    versions: tuple[int, ...] = ()
    cause_key: str = ""


class Evaluator:
    """Runs one ``EvaluateRequest`` on a :class:`~rollart_envmanager.manager.Manager`.

    ``configure`` turns an EnvironmentSpec into its TaskConfig, raising INVALID_ARGUMENT (unknown environment,
    bad options) or FAILED_PRECONDITION (cannot run here): the servicer's own check of StartLoops' specs.
    """

    def __init__(self, manager: Manager, configure: Callable[[envmanager_pb2.EnvironmentSpec], TaskConfig]) -> None:
        self.m = manager
        self.configure = configure

    def _specs(self, req: envmanager_pb2.EvaluateRequest) -> list[tuple[envmanager_pb2.EnvironmentSpec, TaskConfig]]:
        """One (EnvironmentSpec, TaskConfig) per prompt; checked once per distinct option set."""
        by_options: dict[tuple[tuple[str, str], ...], tuple[envmanager_pb2.EnvironmentSpec, TaskConfig]] = {}
        try:  # the task's own environment first: its errors name env
            by_options[()] = (req.env, self.configure(req.env))
        except errors.InvalidArgument as exc:
            raise errors.InvalidArgument(exc.field or "env", exc.message) from None
        out = []
        for i, p in enumerate(req.prompts):
            key = tuple(sorted(p.options.items()))
            if key not in by_options:
                env = envmanager_pb2.EnvironmentSpec()
                env.CopyFrom(req.env)
                env.options.update(dict(p.options))
                try:
                    by_options[key] = (env, self.configure(env))
                except errors.InvalidArgument as exc:
                    raise errors.InvalidArgument(f"prompts[{i}].options", exc.message) from None
            out.append(by_options[key])
        return out

    async def run(self, req: envmanager_pb2.EvaluateRequest) -> envmanager_pb2.EvaluateResponse:
        validators.check_evaluate(req)
        specs = self._specs(req)
        eval_id = req.evaluation_id or ids.new_id("e", nbytes=8)
        n = req.samples_per_prompt
        threshold = req.pass_threshold or 1.0
        sem = asyncio.Semaphore(req.concurrency or DEFAULT_CONCURRENCY)
        t0 = time.monotonic()

        async def one(i: int, k: int) -> _Result:
            async with sem:
                env, config = specs[i]
                return await self._episode(f"eval-{eval_id}-p{i}-s{k}", env, config, req.prompts[i], i, k)

        tasks = [asyncio.ensure_future(one(i, k)) for i in range(len(req.prompts)) for k in range(n)]
        try:
            results = await asyncio.gather(*tasks)
        except BaseException:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise
        resp = envmanager_pb2.EvaluateResponse(evaluation_id=eval_id, task=req.env.task or req.env.environment,
                                               prompts=len(req.prompts), samples_per_prompt=n)
        resp.elapsed.CopyFrom(duration(time.monotonic() - t0))
        fill(resp, results, threshold)
        log.info("evaluation done", extra=log_fields(evaluation_id=eval_id, task=resp.task,
                                                     episodes=len(results), failed=resp.episodes_failed,
                                                     mean_at_n=round(resp.mean_at_n, 4)))
        return resp

    async def _episode(self, tid: str, env: envmanager_pb2.EnvironmentSpec, config: TaskConfig,
                       prompt: envmanager_pb2.EvalPrompt, i: int, k: int) -> _Result:
        m = self.m
        group = Group(envmanager_pb2.StartLoopsRequest(group_id="evaluation", env=env, count=1), config, "", [])
        res = _Result(i, k, tid, INFRA)
        try:
            spec = m.episode_spec(group, None, seed=prompt.seed, prompt_text=prompt.prompt_text,
                                  metadata=dict(prompt.metadata))
        except InfraFailure as exc:
            res.failure_cause, res.cause_key = str(exc), exc.cause
            return res
        ep = Episode(tid, "", config.environment, spec.task)
        latency = config.latency.sampler(tid) if config.latency.enabled else None
        m.oneoff[tid] = ep  # listed in flight, abortable by id
        task = asyncio.ensure_future(m.ctx.run(ep, spec, None, latency, lambda _s: None))
        m.oneoff_tasks[tid] = task
        try:
            try:
                traj, handle = await asyncio.shield(task)
            finally:
                m.oneoff.pop(tid, None)
                m.oneoff_tasks.pop(tid, None)
            m.dispose(handle, kill=False)
        except asyncio.CancelledError:
            if ep.handle is not None:
                m.dispose(ep.handle, kill=True)
            if not task.done():
                task.cancel()
            m.spawn(m.ctx.abort_generation(tid, "evaluation cancelled"))
            if task.cancelled() and not _current_cancelled():  # aborted by id (AbortTrajectories)
                res.status, res.failure_cause = common_pb2.TRAJECTORY_STATUS_CANCELLED, "aborted"
                res.cause_key = "aborted"
                return res
            raise
        except InfraFailure as exc:
            if ep.handle is not None:
                m.dispose(ep.handle, kill=True)
            m.failures[exc.cause] += 1
            res.status, res.failure_cause, res.cause_key = exc.status or INFRA, str(exc), exc.cause
            res.tokens, res.turns = ep.tokens_generated, ep.turns
            return res
        except Exception as exc:  # noqa: BLE001 - an abort by someone else (ExternalAbort): reported, not raised
            if ep.handle is not None:
                m.dispose(ep.handle, kill=True)
            res.status = common_pb2.TRAJECTORY_STATUS_CANCELLED
            res.failure_cause, res.cause_key = f"{type(exc).__name__}: {exc}", "aborted"
            return res
        res.turns = len(traj.turns)
        res.tokens = sum(len(t.action_token_ids) for t in traj.turns)
        res.prompt_tokens = len(traj.prompt_token_ids)
        res.versions = tuple(sorted({v for t in traj.turns for v in t.action_versions}))
        outcome, cause = await m.start_scoring(traj, spec.reward)
        if outcome is None:
            res.failure_cause, res.cause_key = f"scoring failed: {cause[:500]}", "reward-failed"
            return res
        res.status, res.reward = common_pb2.TRAJECTORY_STATUS_OK, float(outcome.reward)
        return res


def _current_cancelled() -> bool:
    task = asyncio.current_task()
    return bool(task is not None and task.cancelling())


def fill(resp: envmanager_pb2.EvaluateResponse, results: list[_Result], threshold: float) -> None:
    """The response's figures from the episodes: mean@n over scored episodes; pass@n over prompts with at
    least one scored episode (a prompt passes when one of its samples reaches ``threshold``)."""
    ok = common_pb2.TRAJECTORY_STATUS_OK
    scored = [r for r in results if r.status == ok]
    causes: Counter[str] = Counter(r.cause_key or "failed" for r in results if r.status != ok)
    resp.episodes_scored = len(scored)
    resp.episodes_failed = len(results) - len(scored)
    resp.failures_by_cause.update(dict(causes))
    resp.mean_at_n = sum(r.reward for r in scored) / len(scored) if scored else 0.0
    by_prompt: dict[int, bool] = {}
    for r in scored:
        by_prompt[r.prompt_index] = by_prompt.get(r.prompt_index, False) or r.reward >= threshold
    resp.pass_at_n = sum(by_prompt.values()) / len(by_prompt) if by_prompt else 0.0
    resp.tokens_generated = sum(r.tokens for r in results)
    resp.prompt_tokens = sum(r.prompt_tokens for r in results)
    versions = [v for r in results for v in r.versions]
    resp.min_version = min(versions) if versions else -1
    resp.max_version = max(versions) if versions else -1
    for r in results:
        resp.episodes.add(prompt_index=r.prompt_index, sample=r.sample, trajectory_id=r.trajectory_id,
                          status=r.status, reward=r.reward, passed=r.status == common_pb2.TRAJECTORY_STATUS_OK
                          and r.reward >= threshold, failure_cause=r.failure_cause[:1000], turns=r.turns,
                          tokens_generated=r.tokens, versions=list(r.versions))


__all__ = ["Evaluator", "fill"]
