"""``rollart run JOB.yaml``: one job on a private local cluster, from nothing to a reward curve (docs/trainer.md,
"`rollart run`"). The runner prepares the model, starts the cluster, the job and its loops, supervises (restarts
what dies), and at the end stops the loops and the job, writes ``metrics.jsonl``, ``reward.png``,
``timeline.png``, ``summary.json`` and stops every process it started, Ctrl-C and SIGTERM included.
torch-free: the model is built by a child process.
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
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import grpc
from google.protobuf import json_format
from grpc import aio

from rollart.local import cluster as local
from rollart.local.processes import ProcessError
from rollart.local.regions import RegionError, Regions, link_counters, parse_regions, route_from_state
from rollart.local.supervisor import Event, Supervisor, base_name
from rollart.runtime import ids
from rollart.runtime.client import channel
from rollart.v1 import (
    common_pb2,
    envmanager_pb2,
    envmanager_pb2_grpc,
    llmproxy_pb2,
    llmproxy_pb2_grpc,
    trainer_pb2,
    trainer_pb2_grpc,
)

from . import task_checks
from .evaluation import RunValidation
from .final_state import final_state
from .fleet import JOB_SERVICES, Fleet
from .joined import JoinedJobs
from .loops import LoopKeeper
from .metrics import read_records, task_rewards, time_to_score
from .plots import plot_rewards
from .pools import actor_instance_pools, actor_pools, instance_number, stranded_tasks
from .prepare import prepare_model
from .progress import Progress
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
from .summary import improvement, ratio_of
from .task_checks import rule_text
from .task_checks import scorer_problem as _scorer_problem
from .timeline import plot_timeline
from .tracking import RunTracking

# Imported from here by tests, benchmarks and the CLI.
__all__ = [
    "Progress",
    "RunOptions",
    "Runner",
    "_scorer_problem",
    "actor_instance_pools",
    "actor_pools",
    "add_subparsers",
    "cmd_run",
    "improvement",
    "plot_rewards",
    "prepare_model",
    "run",
    "stranded_tasks",
]

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
    # cluster.regions: services placed in regions joined by emulated links (None: one loopback region).
    regions: Regions | None = None
    # --fleet RUN_DIR: a LoRA job on the actors and LLMProxy of that running cluster (fleet.py).
    fleet: Path | None = None
    # --join JOB.yaml (repeatable): LoRA jobs on this run's fleet, each as `rollart run JOB --fleet OUT` (joined.py).
    join: list[Path] = field(default_factory=list)


def _section(data: dict[str, Any], name: str) -> dict[str, Any]:
    value = data.get(name) or {}
    if not isinstance(value, dict):
        raise SpecError(f"{name}: expected a mapping")
    return value


def actor_lora_env(lora: T.LoraConfig, base_hash: str) -> dict[str, str]:
    """The actors' environment for a LoRA job: their ``lora`` settings (ActorConfig.lora) with the base's h(v0);
    no ``weight_hash``: version 0 is the trainer's initial adapter, which actors load from the checkpoint store."""
    settings = json_format.MessageToDict(lora, preserving_proto_field_name=True)
    settings["base_hash"] = base_hash
    return {"ROLLART_LORA": json.dumps(settings, sort_keys=True), "ROLLART_WEIGHT_HASH": ""}


class Runner:
    def __init__(self, opts: RunOptions, data: dict[str, Any], log: TextIO = sys.stderr) -> None:
        self.opts = opts
        self.fleet: Fleet | None = None  # --fleet: the running cluster whose actors this job shares
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
        # Validation on held-out prompts (the eval section, checked here: before anything starts).
        self.validation = RunValidation(data, self.spec, self.env_spec, self.tasks, opts.out_dir / "metrics.jsonl",
                                        say=self.say)
        # TensorBoard / W&B / MLflow, samples, Prometheus targets: the tracking section checked before anything starts.
        self.tracking = RunTracking(data, opts.out_dir, self.spec.job_id, fresh=opts.fresh, say=self.say)
        self.joined = JoinedJobs(opts.join, opts.out_dir, self.say)

    def say(self, text: str) -> None:
        if hasattr(self, "progress"):
            self.progress.note(text)
        else:
            print(text, file=self.log, flush=True)

    # -- set-up ---------------------------------------------------------------------------------------

    def setup(self) -> None:
        out = self.opts.out_dir
        if self.opts.fleet is not None:  # checked before anything is built or started
            if not self.spec.HasField("lora"):
                raise SpecError("--fleet: only LoRA jobs (model.lora) share a fleet's actors")
            self.fleet = Fleet(self.opts.fleet)
        self.joined.check(self.spec.job_id, self.spec.HasField("lora"), self.opts.fleet is not None)
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
        if self.fleet is not None and self.fleet.model:  # the base the fleet's actors serve, not one of its own
            if spec.model not in ("", "tiny") and Path(spec.model).resolve() != Path(self.fleet.model).resolve():
                raise SpecError(f"job.model: {spec.model}, but the fleet's actors serve {self.fleet.model}")
            spec.model = self.fleet.model
        if spec.model in ("", "tiny"):
            recipe = {k: v for k, v in _section(self.data, "model").items() if k != "lora"}  # lora: not a recipe
            spec.model = str(prepare_model(recipe, out, self.log))
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
        if spec.HasField("lora"):  # a LoRA job: every actor serves the base with the job's adapter versions
            overrides.setdefault("actor", {}).update(actor_lora_env(spec.lora, env["ROLLART_WEIGHT_HASH"]))
        for name, extra in self.opts.service_env.items():
            overrides.setdefault(name, {}).update({k: str(v) for k, v in extra.items()})
        pools = [(p.count, p.env) for p in self.opts.actor_pools]
        for name, extra in local.pool_instances("actor", pools).items():  # each actor its pool, kind and CPUs
            overrides.setdefault(name, {}).update(extra)
        replicas = {"actor": self.opts.actors}
        only = None
        if self.fleet is not None:  # no actors, no LLMProxy of its own: the fleet's, naming this job
            self.fleet.adopt_token(self.state_dir)
            only = JOB_SERVICES
            for name, extra in self.fleet.service_env(spec.job_id).items():
                overrides.setdefault(name, {}).update(extra)
        if self.tasks:
            # envmanager, envmanager-2, ...: as many instances as the tasks name
            replicas["envmanager"] = max(instance_number(t.envmanager) for t in self.tasks)
        self.say(f"cluster          starting in {self.state_dir} ({self.opts.actors} actors)")
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            self.state = local.up(
                self.state_dir,
                only=only,
                replicas=replicas,
                env_overrides=overrides,
                log=lambda line: self.say("  " + line),
                ready_timeout=120.0,
                regions=self.opts.regions,
            )
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        self.token = Path(self.state["token_file"]).read_text().strip()
        svc = self.state["services"]
        for needed in ("ledger", "relay", "trainer", "envmanager", *(("llmproxy", "actor") if not self.fleet else ())):
            if needed not in svc:
                raise ProcessError(f"{needed} did not start (is it installed? run `make setup`)")
        spec.endpoints.ledger = spec.endpoints.ledger or svc["ledger"]["address"]
        proxy = self.fleet.llmproxy if self.fleet else svc["llmproxy"]["address"]
        spec.endpoints.llmproxy = spec.endpoints.llmproxy or proxy
        if not spec.publish.relay_endpoints:
            spec.publish.relay_endpoints.append(svc["relay"]["address"])
        if self.opts.regions is not None:  # the trainer reaches peers in other regions through its links
            spec.endpoints.ledger = route_from_state(self.state, "trainer", spec.endpoints.ledger)
            spec.endpoints.llmproxy = route_from_state(self.state, "trainer", spec.endpoints.llmproxy)
            routed = [route_from_state(self.state, "trainer", r) for r in spec.publish.relay_endpoints]
            del spec.publish.relay_endpoints[:]
            spec.publish.relay_endpoints.extend(routed)
        if not spec.publish.mooncake_master and self.state.get("mooncake"):
            spec.publish.mooncake_master = self.state["mooncake"]["address"]
        spec.metrics_path = str((out / "metrics.jsonl").resolve())
        self.tracking.start(self.state_dir, self.state, self.token, spec.batch_size)
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
        if self.fleet is not None:
            key = local.job_key(self.state_dir).read_bytes().strip()
            await self.fleet.attach(self.spec, key, self.state)
            self.say(f"fleet            job attached to {', '.join(self.fleet.attached)}; loading its adapter")
            await self.fleet.wait_loaded(self.spec.job_id)
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
        await task_checks.check_tasks(self.tasks, self.state["services"], self.token)

    async def _set_affinity(self) -> None:
        rules = await task_checks.set_affinity(self.tasks, self.state["services"], self.token)
        if rules:
            self.say("llmproxy         affinity " + ", ".join(f"{r.task} -> {rule_text(r)}" for r in rules))

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
                    await self.tracking.on_event(ev)  # the one call site of every tracking backend
                    if kind == "job":
                        self.job = ev.job
                        if ev.job.state == T.TRAINER_JOB_STATE_FAILED:
                            self.say(f"job failed: {ev.job.error}")
                    elif kind == "step_finished" and ev.step_finished.step > seen:
                        seen = ev.step_finished.step
                        self.progress.validation = self.validation.on_step(ev.step_finished)
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
            trajectory_id=ids.new_id(f"rollart-run-probe-{task}"),
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
        if self.fleet is not None:
            await self.fleet.detach(self.spec.job_id)
        self.final = await final_state(self.state.get("services", {}), self.token)

    async def main(self) -> int:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()

        def interrupt(reason: str) -> None:
            self.stop_reason = self.stop_reason or reason
            stop.set()
            self.joined.interrupt()

        for sig, why in ((signal.SIGINT, "interrupted"), (signal.SIGTERM, "terminated")):
            loop.add_signal_handler(sig, interrupt, why)
        await self.start()
        self.joined.start()
        self.validation.start(self.state_dir, self.token)
        watch = asyncio.ensure_future(self.watch(stop))
        sup = asyncio.ensure_future(self.supervise(stop))
        stopper = asyncio.ensure_future(stop.wait())
        timeout = self.opts.timeout or None
        done, _ = await asyncio.wait({watch, stopper}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        if not done:
            self.stop_reason = f"timeout after {self.opts.timeout:.0f}s"
        await self.validation.close(drain=watch in done and not stop.is_set())  # the last step's evaluation
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
        if self.stop_reason:  # interrupted or timed out: the joined jobs stop too
            self.joined.interrupt()
            stop.set()
        else:
            stop.clear()  # a Ctrl-C from here on stops the joined jobs (the handler sets it again)
        await self.joined.wait(stop)  # the fleet stays up until they end
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
        self.tracking.close(ok=state == "COMPLETED")
        plotted = bool(records) and plot_rewards(records, out / "reward.png", title, self.validation.rows())
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
            # Per task: the validation score's time and step to its eval score_target, last and best scores.
            "validation": self.validation.summary(records),
            "model": self.spec.model,
            "final": self.final,
            # Process groups of the cluster (every service is a session leader): all gone after the run.
            "process_groups": self._process_groups(),
            # cluster.regions: bytes through each link direction and forwarder (None without regions).
            "links": link_counters(self.state_dir),
            # --join: each joined job's file, output folder and exit code.
            "joined": self.joined.summary(),
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
        if self.joined.failed():
            print(f"joined job(s) failed: {', '.join(j.name for j in self.joined.failed())}", file=self.log)
            return 1
        if self.opts.min_improvement and not ratio >= self.opts.min_improvement:
            print(f"the reward did not improve {self.opts.min_improvement}x", file=self.log)
            return 1
        if self.opts.min_improvement and self.tasks:  # every task must improve, not only the mix
            behind = [t.name for t in self.tasks if not ratio_of(per_task.get(t.name)) >= self.opts.min_improvement]
            if behind:
                print(f"the reward of {', '.join(behind)} did not improve {self.opts.min_improvement}x", file=self.log)
                return 1
        return 0

    def _task_lines(self, per_task: dict[str, dict[str, Any]]) -> str:
        return "".join(
            f"\n  {task}: first 10 steps {d['reward_first10']:.3f}, last 10 steps {d['reward_last10']:.3f}"
            f" (x{ratio_of(d):.2f})"
            for task, d in sorted(per_task.items())
        )

    def _process_groups(self) -> dict[str, int]:
        st = local.read_state(self.state_dir) if self.state_dir.exists() else {}
        out = {name: info["pid"] for name, info in st.get("services", {}).items()}
        for extra in ("redis", "mooncake", "links"):
            if st.get(extra):
                out[extra] = st[extra]["pid"]
        return out

    def teardown(self) -> None:
        self.tracking.close(ok=False)  # no-op after finish(); an interrupted set-up still closes its runs
        self.tracking.stop()
        if self.state_dir.exists() and local.read_state(self.state_dir):
            ok = local.down(self.state_dir, log=lambda line: None)
            print(
                "cluster          stopped" if ok else "cluster          SOME PROCESSES ARE STILL RUNNING", file=self.log
            )


def run(opts: RunOptions, log: TextIO = sys.stderr) -> int:
    data = apply_overrides(load_job_file(opts.job_file), opts.overrides)
    run_section = _section(data, "run")
    cluster = _section(data, "cluster")
    opts.actor_pools = cluster_actor_pools(cluster)
    opts.actors = sum(p.count for p in opts.actor_pools) or int(cluster.get("actors", opts.actors))
    try:
        opts.regions = parse_regions(cluster, local.SERVICE_NAMES, opts.actors)
    except RegionError as exc:
        raise SpecError(str(exc)) from None
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
    # --actors N is cluster.actors: N (before, a job file's cluster.actors silently won over the flag).
    overrides = list(args.set or []) + ([f"cluster.actors={args.actors}"] if args.actors else [])
    data_out = args.out
    if data_out is None:
        try:
            data = apply_overrides(load_job_file(args.job_file), overrides)
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
        overrides=overrides,
        fleet=Path(args.fleet) if args.fleet else None,
        join=[Path(f) for f in args.join or []],
    )
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
    p.add_argument("--actors", type=int, help="actors to start: cluster.actors (default: the file's, else 2)")
    p.add_argument("--resume", action="store_true", help="keep the previous run's cluster state and continue")
    p.add_argument(
        "--min-improvement", type=float, help="exit 1 unless reward(last 10 steps) >= this x reward(first 10)"
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--fleet", help="a LoRA job on the actors of the cluster running in this run folder (docs/lora.md)")
    p.add_argument(
        "--join", action="append", metavar="JOB_FILE", help="also run this LoRA job on this run's actors (repeatable)"
    )
    p.add_argument(
        "--set",
        action="append",
        metavar="KEY=VALUE",
        help="override a job-file field (repeatable; dotted path, YAML value), e.g. --set job.backend=megatron",
    )
    p.set_defaults(func=cmd_run)
