"""``rollart run JOB.yaml``: train one job on a local cluster, from nothing to a reward curve.

1. prepares the model (``job.model: tiny`` builds the warm-started tiny model of the ``model`` section with
   ``rollart-devtools warmstart``, cached by recipe);
2. starts a private local cluster (``rollart up`` with two actors by default: redis, the Mooncake master,
   resource manager, ledger, relay, trainer, reward, actors, LLMProxy, envmanager) in ``<out>/cluster``;
3. starts the job on the trainer and the environment loops on the envmanager;
4. shows progress (step, reward, tokens/s, staleness, the version of each actor) while restarting any
   service that dies (a supervisor: the trainer resumes from its checkpoint, an actor rejoins);
5. at the end (or on Ctrl-C / SIGTERM, or the ``run.timeout``) stops the loops and the job, writes
   ``<out>/metrics.jsonl`` (one line per step), ``<out>/reward.png`` and ``<out>/summary.json``, and stops
   every process it started.

A multi-task job file (``tasks:``) runs one loop group per task, each on the envmanager instance the task
names (``envmanager``, ``envmanager-2``, ...: as many are started as the tasks name), sets each task's
affinity rule on the LLMProxy, and reports every task's reward (progress line, ``reward.png``, summary).

torch-free: the model is built by a child process (the ``rollart-devtools`` console script).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import grpc
from google.protobuf.json_format import MessageToDict
from grpc import aio

from rollart.local import cluster as local
from rollart.local.processes import ProcessError
from rollart.local.supervisor import Event, Supervisor, base_name
from rollart.runtime.client import channel
from rollart.v1 import (
    common_pb2,
    envmanager_pb2,
    envmanager_pb2_grpc,
    ledger_pb2,
    ledger_pb2_grpc,
    llmproxy_pb2,
    llmproxy_pb2_grpc,
    reward_pb2,
    reward_pb2_grpc,
    trainer_pb2,
    trainer_pb2_grpc,
)

from .loops import LoopKeeper
from .metrics import read_records, task_rewards, time_to_score
from .spec import (
    ActorPool,
    JobTask,
    SpecError,
    apply_overrides,
    check_affinity_pools,
    cluster_actor_pools,
    environment_spec,
    job_spec,
    job_tasks,
    load_job_file,
    model_dir_digest,
)
from .timeline import plot_timeline

T = trainer_pb2

# Environment of the services under `rollart run`, unless the job file's cluster.env says otherwise.
DEFAULT_SERVICE_ENV: dict[str, dict[str, str]] = {
    # Small CPU engines: one KV-cache GiB each; a short context keeps the prefix cache hot.
    "actor": {"ROLLART_KV_CACHE_GIB": "1", "ROLLART_MAX_NUM_SEQS": "64", "ROLLART_LEDGER_HEARTBEAT_SECONDS": "0.5"},
    "trainer": {"ROLLART_TORCH_THREADS": "1"},
}


STOP_CODES = {"interrupted": 130, "terminated": 143}


@dataclass
class RunOptions:
    job_file: Path
    out_dir: Path
    actors: int = 2
    loops: int = 16
    timeout: float = 0.0
    fresh: bool = True
    min_improvement: float = 0.0  # exit 1 unless mean reward of the last 10 steps >= this x the first 10
    score_target: float | None = None  # summary.json: time until the 10-step reward average first reaches it
    restart_dead: bool = True
    restart: list[str] | None = None  # services the supervisor restarts (None: every one)
    quiet: bool = False
    service_env: dict[str, dict[str, str]] = field(default_factory=dict)
    overrides: list[str] = field(default_factory=list)  # --set KEY=VALUE, applied to the job file
    # cluster.actors as a list of pools (kinds, engine settings, CPUs); empty: `actors` in the default pool.
    actor_pools: list[ActorPool] = field(default_factory=list)


def _section(data: dict[str, Any], name: str) -> dict[str, Any]:
    value = data.get(name) or {}
    if not isinstance(value, dict):
        raise SpecError(f"{name}: expected a mapping")
    return value


def prepare_model(model_section: dict[str, Any], out_root: Path, log: TextIO) -> Path:
    """Build (or reuse) the warm-started tiny model described by the job file's ``model`` section."""
    builder = str(model_section.get("builder", "tiny"))
    if builder != "tiny":
        raise SpecError(f"model.builder: unknown builder {builder!r} (tiny)")
    recipe = {k: v for k, v in model_section.items() if k != "builder"}
    default = "mix" if recipe.get("mix") else str(recipe.get("warm_start", "plain"))
    name = str(recipe.pop("name", "tiny-" + default))
    out = Path(str(recipe.pop("dir", ""))) if recipe.get("dir") else out_root / "models" / name
    devtools = local.find_script("rollart-devtools")
    if devtools is None:
        raise ProcessError("building the model needs rollart-devtools (pip install -e tools; `make setup` does)")
    argv = [devtools, "warmstart", "--out", str(out)]
    flags = {
        "warm_start": "--task",
        "episodes": "--episodes",
        "p_expert": "--p-expert",
        "max_turns": "--max-turns",
        "layers": "--layers",
        "hidden": "--hidden",
        "vocab": "--vocab",
        "pretrain_steps": "--pretrain-steps",
        "seed": "--seed",
    }
    for key, value in recipe.items():
        if key == "options":
            for k, v in (value or {}).items():
                argv += ["--option", f"{k}={v}"]
        elif key == "mix":  # multi-task jobs: one warm start on every task's dialogs
            if not isinstance(value, list) or not value or not all(isinstance(e, dict) for e in value):
                raise SpecError("model.mix: expected a list of per-task recipes (task, episodes, p_expert, ...)")
            argv += ["--mix", json.dumps(value, sort_keys=True)]
        elif key in flags:
            argv += [flags[key], str(value)]
        else:
            raise SpecError(f"model.{key}: unknown key (known: builder, name, dir, options, mix, {', '.join(flags)})")
    print(f"model            building {out} (warm start; cached by recipe)", file=log, flush=True)
    t0 = time.monotonic()
    proc = subprocess.run(argv, capture_output=True, text=True)
    if proc.returncode != 0:
        raise ProcessError(f"building the model failed:\n{proc.stderr[-3000:]}")
    info = json.loads(proc.stdout[proc.stdout.index("{") :])
    what = "reused" if info.get("cached") else f"built in {time.monotonic() - t0:.0f}s"
    print(
        f"model            {what}: {info.get('parameters')} parameters, "
        f"warm-start expert success {info.get('expert_success_rate')}",
        file=log,
        flush=True,
    )
    return out


def _instance_number(name: str) -> int:
    """envmanager -> 1, envmanager-3 -> 3 (local cluster instance names)."""
    head, _, n = name.rpartition("-")
    return int(n) if head and n.isdigit() else 1


def actor_pools(cluster: dict[str, Any], opts: RunOptions) -> set[str]:
    """The actor pools ``rollart run`` starts: each instance's ``ROLLART_POOL`` (``cluster.env.actor-2``, else
    ``cluster.env.actor``, else the actor's default ``cpu``), or the pools of a ``cluster.actors`` list."""
    return {pool for pool, _kind in actor_instance_pools(cluster, opts).values()}


def actor_instance_pools(cluster: dict[str, Any], opts: RunOptions) -> dict[str, tuple[str, str]]:
    """Each actor instance ``rollart run`` starts (``actor``, ``actor-2``, ...) -> (its pool, its kind), as
    :func:`actor_pools` reads them (a pool list's members are numbered in list order)."""
    if isinstance(cluster.get("actors"), list):
        pools = cluster_actor_pools(cluster)
        envs = local.pool_instances("actor", [(p.count, p.env) for p in pools])
        return {name: (env["ROLLART_POOL"], env["ROLLART_POOL_KIND"]) for name, env in envs.items()}
    env = opts.service_env
    base = env.get("actor") or {}
    names = ["actor"] + [f"actor-{i}" for i in range(2, opts.actors + 1)]
    return {
        n: (
            str((env.get(n) or {}).get("ROLLART_POOL", base.get("ROLLART_POOL", "cpu"))),
            str((env.get(n) or {}).get("ROLLART_POOL_KIND", base.get("ROLLART_POOL_KIND", "cpu"))),
        )
        for n in names
    }


def stranded_tasks(
    tasks: list[JobTask], instance_pools: dict[str, tuple[str, str]], dead: set[str]
) -> list[tuple[int, JobTask, str]]:
    """Tasks no actor can ever generate for again: their affinity names a pool (or kind) whose every actor
    instance is dead and not restarted (the supervisor gave up on it), and allows no fallback. Each as
    (index in tasks, task, what is gone). Rules by tags or ``auto`` are not judged here (the proxy still
    answers their turns UNAVAILABLE)."""
    out: list[tuple[int, JobTask, str]] = []
    for i, t in enumerate(tasks):
        rule = t.affinity
        if rule is None or rule.allow_fallback or rule.auto:
            continue
        if rule.pool:
            members = [n for n, (pool, _) in instance_pools.items() if pool == rule.pool]
            what = f"pool {rule.pool!r}"
        elif rule.pool_kind:
            kind = common_pb2.PoolKind.Name(rule.pool_kind).removeprefix("POOL_KIND_").lower().replace("_", "-")
            members = [n for n, (_, k) in instance_pools.items() if k == kind]
            what = f"kind {kind}"
        else:
            continue
        if members and all(n in dead for n in members):
            out.append((i, t, f"every actor of {what} ({', '.join(sorted(members))}) is dead and not restarted"))
    return out


def _scorer_problem(spec: Any, scorers: list[Any] | None) -> str:
    """Why the reward service cannot score ``spec`` (a RewardSpec), or "" (no kind: the environment's default)."""
    if not spec.kind or scorers is None:
        return ""
    kind = common_pb2.ScorerKind.Name(spec.kind).removeprefix("SCORER_KIND_").lower()
    of_kind = [x for x in scorers if x.kind == spec.kind]
    if not of_kind:
        return f"the reward service has no {kind} scorer"
    named = {x.name for x in of_kind}
    if spec.scorer and spec.scorer not in named and "" not in named:
        return f"unknown {kind} scorer {spec.scorer!r} (known: {', '.join(sorted(named))})"
    if not any(x.available for x in of_kind if x.name in (spec.scorer, "")):
        return f"the {kind} scorer cannot run on this reward service"
    return ""


def _rule_text(rule: Any) -> str:
    if getattr(rule, "auto", False):
        return "auto"
    where = rule.pool or rule.binding_id or (f"kind {rule.pool_kind}" if rule.pool_kind else "any")
    tags = f" tags {list(rule.hardware_tags)}" if rule.hardware_tags else ""
    return where + tags + (" (fallback)" if rule.allow_fallback else "")


# ------------------------------------------------------------------------------------------------ progress


class Progress:
    """A one-line progress bar on a terminal, one line per step otherwise."""

    def __init__(self, total: int, stream: TextIO, quiet: bool = False) -> None:
        self.total = total
        self.stream = stream
        self.tty = stream.isatty()
        self.quiet = quiet
        self.t0 = time.monotonic()
        self.rewards: list[float] = []
        self.task_rewards: dict[str, list[float]] = {}  # multi-task jobs: each task's batch reward by step
        self.phase = ""
        self.last = ""

    def _bar(self, done: int, width: int = 24) -> str:
        if not self.total:
            return f"{done} steps"
        filled = int(width * min(done, self.total) / self.total)
        return "[" + "#" * filled + "." * (width - filled) + f"] {done}/{self.total}"

    def step(self, m: T.StepMetrics) -> None:
        self.rewards.append(m.reward_mean)
        recent = self.rewards[-10:]
        versions = " ".join(f"{a.split('-')[-1]}:v{v}" for a, v in sorted(m.actor_versions.items()))
        elapsed = time.monotonic() - self.t0
        self.last = (
            f"{self._bar(m.step)} reward {m.reward_mean:.3f} (avg10 {sum(recent) / len(recent):.3f})"
            f" | {m.rollout_tokens_per_s:6.0f} tok/s | stale {m.staleness_mean:.2f}/{m.staleness_max}"
            f" | wasted {m.accounting.wasted_token_fraction:4.0%} ({m.accounting_total.wasted_token_fraction:.0%} all)"
            f" | step {m.step_time.ToNanoseconds() / 1e9:5.1f}s | actors {versions or '-'} | {elapsed:4.0f}s"
        )
        if m.tasks:
            parts = []
            for task in sorted(m.tasks):
                rs = self.task_rewards.setdefault(task, [])
                rs.append(m.tasks[task].reward_mean)
                parts.append(f"{task} {rs[-1]:.3f} (avg10 {sum(rs[-10:]) / len(rs[-10:]):.3f})")
            self.last += " | tasks: " + ", ".join(parts)
        self._show(final=not self.tty)

    def note(self, text: str) -> None:
        if self.tty and self.last:
            self.stream.write("\r\x1b[2K")
        self.stream.write(text + "\n")
        if self.tty and self.last:
            self.stream.write(self.last)
        self.stream.flush()

    def _show(self, final: bool = False) -> None:
        if self.quiet:
            return
        if self.tty:
            self.stream.write("\r\x1b[2K" + self.last)
        elif final:
            self.stream.write(self.last + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.tty and self.last and not self.quiet:
            self.stream.write("\n")
            self.stream.flush()


# ------------------------------------------------------------------------------------------------ outputs


def improvement(rewards: list[float], window: int = 10) -> tuple[float, float, float]:
    """(mean of the first ``window``, mean of the last ``window``, their ratio; inf when the first is 0)."""
    if not rewards:
        return 0.0, 0.0, 0.0
    w = min(window, len(rewards))
    first = sum(rewards[:w]) / w
    last = sum(rewards[-w:]) / w
    ratio = last / first if first > 0 else (math.inf if last > 0 else 0.0)
    return first, last, ratio


def plot_rewards(records: list[dict[str, Any]], path: Path, title: str) -> bool:
    """The reward curve (mean ± std per step, and its 10-step moving average) as a PNG."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    steps = [r["step"] for r in records]
    mean = [r.get("reward_mean", 0.0) for r in records]
    std = [r.get("reward_std", 0.0) for r in records]
    avg = [sum(mean[max(0, i - 9) : i + 1]) / len(mean[max(0, i - 9) : i + 1]) for i in range(len(mean))]
    fig, ax = plt.subplots(figsize=(7, 4), dpi=110)
    lo = [max(m - s, r.get("reward_min", m - s)) for m, s, r in zip(mean, std, records)]
    hi = [min(m + s, r.get("reward_max", m + s)) for m, s, r in zip(mean, std, records)]
    ax.fill_between(steps, lo, hi, alpha=0.15, label="± std (within min..max)")
    ax.plot(steps, mean, marker=".", linewidth=1, label="batch mean reward")
    ax.plot(steps, avg, linewidth=2, label="10-step moving average")
    for task, points in sorted(task_rewards(records).items()):  # multi-task jobs: one curve per task
        xs = [p[0] for p in points]
        ys = [p[1] for p in points]
        ma = [sum(ys[max(0, i - 9) : i + 1]) / len(ys[max(0, i - 9) : i + 1]) for i in range(len(ys))]
        line = ax.plot(xs, ys, linewidth=0.8, alpha=0.5, marker=".")[0]
        ax.plot(xs, ma, linewidth=2, color=line.get_color(), label=f"{task} (10-step average)")
    ax.set_xlabel("step")
    ax.set_ylabel("reward")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(loc="best")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return True


# ---------------------------------------------------------------------------------------------------- run


class Runner:
    def __init__(self, opts: RunOptions, data: dict[str, Any], log: TextIO = sys.stderr) -> None:
        self.opts = opts
        self.data = data
        self.log = log
        self.spec = job_spec(_section(data, "job"))
        self.tasks: list[JobTask] = job_tasks(data, opts.loops)  # multi-task jobs (empty: one environment)
        self.env_spec = environment_spec(_section(data, "environment"))
        self.state_dir = opts.out_dir / "cluster"
        self.state: dict[str, Any] = {}
        self.token = ""
        self.stop_reason = ""
        self.job: T.TrainerJob | None = None
        self.restarts: dict[str, int] = {}
        self.final: dict[str, Any] = {}
        self.dead: set[str] = set()
        # What the supervisor saw and did (restarts with their causes, loop groups restored): events.jsonl.
        self.events: list[Event] = []
        # (envmanager instance, its loop group): one per task; asked again of a restarted one (LoopKeeper).
        self.loops_requests: list[tuple[str, envmanager_pb2.StartLoopsRequest]] = []
        # actor instance -> (pool, kind): which tasks lose their only actors when the supervisor gives up on one.
        self.instance_pools: dict[str, tuple[str, str]] = {}

    def say(self, text: str) -> None:
        if hasattr(self, "progress"):
            self.progress.note(text)
        else:
            print(text, file=self.log, flush=True)

    # -- set-up ---------------------------------------------------------------------------------------

    def setup(self) -> None:
        out = self.opts.out_dir
        self.instance_pools = actor_instance_pools(_section(self.data, "cluster"), self.opts)
        if self.tasks:  # before anything is built or started
            check_affinity_pools(self.tasks, {pool for pool, _ in self.instance_pools.values()})
        if self.opts.fresh:
            for p in (
                self.state_dir,
                out / "metrics.jsonl",
                out / "reward.png",
                out / "timeline.png",
                out / "summary.json",
                out / "events.jsonl",
            ):
                if p.is_dir():
                    shutil.rmtree(p)
                elif p.exists():
                    p.unlink()
        out.mkdir(parents=True, exist_ok=True)
        spec = self.spec
        if spec.model in ("", "tiny"):
            spec.model = str(prepare_model(_section(self.data, "model"), out, self.log))
        model = Path(spec.model)
        if not (model / "config.json").is_file():
            raise SpecError(
                f"job.model: {spec.model} is not a checkpoint directory (actors keep a host copy of the weights "
                "to apply deltas to; download hub models first, e.g. huggingface-cli download NAME --local-dir DIR)"
            )
        spec.model = str(model.resolve())
        env: dict[str, str] = {"ROLLART_JOB_ID": spec.job_id or "default", "ROLLART_MODEL": spec.model}
        env["ROLLART_WEIGHT_HASH"] = model_dir_digest(model).hex()  # h(v0), as the trainer computes it
        env["ROLLART_WEIGHT_VERSION"] = "0"
        store = spec.publish.checkpoint_store or str((self.state_dir / "weights").resolve())
        spec.publish.checkpoint_store = store
        env["ROLLART_WEIGHT_SOURCE__CHECKPOINT_STORE"] = store
        overrides: dict[str, dict[str, str]] = {}
        for name, extra in DEFAULT_SERVICE_ENV.items():
            overrides.setdefault(name, {}).update(extra)
        for name, extra in self.opts.service_env.items():
            overrides.setdefault(name, {}).update({k: str(v) for k, v in extra.items()})
        pools = [(p.count, p.env) for p in self.opts.actor_pools]
        for name, extra in local.pool_instances("actor", pools).items():  # each actor its pool, kind and CPUs
            overrides.setdefault(name, {}).update(extra)
        replicas = {"actor": self.opts.actors}
        if self.tasks:
            # envmanager, envmanager-2, ...: as many instances as the tasks name
            replicas["envmanager"] = max(_instance_number(t.envmanager) for t in self.tasks)
        self.say(f"cluster          starting in {self.state_dir} ({self.opts.actors} actors)")
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            self.state = local.up(
                self.state_dir,
                replicas=replicas,
                env_overrides=overrides,
                log=lambda line: self.say("  " + line),
                ready_timeout=120.0,
            )
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        self.token = Path(self.state["token_file"]).read_text().strip()
        svc = self.state["services"]
        for needed in ("ledger", "relay", "trainer", "llmproxy", "envmanager", "actor"):
            if needed not in svc:
                raise ProcessError(f"{needed} did not start (is it installed? run `make setup`)")
        spec.endpoints.ledger = spec.endpoints.ledger or svc["ledger"]["address"]
        spec.endpoints.llmproxy = spec.endpoints.llmproxy or svc["llmproxy"]["address"]
        if not spec.publish.relay_endpoints:
            spec.publish.relay_endpoints.append(svc["relay"]["address"])
        if not spec.publish.mooncake_master and self.state.get("mooncake"):
            spec.publish.mooncake_master = self.state["mooncake"]["address"]
        spec.metrics_path = str((out / "metrics.jsonl").resolve())
        if not self.env_spec.task:
            self.env_spec.task = spec.prompts.task or self.env_spec.environment
        if not spec.prompts.task:
            spec.prompts.task = self.env_spec.task
        if not spec.prompts.environment:
            spec.prompts.environment = self.env_spec.environment
        if not self.env_spec.HasField("sampling") and spec.HasField("sampling"):
            self.env_spec.sampling.CopyFrom(spec.sampling)
        for t in self.tasks:
            if not t.environment.HasField("sampling") and spec.HasField("sampling"):
                t.environment.sampling.CopyFrom(spec.sampling)
            missing = t.envmanager not in svc
            if missing:
                raise ProcessError(f"{t.envmanager} did not start (it serves task {t.name})")
        if self.tasks:
            spec.ClearField("prompts")
            del spec.tasks[:]
            spec.tasks.extend(t.prompts for t in self.tasks)

    # -- the job ---------------------------------------------------------------------------------------

    def _trainer(self) -> tuple[aio.Channel, trainer_pb2_grpc.TrainerStub]:
        addr = self.state["services"]["trainer"]["address"]
        ch = channel(addr, token=self.token, default_timeout=30.0, idempotent=["rollart.v1.Trainer"])
        return ch, trainer_pb2_grpc.TrainerStub(ch)

    async def start(self) -> None:
        if self.tasks:
            await self.check_tasks()
        ch, stub = self._trainer()
        try:
            job = await stub.StartJob(T.StartJobRequest(spec=self.spec))
            self.say(f"job              {job.spec.job_id}: {T.TrainerJobState.Name(job.state)}")
        finally:
            await ch.close()
        if self.tasks:
            await self._set_affinity()
            self.loops_requests = [
                (
                    t.envmanager,
                    envmanager_pb2.StartLoopsRequest(
                        group_id=f"{self.spec.job_id}-t{i}-loops",
                        env=t.environment,
                        count=t.loops,
                        lease_tasks=[t.name],
                    ),
                )
                for i, t in enumerate(self.tasks)
            ]
        else:
            req = envmanager_pb2.StartLoopsRequest(
                group_id=f"{self.spec.job_id}-loops",
                env=self.env_spec,
                count=self.opts.loops,
                lease_tasks=[self.spec.prompts.task],
            )
            self.loops_requests = [("envmanager", req)]
        for name, req in self.loops_requests:
            ech = channel(self.state["services"][name]["address"], token=self.token, default_timeout=30.0)
            try:
                group = await envmanager_pb2_grpc.EnvManagerStub(ech).StartLoops(req)
            finally:
                await ech.close()
            self.say(f"{name:<16} {group.count} loops of {req.env.environment} (task {req.env.task})")

    async def check_tasks(self) -> None:
        """Refuse a multi-task job before it starts when a task names an environment its envmanager does not
        have (or cannot run here) or a scorer the reward service does not have: SpecError naming the field."""
        svc = self.state["services"]
        listed: dict[str, dict[str, envmanager_pb2.EnvironmentInfo]] = {}
        for name in sorted({t.envmanager for t in self.tasks}):
            ch = channel(svc[name]["address"], token=self.token, default_timeout=30.0)
            try:
                resp = await envmanager_pb2_grpc.EnvManagerStub(ch).ListEnvironments(
                    envmanager_pb2.ListEnvironmentsRequest(include_unavailable=True)
                )
            finally:
                await ch.close()
            listed[name] = {e.id: e for e in resp.environments}
        scorers: list[reward_pb2.ScorerInfo] | None = None
        if "reward" in svc and any(t.environment.reward.kind for t in self.tasks):
            ch = channel(svc["reward"]["address"], token=self.token, default_timeout=30.0)
            try:
                got = await reward_pb2_grpc.RewardStub(ch).ListScorers(reward_pb2.ListScorersRequest())
                scorers = list(got.scorers)
            finally:
                await ch.close()
        for i, t in enumerate(self.tasks):
            env_id = t.environment.environment
            info = listed[t.envmanager].get(env_id)
            if info is None:
                raise SpecError(f"tasks[{i}].environment.environment: unknown environment {env_id!r} at {t.envmanager}")
            if not info.available:
                why = info.unavailable_reason or "not available"
                raise SpecError(f"tasks[{i}].environment.environment: {env_id} cannot run here: {why}")
            problem = _scorer_problem(t.environment.reward, scorers)
            if problem:
                raise SpecError(f"tasks[{i}].reward: {problem}")

    async def _set_affinity(self) -> None:
        rules = [t.affinity for t in self.tasks if t.affinity is not None]
        if not rules:
            return
        ch = channel(self.state["services"]["llmproxy"]["address"], token=self.token, default_timeout=30.0)
        try:
            stub = llmproxy_pb2_grpc.LLMProxyStub(ch)
            await stub.SetAffinity(llmproxy_pb2.SetAffinityRequest(rules=rules, merge=True))
        except aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.INVALID_ARGUMENT:
                raise SpecError(f"tasks[*].affinity: the LLMProxy refused the rules: {exc.details()}") from None
            raise
        finally:
            await ch.close()
        self.say("llmproxy         affinity " + ", ".join(f"{r.task} -> {_rule_text(r)}" for r in rules))

    async def watch(self, stop: asyncio.Event) -> None:
        """Follow the job's events until it ends (reconnecting across trainer restarts)."""
        self.progress = Progress(self.spec.max_steps, self.log, self.opts.quiet)
        seen = 0
        while not stop.is_set():
            ch, stub = self._trainer()
            try:
                call = stub.WatchJob(T.WatchTrainerJobRequest(from_step=seen + 1), timeout=None)
                async for ev in call:
                    kind = ev.WhichOneof("event")
                    if kind == "job":
                        self.job = ev.job
                        if ev.job.state == T.TRAINER_JOB_STATE_FAILED:
                            self.say(f"job failed: {ev.job.error}")
                    elif kind == "step_finished" and ev.step_finished.step > seen:
                        seen = ev.step_finished.step
                        self.progress.step(ev.step_finished)
                if self.job is not None and self.job.state in (
                    T.TRAINER_JOB_STATE_COMPLETED,
                    T.TRAINER_JOB_STATE_FAILED,
                    T.TRAINER_JOB_STATE_STOPPED,
                ):
                    return
            except aio.AioRpcError as exc:
                if exc.code() not in (
                    grpc.StatusCode.UNAVAILABLE,
                    grpc.StatusCode.NOT_FOUND,
                    grpc.StatusCode.CANCELLED,
                ):
                    raise
                await asyncio.sleep(1.0)
            finally:
                await ch.close(grace=None)

    def _wanted(self, name: str) -> bool:
        if not self.opts.restart_dead:
            return False
        return self.opts.restart is None or base_name(name) in self.opts.restart or name in self.opts.restart

    def _event(self, ev: Event) -> None:
        self.events.append(ev)
        with (self.opts.out_dir / "events.jsonl").open("a") as fh:
            fh.write(json.dumps(ev.to_dict(), sort_keys=True) + "\n")
        extra = f" in {ev.seconds:.1f}s" if ev.seconds else ""
        what = {"restarted": f"restarted{extra}", "restart-failed": f"did not come back: {ev.detail[:300]}",
                "dead": f"not restarting it ({ev.detail})", "loops-restored": f"{ev.detail}{extra}"}[ev.kind]
        self.say(f"supervisor       {ev.process} ({ev.cause}): {what}")
        if ev.kind == "restarted":
            self.restarts[ev.process] = self.restarts.get(ev.process, 0) + 1
        elif ev.kind == "dead":
            self.dead.add(ev.process)

    async def supervise(self, stop: asyncio.Event) -> None:
        """Restart every process that dies (redis and the Mooncake master included: the job goes on, the
        trainer resumes, an actor rejoins) and keep the job's loop group on the envmanager."""
        sup = Supervisor(self.state_dir, wanted=self._wanted)
        keepers = [
            LoopKeeper(self.state_dir, self.token, req, name=name, on_event=self._event)
            for name, req in self.loops_requests
        ]
        loop = asyncio.get_running_loop()
        keeping = [asyncio.ensure_future(k.run(stop)) for k in keepers]
        try:
            while not stop.is_set():
                await asyncio.sleep(1.0)
                if stop.is_set():
                    break
                await asyncio.to_thread(sup.check, lambda ev: loop.call_soon_threadsafe(self._event, ev))
                if self.tasks and sup.dead & set(self.instance_pools):
                    await self._stop_if_stranded(sup.dead, stop)
        finally:
            for task in keeping:
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task

    async def _stop_if_stranded(self, dead: set[str], stop: asyncio.Event) -> None:
        """Stop the run, with one line saying why, when a task without fallback has lost every actor of its
        pool for good: its turns can only fail UNAVAILABLE and its share of every batch would never fill (the
        trainer would wait out batch_timeout). The proxy must agree: one probe turn of the task is refused."""
        for i, t, gone in stranded_tasks(self.tasks, self.instance_pools, dead):
            refused = await self._probe_turn(t.name)
            if refused:
                self.stop_reason = (
                    f"task {t.name} cannot be generated any more: {gone}, and tasks[{i}].affinity has no "
                    f"allow_fallback (the LLMProxy refuses its turns: {refused})"
                )
                self.say(f"rollart run: {self.stop_reason}")
                stop.set()
                return

    async def _probe_turn(self, task: str) -> str:
        """One 1-token turn of ``task`` through the LLMProxy: "" when an actor took it, else the proxy's
        refusal (``CODE: details``). Inconclusive answers (a deadline while the proxy is suspended) count as
        taken: the next supervisor pass asks again."""
        ch = channel(self.state["services"]["llmproxy"]["address"], token=self.token, default_timeout=30.0)
        req = llmproxy_pb2.TrajectoryGenerateRequest(
            trajectory_id=f"rollart-run-probe-{task}-{time.time_ns()}",
            task=task,
            input=common_pb2.ModelInput(token_ids=[0]),
            sampling=common_pb2.SamplingParams(max_tokens=1),
        )
        try:
            async for _chunk in llmproxy_pb2_grpc.LLMProxyStub(ch).Generate(req, timeout=20.0):
                return ""
            return ""
        except aio.AioRpcError as exc:
            # The proxy's own refusal (a retryable UNAVAILABLE carries its trailer; an unreachable proxy's does
            # not: it may be restarting, which strands nobody).
            said = dict(exc.trailing_metadata() or ()).get("rollart-retryable") == "true"
            code = exc.code()
            if code == grpc.StatusCode.FAILED_PRECONDITION or (code == grpc.StatusCode.UNAVAILABLE and said):
                first = next(iter((exc.details() or "").splitlines()), "")  # one line, whatever the proxy said
                return f"{code.name}: {first[:300]}"
            return ""
        finally:
            await ch.close(grace=None)

    async def stop_job(self) -> None:
        groups: dict[str, list[str]] = {}
        for name, req in self.loops_requests or [("envmanager", envmanager_pb2.StartLoopsRequest())]:
            groups.setdefault(name, []).append(req.group_id or f"{self.spec.job_id}-loops")
        for name, group_ids in groups.items():
            env_addr = self.state.get("services", {}).get(name, {}).get("address")
            if not env_addr:
                continue
            ech = channel(env_addr, token=self.token, default_timeout=15.0)
            with contextlib.suppress(aio.AioRpcError):
                await envmanager_pb2_grpc.EnvManagerStub(ech).StopLoops(
                    envmanager_pb2.StopLoopsRequest(group_ids=group_ids, mode=envmanager_pb2.LOOP_STOP_MODE_ABORT),
                    timeout=15.0,
                )
            await ech.close()
        if "trainer" in self.state.get("services", {}):
            ch, stub = self._trainer()
            with contextlib.suppress(aio.AioRpcError):
                job = await stub.GetJob(T.GetTrainerJobRequest(), timeout=10)
                if job.state not in (T.TRAINER_JOB_STATE_COMPLETED, T.TRAINER_JOB_STATE_FAILED):
                    job = await stub.StopJob(
                        T.StopJobRequest(job_id=self.spec.job_id, mode=T.STOP_MODE_NOW, checkpoint=False), timeout=60
                    )
                self.job = job
            await ch.close()
        await self._final_state()

    @staticmethod
    async def _lease_census(stub: ledger_pb2_grpc.LedgerStub) -> dict[str, Any]:
        """Every lease the ledger still lists, by state, and whether a slot or a trajectory was settled twice."""
        by_state: dict[str, int] = {}
        slots: list[tuple[str, int]] = []
        trajectories: list[str] = []
        token = ""
        while True:
            page = await stub.ListLeases(ledger_pb2.ListLeasesRequest(page_size=1000, page_token=token))
            for le in page.leases:
                name = ledger_pb2.LeaseState.Name(le.state).removeprefix("LEASE_STATE_").lower()
                by_state[name] = by_state.get(name, 0) + 1
                if le.state == ledger_pb2.LEASE_STATE_SETTLED:
                    slots.append((le.group_id, le.sample_index))
                    trajectories.append(le.trajectory_id)
            token = page.next_page_token
            if not token:
                break
        return {
            "leases_listed": by_state,
            "settled_slots": len(slots),
            "settled_distinct_slots": len(set(slots)),
            "settled_distinct_trajectories": len(set(trajectories)),
        }

    async def _quiet_census(self, stub: ledger_pb2_grpc.LedgerStub, st: ledger_pb2.LedgerStatus) -> dict[str, Any]:
        """The lease counters and a census taken while they stood still (a few tries; the last one otherwise)."""
        census: dict[str, Any] = {}
        for _ in range(10):
            census = await self._lease_census(stub)
            after = await stub.GetStatus(ledger_pb2.LedgerStatusRequest(versions_limit=1))
            if after.leases == st.leases:
                break
            st = after
            await asyncio.sleep(0.5)
        counts = MessageToDict(st.leases, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)
        return {"lease_counts": counts, **census}

    async def _final_state(self) -> None:
        """What the services say at the end (summary.json "final"): the actors' versions and hashes next to the
        ledger's and the trainer's, settlement counters, the envmanager's counters."""
        svc = self.state.get("services", {})
        final: dict[str, Any] = {}
        with contextlib.suppress(aio.AioRpcError, KeyError):
            ch = channel(svc["ledger"]["address"], token=self.token, default_timeout=10.0)
            try:
                stub = ledger_pb2_grpc.LedgerStub(ch)
                st = await stub.GetStatus(ledger_pb2.LedgerStatusRequest(include_inactive_actors=True))
                vers = await stub.ListVersions(ledger_pb2.ListVersionsRequest(from_version=0, limit=10_000))
                final["ledger"] = {
                    "latest_version": st.latest_version,
                    "current_version": st.current_version,
                    "versions": {str(v.version): v.hash.hex() for v in vers.versions},
                    "admitted": st.settlement.admitted,
                    "rejected": dict(st.settlement.rejected),
                    "buffer_reserved": st.buffer.reserved_samples,
                    "accounting": MessageToDict(st.accounting, preserving_proto_field_name=True),
                    "duplicates": st.settlement.duplicates,
                    # The ledger's lease counters next to its leases listed one by one (fault checks), from one
                    # quiet moment: leases still move (aborted loops release theirs after StopLoops answered), so
                    # the census counts only when the counters did not change while it listed.
                    **await self._quiet_census(stub, st),
                }
                final["actors"] = {
                    a.actor_id: {
                        "liveness": ledger_pb2.ActorLiveness.Name(a.liveness).removeprefix("ACTOR_LIVENESS_"),
                        "active_version": a.weights.active_version,
                        "active_hash": a.weights.active_hash.hex(),
                        "settled_tokens": a.settled_tokens,
                    }
                    for a in st.actors
                }
            finally:
                await ch.close()
        with contextlib.suppress(aio.AioRpcError, KeyError):
            ch, trainer = self._trainer()
            try:
                pub = await trainer.ListPublishedVersions(T.ListPublishedVersionsRequest(), timeout=10)
                ok = [p for p in pub.versions if p.state == T.PUBLISH_STATE_PUBLISHED]
                final["trainer"] = {
                    "published": {str(p.version.version): p.version.hash.hex() for p in ok},
                    "failed_publications": len(pub.versions) - len(ok),
                }
            finally:
                await ch.close()
        with contextlib.suppress(aio.AioRpcError, KeyError):
            ch = channel(svc["envmanager"]["address"], token=self.token, default_timeout=10.0)
            try:
                st = await envmanager_pb2_grpc.EnvManagerStub(ch).GetStatus(envmanager_pb2.EnvManagerStatusRequest())
                c = st.counters
                final["envmanager"] = {
                    "trajectories": c.trajectories,
                    "admitted": c.admitted,
                    "rejected": c.rejected,
                    "cancelled": c.cancelled,
                    "infra_failures": c.infra_failures,
                    "timeouts": c.timeouts,
                    "turns": c.turns,
                    "rewards_pending": st.rewards_pending,
                    "failures_by_cause": dict(st.failures_by_cause),
                }
            finally:
                await ch.close()
        with contextlib.suppress(aio.AioRpcError, KeyError):
            # Each task's routing as the proxy saw it: its profile and the turns routed outside its affinity.
            ch = channel(svc["llmproxy"]["address"], token=self.token, default_timeout=10.0)
            try:
                table = await llmproxy_pb2_grpc.LLMProxyStub(ch).GetAffinity(llmproxy_pb2.GetAffinityRequest())
                final["llmproxy"] = {
                    "rules": {r.task: _rule_text(r) for r in table.rules},
                    "profiles": {p.task: MessageToDict(p, preserving_proto_field_name=True) for p in table.profiles},
                }
            finally:
                await ch.close()
        self.final = final

    async def main(self) -> int:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()

        def interrupt(reason: str) -> None:
            self.stop_reason = self.stop_reason or reason
            stop.set()

        for sig, why in ((signal.SIGINT, "interrupted"), (signal.SIGTERM, "terminated")):
            loop.add_signal_handler(sig, interrupt, why)
        await self.start()
        watch = asyncio.ensure_future(self.watch(stop))
        sup = asyncio.ensure_future(self.supervise(stop))
        stopper = asyncio.ensure_future(stop.wait())
        timeout = self.opts.timeout or None
        done, _ = await asyncio.wait({watch, stopper}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        if not done:
            self.stop_reason = f"timeout after {self.opts.timeout:.0f}s"
        stop.set()
        for t in (watch, sup, stopper):
            if not t.done():
                t.cancel()
        for t in (watch, sup, stopper):
            with contextlib.suppress(BaseException):
                await t
        if watch.done() and not watch.cancelled() and watch.exception() is not None:
            self.say(f"watching the job failed: {watch.exception()}")
        if hasattr(self, "progress"):
            self.progress.close()
        await self.stop_job()
        return 0

    # -- the end ---------------------------------------------------------------------------------------

    def finish(self) -> int:
        out = self.opts.out_dir
        records = sorted({r["step"]: r for r in read_records(out / "metrics.jsonl")}.values(), key=lambda r: r["step"])
        rewards = [float(r.get("reward_mean", 0.0)) for r in records]
        first, last, ratio = improvement(rewards)
        state = T.TrainerJobState.Name(self.job.state).removeprefix("TRAINER_JOB_STATE_") if self.job else "UNKNOWN"
        what = " + ".join(t.name for t in self.tasks) if self.tasks else self.env_spec.environment
        title = f"{self.spec.job_id}: {what} ({T.StepMode.Name(self.spec.mode or 3)[10:].lower()})"
        plotted = bool(records) and plot_rewards(records, out / "reward.png", title)
        timeline = bool(records) and plot_timeline(records, out / "timeline.png", title + ": where the time goes")
        acc = records[-1].get("accounting_total", {}) if records else {}
        target = self.opts.score_target
        per_task: dict[str, dict[str, Any]] = {}
        for task, points in task_rewards(records).items():  # multi-task jobs: each task's own curve
            t_first, t_last, t_ratio = improvement([r for _, r in points])
            per_task[task] = {
                "steps": len(points),
                "reward_first10": t_first,
                "reward_last10": t_last,
                "improvement": t_ratio if math.isfinite(t_ratio) else None,
            }
        summary = {
            "job_id": self.spec.job_id,
            "state": state,
            "error": self.job.error if self.job else "",
            "stop_reason": self.stop_reason,
            "steps": len(records),
            "reward_first10": first,
            "reward_last10": last,
            "improvement": ratio if math.isfinite(ratio) else None,
            "tasks": per_task,
            "actor_versions": records[-1].get("actor_versions", {}) if records else {},
            "policy_version": self.job.policy_version if self.job else None,
            "restarts": self.restarts,
            "dead": sorted(self.dead),
            # Every restart with its cause and duration, loop groups restored (also in events.jsonl).
            "events": [ev.to_dict() for ev in self.events],
            "metrics": str(out / "metrics.jsonl"),
            "reward_png": str(out / "reward.png") if plotted else None,
            "timeline_png": str(out / "timeline.png") if timeline else None,
            # What became of every generated token (the ledger's accounting at the last step's end).
            "accounting": acc,
            "wasted_token_fraction": acc.get("wasted_token_fraction", 0.0) if acc else None,
            "score_target": target,
            "time_to_score_seconds": time_to_score(records, target) if target is not None else None,
            "model": self.spec.model,
            "final": self.final,
            # Process groups of the cluster (every service is a session leader): all gone after the run.
            "process_groups": self._process_groups(),
        }
        (out / "summary.json").write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
        print(
            f"\n{state}{' (' + self.stop_reason + ')' if self.stop_reason else ''}: {len(records)} steps; "
            f"mean reward first 10 steps {first:.3f}, last 10 steps {last:.3f} (x{ratio:.2f})"
            f"{self._task_lines(per_task)}\n"
            f"metrics {out / 'metrics.jsonl'}" + (f", curve {out / 'reward.png'}" if plotted else ""),
            file=self.log,
            flush=True,
        )
        if self.stop_reason in STOP_CODES:  # Ctrl-C / SIGTERM: the shell's convention (128 + signal)
            return STOP_CODES[self.stop_reason]
        if state != "COMPLETED":  # failed, or stopped by run.timeout before its last step
            return 1
        if self.opts.min_improvement and not ratio >= self.opts.min_improvement:
            print(f"the reward did not improve {self.opts.min_improvement}x", file=self.log)
            return 1
        if self.opts.min_improvement and self.tasks:  # every task must improve, not only the mix
            behind = [t.name for t in self.tasks if not _ratio_of(per_task.get(t.name)) >= self.opts.min_improvement]
            if behind:
                print(f"the reward of {', '.join(behind)} did not improve {self.opts.min_improvement}x", file=self.log)
                return 1
        return 0

    def _task_lines(self, per_task: dict[str, dict[str, Any]]) -> str:
        return "".join(
            f"\n  {task}: first 10 steps {d['reward_first10']:.3f}, last 10 steps {d['reward_last10']:.3f}"
            f" (x{_ratio_of(d):.2f})"
            for task, d in sorted(per_task.items())
        )

    def _process_groups(self) -> dict[str, int]:
        st = local.read_state(self.state_dir) if self.state_dir.exists() else {}
        out = {name: info["pid"] for name, info in st.get("services", {}).items()}
        for extra in ("redis", "mooncake"):
            if st.get(extra):
                out[extra] = st[extra]["pid"]
        return out

    def teardown(self) -> None:
        if self.state_dir.exists() and local.read_state(self.state_dir):
            ok = local.down(self.state_dir, log=lambda line: None)
            print(
                "cluster          stopped" if ok else "cluster          SOME PROCESSES ARE STILL RUNNING", file=self.log
            )


def _ratio_of(d: dict[str, Any] | None) -> float:
    """A task's improvement from its summary entry (inf when it started at 0 and rose; 0 when it has none)."""
    if not d:
        return 0.0
    if d.get("improvement") is not None:
        return float(d["improvement"])
    return math.inf if d.get("reward_last10", 0.0) > 0 else 0.0


def run(opts: RunOptions, log: TextIO = sys.stderr) -> int:
    data = apply_overrides(load_job_file(opts.job_file), opts.overrides)
    run_section = _section(data, "run")
    cluster = _section(data, "cluster")
    opts.actor_pools = cluster_actor_pools(cluster)
    opts.actors = sum(p.count for p in opts.actor_pools) or int(cluster.get("actors", opts.actors))
    opts.loops = int(data.get("loops", opts.loops))
    if not opts.timeout and run_section.get("timeout"):
        opts.timeout = float(str(run_section["timeout"]).rstrip("s"))
    if run_section.get("restart") is not None:
        opts.restart = [str(x) for x in run_section["restart"]]
    if not opts.min_improvement and run_section.get("min_improvement"):
        opts.min_improvement = float(run_section["min_improvement"])
    if opts.score_target is None and run_section.get("score_target") is not None:
        opts.score_target = float(run_section["score_target"])
    for name, extra in (cluster.get("env") or {}).items():
        opts.service_env.setdefault(name, {}).update(extra or {})
    runner = Runner(opts, data, log)
    code = 1

    def terminated(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt  # SIGTERM outside the job's event loop: stop like Ctrl-C, tearing down

    previous = signal.signal(signal.SIGTERM, terminated)
    try:
        runner.setup()
        code = asyncio.run(runner.main())  # its own SIGINT/SIGTERM handlers stop the job cleanly
        signal.signal(signal.SIGTERM, terminated)  # asyncio put back the default on the way out
        code = runner.finish() or code
    except (ProcessError, SpecError) as exc:
        print(f"rollart run: {exc}", file=log)
        code = 1
    except KeyboardInterrupt:
        print("rollart run: interrupted", file=log)
        code = 130
    finally:
        # A second Ctrl-C must not leave half the cluster running: the teardown is not interruptible.
        old_int = signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        try:
            runner.teardown()
        finally:
            signal.signal(signal.SIGINT, old_int)
            signal.signal(signal.SIGTERM, previous)
    return code


def cmd_run(args: argparse.Namespace) -> int:
    data_out = args.out
    if data_out is None:
        try:
            data = apply_overrides(load_job_file(args.job_file), args.set or [])
        except SpecError as exc:
            print(f"rollart run: {exc}", file=sys.stderr)
            return 2
        default = _section(data, "run").get("out_dir") or f"runs/{Path(args.job_file).stem}"
        data_out = Path(default)
    opts = RunOptions(
        job_file=Path(args.job_file),
        out_dir=Path(data_out).resolve(),
        timeout=args.timeout or 0.0,
        fresh=not args.resume,
        min_improvement=args.min_improvement or 0.0,
        quiet=args.quiet,
        overrides=list(args.set or []),
    )
    if args.actors:
        opts.actors = args.actors
    try:
        return run(opts)
    except SpecError as exc:
        print(f"rollart run: {exc}", file=sys.stderr)
        return 2


def add_subparsers(sub: Any) -> None:
    p = sub.add_parser("run", help="train a job on a local cluster (progress, metrics, reward curve)")
    p.add_argument("job_file", help="job file, e.g. examples/frozenlake.yaml")
    p.add_argument("--out", type=Path, help="output folder (default: run.out_dir, else runs/<file name>)")
    p.add_argument("--timeout", type=float, help="stop after this many seconds (default: run.timeout)")
    p.add_argument("--actors", type=int, help="actors to start (default: cluster.actors, else 2)")
    p.add_argument("--resume", action="store_true", help="keep the previous run's cluster state and continue")
    p.add_argument(
        "--min-improvement", type=float, help="exit 1 unless reward(last 10 steps) >= this x reward(first 10)"
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument(
        "--set",
        action="append",
        metavar="KEY=VALUE",
        help="override a job-file field (repeatable; dotted path, YAML value), e.g. --set job.backend=megatron",
    )
    p.set_defaults(func=cmd_run)
