"""Shared by the EnvManager benchmarks: real redis + rollart-ledger + rollart-envmanager processes, a fixed-latency
generation server (rollart.v1.LLMProxy's Generate/Tokenize/Abort, in the benchmark process), and a fixed-turns
environment that the envmanager hosts in-process (its per-turn latency comes from the loop's injection).

Generation server: every turn of every trajectory takes ``gen_s`` seconds and returns ``tokens`` tokens. With
``barrier=True`` it models batch-level rollout: the turn-k request of a trajectory is held until all ``batch``
trajectories of that step have sent their turn-k request (every environment waits for all before the next
generation), then all of them are served together.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path

import grpc
from grpc import aio

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "libs"))

from rollart.local.processes import ManagedProcess, start_redis  # noqa: E402
from rollart.v1 import common_pb2 as c  # noqa: E402
from rollart.v1 import llmproxy_pb2 as pp  # noqa: E402
from rollart.v1 import llmproxy_pb2_grpc as pg  # noqa: E402
from rollart_envmanager.envs.base import Env, StepResult  # noqa: E402

TOKEN = "bench-envmanager-token-0123456789"
MD = [("authorization", f"Bearer {TOKEN}")]
BIN = Path(sys.executable).parent


class FixedTurns(Env):
    """Reset shows a task; every step answers; the episode ends after ``turns`` steps with reward 1."""

    default_max_turns = 1000

    def __init__(self, turns: str = "4", **options) -> None:
        super().__init__(turns=turns, **options)
        self.turns = int(turns)

    def _reset(self, seed):
        self.metadata = {"seed": str(seed)}
        return f"Task {seed}: answer {self.turns} times."

    def _step(self, action):
        done = self.turn >= self.turns
        return StepResult(f"Observation after turn {self.turn}.", 1.0 if done else 0.0, done)


ENVIRONMENTS = [{"id": "bench:fixed-turns", "factory": "bench._support.envmanager_harness:FixedTurns",
                 "supported_backends": ["in_process"], "default_backend": "in_process", "default_max_turns": 1000,
                 "options": {"turns": "turns per episode"}}]


class FixedLatencyGenerator(pg.LLMProxyServicer):
    """A generation server with a fixed per-turn latency (and an optional batch barrier per task tag)."""

    def __init__(self, gen_s: float, tokens: int = 16) -> None:
        self.gen_s = gen_s
        self.tokens = tokens
        self.barrier: dict[str, int] = {}  # task tag -> batch size (barrier mode)
        self.waiting: dict[tuple[str, int], list[asyncio.Future]] = defaultdict(list)
        self.aborted: set[str] = set()
        self.requests = 0

    async def Tokenize(self, request, context):
        inp = request.request.input
        if inp.messages:
            text = "".join(f"<s>{m.role}\n{m.content}</s>\n" for m in inp.messages)
            text += "" if inp.no_generation_prompt else "<s>assistant\n"
        else:
            text = inp.text
        return c.TokenizeResponse(token_ids=list(text.encode()[:4096]) or [0], rendered=text)

    async def Abort(self, request, context):
        self.aborted.update(request.trajectory_ids)
        return pp.ProxyAbortResponse(aborted_trajectory_ids=list(request.trajectory_ids))

    async def Generate(self, request, context):
        self.requests += 1
        size = self.barrier.get(request.task)
        if size:
            key = (request.task, request.turn)
            fut = asyncio.get_running_loop().create_future()
            self.waiting[key].append(fut)
            if len(self.waiting[key]) >= size:  # the last environment of the batch is done: serve them all
                for f in self.waiting.pop(key):
                    if not f.done():
                        f.set_result(None)
            await fut
        yield pp.TrajectoryGenerateResponse(route=pp.RouteInfo(actor_id="fixed-0", actor_version=0))
        await asyncio.sleep(self.gen_s)
        finish = c.FINISH_REASON_ABORTED if request.trajectory_id in self.aborted else c.FINISH_REASON_STOP
        n = 0 if finish == c.FINISH_REASON_ABORTED else self.tokens
        yield pp.TrajectoryGenerateResponse(chunk=c.GenerationChunk(
            trajectory_id=request.trajectory_id, actor_id="fixed-0", token_ids=[65] * n, logprobs=[-0.5] * n,
            versions=[0] * n, text="A" * n, finish_reason=finish))


class GeneratorThread:
    """The generation server on its own event loop thread (the benchmark's client calls stay blocking)."""

    def __init__(self, gen: FixedLatencyGenerator) -> None:
        self.gen = gen
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.address = ""
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        self.ready.wait(10)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)

        async def main() -> None:
            self.server = aio.server(options=[("grpc.max_concurrent_streams", 10_000)])
            pg.add_LLMProxyServicer_to_server(self.gen, self.server)
            port = self.server.add_insecure_port("127.0.0.1:0")
            await self.server.start()
            self.address = f"127.0.0.1:{port}"
            self.ready.set()
            await self.server.wait_for_termination()

        self.loop.run_until_complete(main())

    def call(self, fn) -> None:
        self.loop.call_soon_threadsafe(fn)

    def stop(self) -> None:
        try:
            asyncio.run_coroutine_threadsafe(self.server.stop(0), self.loop).result(5)
        except Exception:  # noqa: BLE001 - a daemon thread: the process exits anyway
            pass


class Cluster:
    """redis + ledger + envmanager as processes (logs under ``tmp``)."""

    def __init__(self, tmp: Path, proxy_address: str, **envmanager_env: str) -> None:
        self.tmp = tmp
        self.procs: list[ManagedProcess] = []
        self.redis, url = start_redis(tmp / "redis")
        self.ledger_address = self._start("ledger", "rollart-ledger", ROLLART_REDIS_URL=url,
                                          ROLLART_REAP_INTERVAL_SECONDS="0.05", ROLLART_POLL_INTERVAL_SECONDS="0.02")
        # The real reward service: the fixed-turns environment's outcome is scored by its GAME scorer (inline).
        self.reward_address = self._start("reward", "rollart-reward", ROLLART_POOL__MAX_WORKERS="1",
                                          ROLLART_POOL__PRELOAD="[]")
        env = dict(ROLLART_LEDGER=self.ledger_address, ROLLART_LLMPROXY=proxy_address,
                   ROLLART_REWARD=self.reward_address, ROLLART_ENVIRONMENTS=json.dumps(ENVIRONMENTS),
                   ROLLART_LEASE_WAIT_SECONDS="2", ROLLART_MANAGER_ID="bench-em", ROLLART_LOG_LEVEL="WARNING")
        env.update(envmanager_env)
        self.envmanager_address = self._start("envmanager", "rollart-envmanager", **env)

    def _start(self, name: str, script: str, **extra: str) -> str:
        ready = self.tmp / f"{name}.ready"
        env = {k: v for k, v in os.environ.items() if not k.startswith("ROLLART_")}
        env.update(ROLLART_LISTEN="127.0.0.1:0", ROLLART_METRICS_LISTEN="127.0.0.1:0", ROLLART_JOB_TOKEN=TOKEN,
                   ROLLART_READY_FILE=str(ready), ROLLART_LOG_FORMAT="text",
                   PYTHONPATH=os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep), **extra)
        proc = ManagedProcess(name, [str(BIN / script)], log_path=self.tmp / f"{name}.log", env=env,
                              ready_file=ready).start()
        self.procs.append(proc)
        return proc.wait_ready(60)["address"]

    def stop(self) -> None:
        for p in reversed(self.procs):
            p.stop(timeout=10)
        self.redis.stop()


def machine() -> str:
    model = ""
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{os.cpu_count()} cores ({model}), load average {os.getloadavg()[0]:.1f} at start"


def wait_for(pred, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(0.02)
    raise TimeoutError(what)


class Driver:
    """Blocking client of the ledger and the envmanager for one benchmark run."""

    def __init__(self, cluster: Cluster) -> None:
        from rollart.v1 import envmanager_pb2_grpc, ledger_pb2_grpc

        self.channels = [grpc.insecure_channel(cluster.ledger_address),
                         grpc.insecure_channel(cluster.envmanager_address)]
        self.ledger = ledger_pb2_grpc.LedgerStub(self.channels[0])
        self.em = envmanager_pb2_grpc.EnvManagerStub(self.channels[1])
        self.step = 0

    def setup(self) -> None:
        from google.protobuf.duration_pb2 import Duration

        from rollart.v1 import ledger_pb2 as lp

        ttl = Duration(seconds=600)
        policy = lp.JobPolicy(job_id="bench-envmanager", alpha=1000, buffer_capacity=1_000_000, initial_lease_ttl=ttl,
                              min_lease_ttl=ttl, max_lease_ttl=ttl)
        self.ledger.SetJobPolicy(lp.SetJobPolicyRequest(policy=policy), metadata=MD, timeout=10)
        pv = c.PolicyVersion(version=0, base_version=-1, hash=b"\x01" * 32)
        self.ledger.RegisterVersion(lp.RegisterVersionRequest(version=pv), metadata=MD, timeout=10)

    def warm_up(self, env, count: int) -> None:
        """One unmeasured step (first-use costs: chat frame, connections, the reward scorer, imports)."""
        self.start_loops(env.task, env, count)
        self.rollout(env.task, 1, count, 0, 0)
        self.stop_loops(env.task)

    def start_loops(self, group_id: str, env, count: int) -> None:
        from rollart.v1 import envmanager_pb2 as em

        self.em.StartLoops(em.StartLoopsRequest(group_id=group_id, env=env, count=count, max_trajectories_per_loop=1,
                                                lease_tasks=[env.task]), metadata=MD, timeout=30)

        def acquiring():
            loops = self.em.ListLoops(em.ListLoopsRequest(group_id=group_id), metadata=MD, timeout=10).loops
            return len(loops) == count and all(lo.state == em.LOOP_STATE_ACQUIRING for lo in loops)

        wait_for(acquiring, 60, "loops waiting for leases")

    def rollout(self, task: str, prompts: int, group_size: int, redundancy: int, seed: int) -> float:
        """AddPrompts, then wait until every group is complete and scored in the ledger: the step's rollout time."""
        from google.protobuf.duration_pb2 import Duration

        from rollart.v1 import ledger_pb2 as lp

        ps = [lp.Prompt(prompt_id=f"{task}-p{i}", task=task, seed=seed * 1000 + i) for i in range(prompts)]
        t0 = time.monotonic()
        self.ledger.AddPrompts(lp.AddPromptsRequest(prompts=ps, group_size=group_size, redundancy=redundancy),
                               metadata=MD, timeout=30)
        self.step += 1
        batch = self.ledger.GetBatch(lp.GetBatchRequest(step=self.step, batch_size=prompts * group_size,
                                                        wait=Duration(seconds=600)), metadata=MD, timeout=660)
        elapsed = time.monotonic() - t0
        self.ledger.AckBatch(lp.AckBatchRequest(step=self.step, batch_id=batch.batch_id), metadata=MD, timeout=30)
        if batch.samples != prompts * group_size:
            raise RuntimeError(f"batch has {batch.samples} samples, expected {prompts * group_size}")
        return elapsed

    def stop_loops(self, group_id: str) -> dict:
        from rollart.v1 import envmanager_pb2 as em

        self.em.StopLoops(em.StopLoopsRequest(group_ids=[group_id], mode=em.LOOP_STOP_MODE_ABORT, wait=True),
                          metadata=MD, timeout=60)
        (group,) = [g for g in self.em.ListLoopGroups(em.ListLoopGroupsRequest(include_stopped=True), metadata=MD,
                                                      timeout=10).groups if g.group_id == group_id]
        return {"admitted": group.counters.admitted, "cancelled": group.counters.cancelled,
                "rejected": group.counters.rejected, "failures": group.counters.infra_failures + group.counters.timeouts}

    def close(self) -> None:
        for ch in self.channels:
            ch.close()
