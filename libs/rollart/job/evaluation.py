"""Validation during training: the ``eval:`` section of a job file, the schedule, the calls and the figures.

The section (one task; a multi-task job lists its tasks under ``tasks:``, each naming the training task it
validates, with the section's other keys as defaults)::

    eval:
      every: 5                # evaluate after every 5th step (0: only at start and end)
      at_start: true          # evaluate v0 before the first step
      at_end: true            # evaluate the last step when it is not on the every-N grid
      seeds: {start: 1000000, count: 8}   # or a list; held-out environment seeds
      prompts: [{seed: 0, options: {desc: "SFFF,FFFF,FFFH,HFFG"}}]  # or prompts with their own options
      samples: 4              # n of mean@n and pass@n
      temperature: 1.0        # 0: greedy
      max_tokens: 0           # 0: the task's
      score_target: 0.8       # summary.json: time and step at which the validation score first reaches it
      metric: mean            # the validation score: mean (mean@n) or pass (pass@n)
      pass_threshold: 1.0     # a sample passes with a reward >= it
      concurrency: 8          # episodes at once
      timeout: 300s           # one evaluation's budget (then retried)
      retries: 2              # further attempts after a failed one (an envmanager killed mid-evaluation)

Held out: the check at job load (:func:`eval_plan`) refuses a held-out prompt that is an episode the training
can draw. Training group ``i`` of a task runs seed ``prompts.seed + i``, and a job draws at most
``batch_size / group_size * (max_steps + alpha + 2)`` groups (with dynamic sampling, up to
``max_groups_per_batch``, default 4x, a step; all seeds from ``prompts.seed`` up when ``max_steps`` is 0).
What an episode is depends on the environment (:func:`episode_key`): reasoning-gym shows entry ``seed mod
size`` of its dataset (so a held-out seed must be a held-out entry, or another dataset seed or config); a
non-slippery FrozenLake ignores the seed (the map is the episode: hold out maps); other environments are their
seed.

The evaluation runs on the envmanager (``EnvManager.Evaluate``): the same episode loop and LLMProxy as
training on whatever version the actors serve, no lease, nothing settled, nothing trained, its tokens counted
apart. :class:`Validator` schedules it from the job's step events and writes one ``metrics.jsonl`` row per task
and evaluation (``"kind": "validation"``, no ``step`` key, so step readers skip it); :func:`validation_summary`
turns the rows into summary.json's figures (time to score measured on the job's wall clock, resumes included).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from grpc import aio

from rollart.runtime.client import channel
from rollart.v1 import envmanager_pb2, envmanager_pb2_grpc, trainer_pb2

from .metrics import read_records
from .spec import JobTask, SpecError, _duration

EVAL_KEYS = (
    "every",
    "at_start",
    "at_end",
    "seeds",
    "prompts",
    "samples",
    "temperature",
    "max_tokens",
    "score_target",
    "metric",
    "pass_threshold",
    "concurrency",
    "timeout",
    "retries",
    "tasks",
)
TASK_ONLY = ("task",)
MAX_PROMPTS = 1024  # the envmanager's bounds (EnvManager.Evaluate)
MAX_SAMPLES = 64
MAX_EPISODES = 4096
KIND = "validation"
# gymnasium's default 4x4 lake (FrozenLake-v1, map_name 4x4).
FROZENLAKE_4X4 = "SFFF,FHFH,FFFH,HFFG"
_RETRY = (
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.CANCELLED,
    grpc.StatusCode.UNKNOWN,
    grpc.StatusCode.INTERNAL,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
)


@dataclass
class EvalPrompt:
    seed: int
    options: dict[str, str] = field(default_factory=dict)


@dataclass
class EvalTask:
    """The validation of one training task."""

    task: str
    environment: envmanager_pb2.EnvironmentSpec  # the task's, with the evaluation's sampling
    prompts: list[EvalPrompt]
    envmanager: str = "envmanager"
    samples: int = 1
    every: int = 0
    at_start: bool = True
    at_end: bool = True
    score_target: float | None = None
    metric: str = "mean"
    pass_threshold: float = 1.0
    concurrency: int = 8
    timeout: float = 300.0
    retries: int = 2

    def due(self, step: int, last_step: int) -> bool:
        """Whether the policy after ``step`` (0: the initial one) is evaluated."""
        if step == 0:
            return self.at_start
        if self.every and step % self.every == 0:
            return True
        return bool(self.at_end and last_step and step == last_step)

    def request(self, evaluation_id: str) -> envmanager_pb2.EvaluateRequest:
        return envmanager_pb2.EvaluateRequest(
            evaluation_id=evaluation_id,
            env=self.environment,
            prompts=[envmanager_pb2.EvalPrompt(seed=p.seed, options=p.options) for p in self.prompts],
            samples_per_prompt=self.samples,
            concurrency=self.concurrency,
            pass_threshold=self.pass_threshold,
        )


# ------------------------------------------------------------------------------------------------ the section


def _int(raw: Any, where: str, lo: int, hi: int) -> int:
    if isinstance(raw, bool) or not isinstance(raw, int) or not lo <= raw <= hi:
        raise SpecError(f"{where}: expected an integer in [{lo}, {hi}], got {raw!r}")
    return raw


def _float(raw: Any, where: str, lo: float = -math.inf, hi: float = math.inf) -> float:
    if isinstance(raw, bool) or not isinstance(raw, int | float) or not math.isfinite(raw) or not lo <= raw <= hi:
        raise SpecError(f"{where}: expected a number in [{lo:g}, {hi:g}], got {raw!r}")
    return float(raw)


def _bool(raw: Any, where: str) -> bool:
    if not isinstance(raw, bool):
        raise SpecError(f"{where}: expected true or false, got {raw!r}")
    return raw


def _prompts(item: Mapping[str, Any], where: str) -> list[EvalPrompt]:
    seeds, prompts = item.get("seeds"), item.get("prompts")
    if seeds is not None and prompts is not None:
        raise SpecError(f"{where}.seeds: give seeds or prompts, not both")
    if seeds is None and prompts is None:
        raise SpecError(f"{where}.seeds: required (held-out seeds: a list or {{start, count}}), or prompts")
    out: list[EvalPrompt] = []
    if isinstance(seeds, Mapping):
        unknown = sorted(set(seeds) - {"start", "count"})
        if unknown:
            raise SpecError(f"{where}.seeds.{unknown[0]}: unknown key (known: start, count)")
        start = _int(seeds.get("start", 0), f"{where}.seeds.start", 0, 2**62)
        count = _int(seeds.get("count"), f"{where}.seeds.count", 1, MAX_PROMPTS)
        out = [EvalPrompt(start + i) for i in range(count)]
    elif isinstance(seeds, list):
        if not seeds or len(seeds) > MAX_PROMPTS:
            raise SpecError(f"{where}.seeds: expected 1 to {MAX_PROMPTS} seeds, got {len(seeds)}")
        out = [EvalPrompt(_int(s, f"{where}.seeds[{i}]", 0, 2**62)) for i, s in enumerate(seeds)]
        if len({p.seed for p in out}) != len(out):
            raise SpecError(f"{where}.seeds: a seed is listed twice")
    elif seeds is not None:
        raise SpecError(f"{where}.seeds: expected a list of seeds or {{start, count}}, got {seeds!r}")
    if prompts is not None:
        if not isinstance(prompts, list) or not prompts or len(prompts) > MAX_PROMPTS:
            raise SpecError(f"{where}.prompts: expected a list of 1 to {MAX_PROMPTS} prompts ({{seed, options}})")
        for i, p in enumerate(prompts):
            w = f"{where}.prompts[{i}]"
            if not isinstance(p, Mapping):
                raise SpecError(f"{w}: expected a mapping (seed, options)")
            unknown = sorted(set(p) - {"seed", "options"})
            if unknown:
                raise SpecError(f"{w}.{unknown[0]}: unknown key (known: seed, options)")
            opts = p.get("options") or {}
            if not isinstance(opts, Mapping):
                raise SpecError(f"{w}.options: expected a mapping of environment options")
            seed = _int(p.get("seed", 0), f"{w}.seed", 0, 2**62)
            out.append(EvalPrompt(seed, {str(k): str(v) for k, v in opts.items()}))
    return out


def _is_true(value: str | None) -> bool:
    return str(value or "").strip().lower() in ("1", "true", "yes", "on")


def episode_key(environment: str, options: Mapping[str, str], seed: int | None) -> tuple[Any, ...]:
    """What makes an episode of ``environment`` this one (the seed of ``None``: any seed), for the held-out
    check: reasoning-gym's dataset entry, FrozenLake's map (and seed when slippery), else the seed."""
    opts = {str(k): str(v) for k, v in options.items()}
    if environment.startswith("reasoning_gym:"):
        size = int(opts.get("size") or 10_000)
        entry = None if seed is None else seed % size
        return (environment, opts.get("seed", "0"), opts.get("config", ""), entry)
    if environment == "gymnasium:FrozenLake-v1":
        desc = opts.get("desc") or (FROZENLAKE_4X4 if opts.get("map_name", "4x4") == "4x4" else opts["map_name"])
        desc = ",".join(r.strip() for r in desc.split(",") if r.strip())
        slippery = _is_true(opts.get("is_slippery"))
        return (environment, desc, slippery, seed if slippery else None)
    return (environment, seed)


def training_seeds(prompts: trainer_pb2.PromptSource, job: trainer_pb2.TrainerJobSpec) -> tuple[int, int | None]:
    """The seeds the training of a task can run: ``[start, stop)`` (``stop`` None: every seed from ``start``)."""
    if not job.max_steps:
        return prompts.seed, None
    per_step = max(job.batch_size // max(job.group_size, 1), 1)
    if job.grpo.dynamic_sampling:  # groups drawn to refill a batch after zero-variance ones were dropped
        per_step = max(job.grpo.max_groups_per_batch, 4 * per_step)
    return prompts.seed, prompts.seed + per_step * (job.max_steps + job.alpha + 2)


def held_out_problem(environment: str, train_options: Mapping[str, str], train: tuple[int, int | None],
                     prompt: EvalPrompt) -> str:
    """Why ``prompt`` is not held out from the training's episodes ("" when it is)."""
    opts = dict(train_options)
    opts.update(prompt.options)
    ev = episode_key(environment, opts, prompt.seed)
    if ev[:-1] != episode_key(environment, train_options, None)[:-1]:
        return ""  # another map, dataset or configuration: another episode, whatever the seed
    if ev[-1] is None:
        return ("the environment ignores the seed here (a non-slippery lake: the map is the episode), so this is "
                "the training's own map: hold out maps (prompts[i].options.desc) instead of seeds")
    start, stop = train
    seeds = f"seeds {start}.." + ("(no max_steps: every seed up)" if stop is None else str(stop - 1))
    if environment.startswith("reasoning_gym:"):
        size = int(opts.get("size") or 10_000)
        if stop is None or stop - start >= size:
            return f"the training ({seeds}) draws every entry of this dataset: use another options.seed or config"
        if prompt.seed % size in {s % size for s in range(start, stop)}:
            return (f"entry {prompt.seed % size} (seed {prompt.seed} mod size {size}) is one the training draws "
                    f"({seeds}): use another seed, options.seed or config")
        return ""
    if prompt.seed >= start and (stop is None or prompt.seed < stop):
        return f"seed {prompt.seed} is one the training draws ({seeds})"
    return ""


def eval_plan(
    data: Mapping[str, Any],
    job: trainer_pb2.TrainerJobSpec,
    env_spec: envmanager_pb2.EnvironmentSpec,
    tasks: Sequence[JobTask],
) -> list[EvalTask]:
    """The ``eval`` section checked field by field (a bad value is a SpecError naming ``eval.<field>`` or
    ``eval.tasks[i].<field>``), held-out prompts checked against the training's; [] without the section."""
    raw = data.get("eval")
    if raw is None:
        return []
    if not isinstance(raw, Mapping):
        raise SpecError("eval: expected a mapping")
    unknown = sorted(set(raw) - set(EVAL_KEYS) - set(TASK_ONLY))
    if unknown:
        raise SpecError(f"eval.{unknown[0]}: unknown key (known: {', '.join(EVAL_KEYS + TASK_ONLY)})")
    if "tasks" in raw and "task" in raw:
        raise SpecError("eval.task: a section with tasks names each task in its entry (eval.tasks[i].task)")
    defaults = {k: v for k, v in raw.items() if k != "tasks"}
    items: list[tuple[str, dict[str, Any]]]
    if "tasks" in raw:
        if not isinstance(raw["tasks"], list) or not raw["tasks"]:
            raise SpecError("eval.tasks: expected a non-empty list of tasks to validate")
        items = []
        for i, item in enumerate(raw["tasks"]):
            where = f"eval.tasks[{i}]"
            if not isinstance(item, Mapping):
                raise SpecError(f"{where}: expected a mapping")
            bad = sorted(set(item) - (set(EVAL_KEYS) - {"tasks"}) - set(TASK_ONLY))
            if bad:
                raise SpecError(f"{where}.{bad[0]}: unknown key")
            merged = dict(defaults)
            if "seeds" in item or "prompts" in item:
                merged.pop("seeds", None)
                merged.pop("prompts", None)
            merged.update(item)
            items.append((where, merged))
    else:
        items = [("eval", defaults)]
    by_name = {t.name: t for t in tasks}
    out: list[EvalTask] = []
    for where, item in items:
        if tasks:
            name = str(item.get("task") or (tasks[0].name if len(tasks) == 1 else ""))
            if name not in by_name:
                known = ", ".join(by_name)
                raise SpecError(f"{where}.task: {'required: ' if not name else ''}"
                                f"{'no training task ' + repr(name) if name else 'which task'} (tasks: {known})")
            t = by_name[name]
            env, src, envmanager = t.environment, t.prompts, t.envmanager
        else:
            src = job.prompts
            name = str(item.get("task") or src.task or env_spec.task or env_spec.environment)
            if item.get("task") and name != (src.task or env_spec.task or env_spec.environment):
                raise SpecError(f"{where}.task: no training task {name!r} (the job trains "
                                f"{src.task or env_spec.task or env_spec.environment!r})")
            env, envmanager = env_spec, "envmanager"
        if any(e.task == name for e in out):
            raise SpecError(f"{where}.task: task {name!r} is validated twice")
        if not env.environment:
            raise SpecError(f"{where}: the task has no environment to evaluate on")
        if src.dataset_uri:
            raise SpecError(f"{where}: task {name!r} trains on a dataset (prompts.dataset_uri); validation "
                            "takes held-out seeds or prompts of a generated environment only")
        prompts = _prompts(item, where)
        train = training_seeds(src, job)
        for i, p in enumerate(prompts):
            problem = held_out_problem(env.environment, dict(env.options), train, p)
            if problem:
                key = f"prompts[{i}]" if item.get("prompts") is not None else f"seeds[{i}]"
                raise SpecError(f"{where}.{key}: not held out: {problem}")
        samples = _int(item.get("samples", 1), f"{where}.samples", 1, MAX_SAMPLES)
        if samples * len(prompts) > MAX_EPISODES:
            raise SpecError(f"{where}.samples: {len(prompts)} prompts x {samples} samples exceeds {MAX_EPISODES}")
        environment = envmanager_pb2.EnvironmentSpec()
        environment.CopyFrom(env)
        environment.task = name
        if not environment.HasField("sampling") and job.HasField("sampling"):
            environment.sampling.CopyFrom(job.sampling)
        environment.sampling.temperature = _float(item.get("temperature", 1.0), f"{where}.temperature", 0.0, 100.0)
        max_tokens = _int(item.get("max_tokens", 0), f"{where}.max_tokens", 0, 1 << 20)
        if max_tokens:
            environment.sampling.max_tokens = max_tokens
        target = item.get("score_target")
        metric = str(item.get("metric", "mean"))
        if metric not in ("mean", "pass"):
            raise SpecError(f"{where}.metric: expected mean (mean@n) or pass (pass@n), got {metric!r}")
        timeout = float(_duration(item.get("timeout", 300), f"{where}.timeout").rstrip("s"))
        if not 1 <= timeout <= 86_400:
            raise SpecError(f"{where}.timeout: expected 1s to 24h, got {item.get('timeout')!r}")
        out.append(
            EvalTask(
                task=name,
                environment=environment,
                prompts=prompts,
                envmanager=envmanager,
                samples=samples,
                every=_int(item.get("every", 0), f"{where}.every", 0, 1 << 30),
                at_start=_bool(item.get("at_start", True), f"{where}.at_start"),
                at_end=_bool(item.get("at_end", True), f"{where}.at_end"),
                score_target=None if target is None else _float(target, f"{where}.score_target"),
                metric=metric,
                pass_threshold=_float(item.get("pass_threshold", 1.0), f"{where}.pass_threshold"),
                concurrency=_int(item.get("concurrency", 8), f"{where}.concurrency", 1, 256),
                timeout=timeout,
                retries=_int(item.get("retries", 2), f"{where}.retries", 0, 10),
            )
        )
    return out


# --------------------------------------------------------------------------------------------- the figures


def eval_rows(path: str | Path) -> list[dict[str, Any]]:
    """The validation rows of a metrics file, one per (task, step): the last written wins."""
    p = Path(path)
    if not p.is_file():
        return []
    rows: dict[tuple[str, int], dict[str, Any]] = {}
    for line in p.read_text().splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict) and rec.get("kind") == KIND and "eval_step" in rec:
            rows[(str(rec.get("task")), int(rec["eval_step"]))] = rec
    return sorted(rows.values(), key=lambda r: (r["eval_step"], str(r.get("task"))))


def append_row(path: str | Path, row: dict[str, Any]) -> None:
    """One line, one write with O_APPEND: the trainer appends its step records to the same file."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    data = (json.dumps(row, sort_keys=True) + "\n").encode()
    fd = os.open(p, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def job_start(step_records: Iterable[Mapping[str, Any]], rows: Iterable[Mapping[str, Any]]) -> float | None:
    """The job's start on the wall clock: the first step's start (as the training's time to score counts),
    or the first evaluation's policy time when no step finished."""
    starts = [float(r["started_at"]) for r in step_records if r.get("started_at")]
    if starts:
        return min(starts)
    times = [float(r["policy_at"]) for r in rows if r.get("policy_at")]
    return min(times) if times else None


def validation_summary(
    rows: Sequence[Mapping[str, Any]], step_records: Sequence[Mapping[str, Any]], plan: Sequence[EvalTask]
) -> dict[str, dict[str, Any]]:
    """Per task: its evaluations, the last and best score, and the wall seconds since the job's start and the
    step at which the validation score first reached ``score_target`` (None when it did not)."""
    t0 = job_start(step_records, rows)
    out: dict[str, dict[str, Any]] = {}
    for et in plan:
        mine = [r for r in rows if r.get("task") == et.task]
        ok = [r for r in mine if not r.get("failed")]
        reached = next((r for r in ok if et.score_target is not None and r["score"] >= et.score_target), None)
        when = None
        if reached is not None and t0 is not None:
            when = max(float(reached.get("policy_at") or t0) - t0, 0.0)
        out[et.task] = {
            "metric": f"{et.metric}@{et.samples}",
            "score_target": et.score_target,
            "time_to_score_seconds": when,
            "step_to_score": reached["eval_step"] if reached is not None else None,
            "evaluations": len(ok),
            "failed_evaluations": len(mine) - len(ok),
            "first": ok[0]["score"] if ok else None,
            "final": ok[-1]["score"] if ok else None,
            "final_step": ok[-1]["eval_step"] if ok else None,
            "best": max(r["score"] for r in ok) if ok else None,
            "mean_at_n": ok[-1].get("mean_at_n") if ok else None,
            "pass_at_n": ok[-1].get("pass_at_n") if ok else None,
            "tokens_generated": sum(int(r.get("tokens_generated", 0)) for r in mine),
            "curve": [[r["eval_step"], r["score"]] for r in ok],
        }
    return out


def progress_text(latest: Mapping[str, Mapping[str, Any]]) -> str:
    """`` | val frozenlake 0.750@10`` for the progress line ("" before the first evaluation)."""
    if not latest:
        return ""
    parts = []
    for task in sorted(latest):
        r = latest[task]
        score = "failed" if r.get("failed") else f"{r['score']:.3f}"
        parts.append(f"{task} {score}@{r['eval_step']}")
    return " | val " + ", ".join(parts)


def draw_validation(ax: Any, rows: Sequence[Mapping[str, Any]]) -> bool:
    """The validation curves (score against step, one per task) on a matplotlib axes; False when none."""
    by_task: dict[str, list[Mapping[str, Any]]] = {}
    for r in rows:
        if not r.get("failed"):
            by_task.setdefault(str(r.get("task")), []).append(r)
    if not by_task:
        return False
    for task, rs in sorted(by_task.items()):
        rs = sorted(rs, key=lambda r: r["eval_step"])
        metric = rs[-1].get("metric", "mean")
        n = rs[-1].get("n", 1)
        ax.plot([r["eval_step"] for r in rs], [r["score"] for r in rs], marker="o", linewidth=2,
                label=f"{task} {metric}@{n}")
        failed = [r for r in rows if r.get("failed") and r.get("task") == task]
        if failed:
            ax.plot([r["eval_step"] for r in failed], [0.0] * len(failed), "x", color="red", label=f"{task} failed")
    ax.set_xlabel("step")
    ax.set_ylabel("validation score")
    ax.set_title("validation (held-out)")
    ax.grid(alpha=0.3)
    ax.legend(loc="best")
    return True


# ------------------------------------------------------------------------------------------------ the calls


class Validator:
    """Evaluates the policy after the steps the plan names, one evaluation at a time, beside the training.

    ``address(name)`` gives the current address of an envmanager instance (it changes when the supervisor
    restarts one). A call that fails (an envmanager killed mid-evaluation, a deadline, every episode failed)
    is retried ``retries`` times after a pause for the supervisor; then the row says ``failed`` with the cause
    and the job goes on. Steps already in ``metrics.jsonl`` (a resumed run) are not evaluated again, and steps
    the trainer replays from before this runner started are skipped: their policy is gone.
    """

    def __init__(
        self,
        plan: Sequence[EvalTask],
        job_id: str,
        metrics_path: Path,
        address: Callable[[str], str | None],
        token: str = "",
        *,
        last_step: int = 0,
        say: Callable[[str], None] = lambda _s: None,
        retry_pause: float = 5.0,
    ) -> None:
        self.plan = list(plan)
        self.job_id = job_id
        self.metrics_path = metrics_path
        self.address = address
        self.token = token
        self.last_step = last_step
        self.say = say
        self.retry_pause = retry_pause
        self.started = time.time()
        self.queue: asyncio.Queue[tuple[int, float]] = asyncio.Queue()
        rows = eval_rows(metrics_path)
        self.done: set[tuple[str, int]] = {(str(r["task"]), int(r["eval_step"])) for r in rows}
        self.latest: dict[str, dict[str, Any]] = {}
        for r in rows:
            self.latest[str(r["task"])] = r
        self.tokens = 0
        self._idle = asyncio.Event()
        self._idle.set()

    def start(self, resumed_step: int = 0) -> None:
        """The initial policy's evaluation (a fresh job: no step finished yet)."""
        if resumed_step == 0:
            self._enqueue(0, time.time())

    def step_finished(self, step: int, finished_at: float) -> None:
        """A step event from the trainer: evaluate its policy when the plan says so and it is live."""
        if finished_at and finished_at < self.started - 1.0:
            return  # replayed from before this runner: that policy is not served any more
        self._enqueue(step, finished_at or time.time())

    def _enqueue(self, step: int, policy_at: float) -> None:
        if any(et.due(step, self.last_step) and (et.task, step) not in self.done for et in self.plan):
            self._idle.clear()
            self.queue.put_nowait((step, policy_at))

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            if self.queue.empty():
                self._idle.set()
            getter = asyncio.ensure_future(self.queue.get())
            stopper = asyncio.ensure_future(stop.wait())
            done, _ = await asyncio.wait({getter, stopper}, return_when=asyncio.FIRST_COMPLETED)
            if getter not in done:
                getter.cancel()
                with contextlib.suppress(BaseException):
                    await getter
                break
            stopper.cancel()
            step, policy_at = getter.result()
            for et in self.plan:
                if et.due(step, self.last_step) and (et.task, step) not in self.done:
                    await self.evaluate(et, step, policy_at)
            if self.queue.empty():
                self._idle.set()

    async def drain(self, timeout: float) -> bool:
        """Wait for the queued evaluations (the last step's) to end; False when they did not in time."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
            return True
        except TimeoutError:
            return False

    async def evaluate(self, et: EvalTask, step: int, policy_at: float) -> dict[str, Any]:
        started = time.time()
        errors: list[str] = []
        resp: envmanager_pb2.EvaluateResponse | None = None
        attempts = 0
        for attempt in range(et.retries + 1):
            attempts = attempt + 1
            if attempt:
                await asyncio.sleep(self.retry_pause * attempt)
            eval_id = f"{self.job_id}-{et.task}-s{step}-a{attempt}".replace(" ", "_")
            try:
                resp = await self._call(et, eval_id)
            except aio.AioRpcError as exc:
                errors.append(f"attempt {attempts}: {exc.code().name}: {(exc.details() or '')[:300]}")
                if exc.code() not in _RETRY:
                    break
                continue
            except ConnectionError as exc:
                errors.append(f"attempt {attempts}: {exc}")
                continue
            self.tokens += resp.tokens_generated
            if resp.episodes_scored == 0:
                causes = ", ".join(f"{k} x{v}" for k, v in sorted(resp.failures_by_cause.items()))
                errors.append(f"attempt {attempts}: no episode scored ({causes})")
                resp = None
                continue
            break
        row: dict[str, Any] = {
            "kind": KIND,
            "task": et.task,
            "eval_step": step,
            "policy_at": policy_at,
            "started_at": started,
            "finished_at": time.time(),
            "metric": et.metric,
            "n": et.samples,
            "prompts": len(et.prompts),
            "temperature": et.environment.sampling.temperature,
            "attempts": attempts,
        }
        if resp is None:
            row.update(failed=True, error="; ".join(errors) or "no attempt", score=None)
            self.say(f"validation       {et.task} after step {step} FAILED after {attempts} attempt(s): {row['error']}")
        else:
            row.update(
                failed=False,
                score=resp.pass_at_n if et.metric == "pass" else resp.mean_at_n,
                mean_at_n=resp.mean_at_n,
                pass_at_n=resp.pass_at_n,
                episodes_scored=resp.episodes_scored,
                episodes_failed=resp.episodes_failed,
                failures_by_cause=dict(resp.failures_by_cause),
                tokens_generated=resp.tokens_generated,
                prompt_tokens=resp.prompt_tokens,
                min_version=resp.min_version,
                max_version=resp.max_version,
                eval_seconds=resp.elapsed.ToNanoseconds() / 1e9,
                retried=errors,
            )
            self.say(
                f"validation       {et.task} after step {step}: mean@{et.samples} {resp.mean_at_n:.3f}, "
                f"pass@{et.samples} {resp.pass_at_n:.3f} ({resp.episodes_scored} episodes, "
                f"{resp.tokens_generated} tokens, {row['eval_seconds']:.1f}s, v{resp.min_version}-v{resp.max_version})"
            )
        self.done.add((et.task, step))
        self.latest[et.task] = row
        append_row(self.metrics_path, row)
        return row

    async def _call(self, et: EvalTask, eval_id: str) -> envmanager_pb2.EvaluateResponse:
        address = self.address(et.envmanager)
        if not address:
            raise ConnectionError(f"{et.envmanager} has no address (not running)")
        ch = channel(address, token=self.token, default_timeout=et.timeout)
        try:
            stub = envmanager_pb2_grpc.EnvManagerStub(ch)
            return await stub.Evaluate(et.request(eval_id), timeout=et.timeout)
        finally:
            await ch.close(grace=None)


class RunValidation:
    """``rollart run``'s side of validation: the plan checked when the job file is loaded, the Validator beside
    the job's watch, the progress text, the last step's evaluation awaited at the end, summary.json's figures."""

    def __init__(
        self,
        data: Mapping[str, Any],
        job: trainer_pb2.TrainerJobSpec,
        env_spec: envmanager_pb2.EnvironmentSpec,
        tasks: Sequence[JobTask],
        metrics_path: Path,
        *,
        say: Callable[[str], None] = lambda _s: None,
    ) -> None:
        self.plan = eval_plan(data, job, env_spec, tasks)
        self.job_id = job.job_id or "default"
        self.last_step = job.max_steps
        self.metrics_path = metrics_path
        self.say = say
        self.validator: Validator | None = None
        self._task: asyncio.Future[None] | None = None
        self._stop = asyncio.Event()

    def start(self, state_dir: Path, token: str) -> None:
        """Starts evaluating (the initial policy first, unless a resumed job already trained steps)."""
        if not self.plan:
            return
        from rollart.local import cluster as local

        def address(name: str) -> str | None:
            info = local.read_state(state_dir).get("services", {}).get(name)
            return info["address"] if info else None

        resumed = max((int(r["step"]) for r in read_records(self.metrics_path)), default=0)
        self.validator = Validator(self.plan, self.job_id, self.metrics_path, address, token,
                                   last_step=self.last_step, say=self.say)
        self._stop = asyncio.Event()
        self._task = asyncio.ensure_future(self.validator.run(self._stop))
        self.validator.start(resumed)

    def on_step(self, m: trainer_pb2.StepMetrics) -> str:
        """A finished step: evaluate its policy when due; the progress line's validation text."""
        if self.validator is None:
            return ""
        self.validator.step_finished(m.step, m.finished_at.ToNanoseconds() / 1e9 if m.HasField("finished_at") else 0)
        return progress_text(self.validator.latest)

    async def close(self, drain: bool) -> None:
        """Ends validation; with ``drain`` (the job completed) the queued evaluations finish first."""
        if self._task is None or self.validator is None:
            return
        if drain:
            budget = max(et.timeout * (et.retries + 1) + 10 * et.retries for et in self.plan)
            if not await self.validator.drain(budget):
                self.say("validation       the last evaluation did not finish in time; stopped")
        self._stop.set()
        self._task.cancel()
        with contextlib.suppress(BaseException):
            await self._task

    def rows(self) -> list[dict[str, Any]]:
        return eval_rows(self.metrics_path) if self.plan else []

    def summary(self, step_records: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]] | None:
        """summary.json's ``validation``: per task (None without an eval section)."""
        if not self.plan:
            return None
        return validation_summary(self.rows(), step_records, self.plan)
