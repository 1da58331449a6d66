"""Every request check of the EnvManager service, on top of ``rollart.runtime.validation``.

Invariant: each check runs before any state changes and refuses with INVALID_ARGUMENT naming the field; strings
that reach the file system, a sandbox backend's command line or the environment registry (environment ids, the
sandbox image and options, environment options) hold no NUL, control or bidi characters. What needs the
service's state (unknown groups, a group id reused) stays in the servicer. See docs/envmanager.md.
"""

from __future__ import annotations

import math
import re

from rollart.runtime import errors, ids, timeutil
from rollart.runtime import validation as v
from rollart.v1 import common_pb2, envmanager_pb2

LS = envmanager_pb2.LoopState
MAX_TEXT = 1 << 20
MAX_ENV_ID_CHARS = 256
# A container image reference: [registry[:port]/]path[:tag][@digest].
IMAGE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/:@+-]{0,511}$")


def invalid(field: str, message: str) -> errors.InvalidArgument:
    """INVALID_ARGUMENT for ``field``; ``message`` is the whole details text (it names the field itself)."""
    return errors.InvalidArgument(field, message)


def _duration(name: str, d) -> None:
    timeutil.checked_duration(name, d)


def _clean(field: str, value: str, max_chars: int) -> None:
    """``value`` reaches the file system or a command line: no NUL, control or bidi characters."""
    v.path(field, value, max_chars=max_chars)


def check_sampling(s: common_pb2.SamplingParams) -> None:
    if not math.isfinite(s.temperature) or s.temperature < 0:
        raise invalid("env.sampling.temperature", "env.sampling.temperature must be >= 0")
    if not math.isfinite(s.top_p) or not 0 <= s.top_p <= 1:
        raise invalid("env.sampling.top_p", "env.sampling.top_p must be within [0, 1]")
    if s.max_tokens < 0:
        raise invalid("env.sampling.max_tokens", "env.sampling.max_tokens must be >= 0 (0: the envmanager's default)")
    if s.top_k < -1:
        raise invalid("env.sampling.top_k", "env.sampling.top_k must be >= -1")


def _options(field: str, options) -> None:
    for key, value in options.items():
        _clean(f"{field}[{errors.shorten(key, 40)}]", key, 256)
        if "\x00" in value:
            raise invalid(f"{field}[{errors.shorten(key, 40)}]", f"{field}[{errors.shorten(key, 40)}] holds a NUL")


def check_env(env: envmanager_pb2.EnvironmentSpec) -> None:
    """The checks of an EnvironmentSpec that need no registry (the servicer resolves the environment next)."""
    if not env.environment:
        raise invalid("env.environment", "env.environment is required")
    for name in ("environment", "task"):
        if len(getattr(env, name)) > MAX_ENV_ID_CHARS:
            raise invalid(f"env.{name}", "env.environment and env.task must be at most 256 characters")
    _clean("env.environment", env.environment, MAX_ENV_ID_CHARS)
    _clean("env.task", env.task, MAX_ENV_ID_CHARS)
    if env.max_turns < 0 or env.max_context_tokens < 0:
        raise invalid("env.max_turns", "env.max_turns and env.max_context_tokens must be >= 0")
    if len(env.system_prompt) > MAX_TEXT:
        raise invalid("env.system_prompt", "env.system_prompt is too long")
    _options("env.options", env.options)
    check_sampling(env.sampling)
    _duration("env.generation_timeout", env.generation_timeout)
    sb = env.sandbox
    for name in ("time_budget", "step_timeout"):
        _duration(f"env.sandbox.{name}", getattr(sb, name))
    if sb.cpu_limit < 0 or sb.memory_mib < 0 or sb.pids_limit < 0 or sb.workspace_mib < 0:
        raise invalid("env.sandbox", "env.sandbox limits must be >= 0 (0: the default)")
    if sb.backend not in envmanager_pb2.SandboxBackend.values():
        raise invalid("env.sandbox.backend", f"env.sandbox.backend {sb.backend} is not a SandboxBackend")
    if sb.image and not IMAGE_RE.match(sb.image):
        got = errors.shorten(sb.image)
        raise invalid("env.sandbox.image", f"env.sandbox.image must be an image reference, got {got}")
    _options("env.sandbox.options", sb.options)
    if env.interaction not in envmanager_pb2.InteractionMode.values():
        raise invalid("env.interaction", f"env.interaction {env.interaction} is not an InteractionMode")
    if env.reward.kind not in common_pb2.ScorerKind.values():
        raise invalid("env.reward.kind", f"env.reward.kind {env.reward.kind} is not a ScorerKind")
    _clean("env.reward.scorer", env.reward.scorer, MAX_ENV_ID_CHARS)
    _options("env.reward.options", env.reward.options)
    for name in ("mean", "stddev", "min", "max"):
        _duration(f"env.latency.{name}", getattr(env.latency, name))


def check_start_loops(request: envmanager_pb2.StartLoopsRequest) -> None:
    ids.check_id("group_id", request.group_id)
    if request.count <= 0:
        raise invalid("count", "count must be > 0")
    if request.max_trajectories_per_loop < 0:
        raise invalid("max_trajectories_per_loop", "max_trajectories_per_loop must be >= 0 (0: until stopped)")
    # Holders are holder_prefix/<index>: room is left for the index within the id rule.
    ids.check_id("holder_prefix", request.holder_prefix, required=False, max_chars=ids.MAX_ID_CHARS - 50)
    if len(request.lease_tasks) > 100 or any(not t or len(t) > 256 for t in request.lease_tasks):
        raise invalid("lease_tasks", "lease_tasks: at most 100 non-empty tags of at most 256 characters")


def check_stop_loops(request: envmanager_pb2.StopLoopsRequest) -> None:
    if not request.group_ids and not request.loop_ids:
        raise invalid("", "name group_ids or loop_ids to stop")
    if request.mode not in envmanager_pb2.LoopStopMode.values():
        raise invalid("mode", f"mode {request.mode} is not a LoopStopMode")


def check_list_loops(request: envmanager_pb2.ListLoopsRequest) -> None:
    if any(s not in LS.values() for s in request.states):
        raise errors.InvalidArgument("states", "holds a value that is not a LoopState")


def check_abort_trajectories(request: envmanager_pb2.AbortTrajectoriesRequest) -> None:
    if not request.trajectory_ids:
        raise errors.InvalidArgument("trajectory_ids", "is required")
    if len(request.trajectory_ids) > 10_000 or len(request.reason) > 1000:
        raise errors.InvalidArgument("", "at most 10000 trajectory_ids and a 1000-character reason")


def check_run_episode(request: envmanager_pb2.RunEpisodeRequest, trajectory_id: str) -> str:
    """The episode's trajectory id (``trajectory_id``: the caller's or a minted one), checked."""
    if not request.HasField("env"):
        raise invalid("env", "env is required")
    tid = ids.check_id("trajectory_id", trajectory_id)
    if len(request.prompt_text) > MAX_TEXT:
        raise invalid("prompt_text", "prompt_text is too long")
    return tid


# Evaluate's bounds: prompts, samples of each, episodes in all, episodes at once, options and metadata per prompt.
EVAL_MAX_PROMPTS = 1024
EVAL_MAX_SAMPLES = 64
EVAL_MAX_EPISODES = 4096
EVAL_MAX_CONCURRENCY = 256
EVAL_DEFAULT_CONCURRENCY = 8
EVAL_MAX_OPTIONS = 64
# Its trajectory ids are eval-<evaluation_id>-p<prompt>-s<sample>: room for the suffix within the id rule.
EVAL_ID_ROOM = 30


def check_evaluate(req: envmanager_pb2.EvaluateRequest) -> None:
    """Validation requests: bounded prompts, samples and episodes (the environment is resolved next)."""
    ids.check_id("evaluation_id", req.evaluation_id, required=False, max_chars=ids.MAX_ID_CHARS - EVAL_ID_ROOM)
    if not req.HasField("env") or not req.env.environment:
        raise errors.InvalidArgument("env.environment", "is required")
    n = len(req.prompts)
    if n == 0:
        raise errors.InvalidArgument("prompts", "is required (at least one held-out prompt)")
    if n > EVAL_MAX_PROMPTS:
        raise errors.InvalidArgument("prompts", f"at most {EVAL_MAX_PROMPTS} prompts, got {n}")
    k = req.samples_per_prompt
    if not 1 <= k <= EVAL_MAX_SAMPLES:
        raise errors.InvalidArgument("samples_per_prompt", f"must be in [1, {EVAL_MAX_SAMPLES}], got {k}")
    if n * k > EVAL_MAX_EPISODES:
        raise errors.InvalidArgument(
            "samples_per_prompt", f"{n} prompts x {k} samples = {n * k} episodes, more than {EVAL_MAX_EPISODES}")
    if not 0 <= req.concurrency <= EVAL_MAX_CONCURRENCY:
        raise errors.InvalidArgument(
            "concurrency", f"must be in [0, {EVAL_MAX_CONCURRENCY}] (0: {EVAL_DEFAULT_CONCURRENCY})")
    if not math.isfinite(req.pass_threshold):
        raise errors.InvalidArgument("pass_threshold", "must be a finite number (0: 1.0)")
    for i, p in enumerate(req.prompts):
        if len(p.options) > EVAL_MAX_OPTIONS:
            raise errors.InvalidArgument(f"prompts[{i}].options", f"at most {EVAL_MAX_OPTIONS} options")
        if any(len(value) > MAX_TEXT for value in p.options.values()):
            raise errors.InvalidArgument(f"prompts[{i}].options", "values of at most 1 MiB")
        _options(f"prompts[{i}].options", p.options)
        if len(p.prompt_text) > MAX_TEXT:
            raise errors.InvalidArgument(f"prompts[{i}].prompt_text", "is too long (1 MiB at most)")
        if len(p.metadata) > EVAL_MAX_OPTIONS or any(len(value) > MAX_TEXT for value in p.metadata.values()):
            raise errors.InvalidArgument(f"prompts[{i}].metadata", f"at most {EVAL_MAX_OPTIONS} entries of 1 MiB")
