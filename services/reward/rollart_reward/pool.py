"""The elastic worker pool: worker processes started on demand up to a maximum, stopped when idle.

Jobs wait in one FIFO queue. When a job arrives and no worker is idle, workers are started (one per waiting job,
up to ``max_workers``); a worker idle for ``idle_timeout`` is stopped (down to ``min_workers``, default 0: the
pool scales to zero between steps). Each job has a time budget: a worker that runs past it is SIGKILLed (its
sandboxes die with it) and the job ends as TIMEOUT. A worker that dies mid-job is replaced and the job retried
up to ``crash_retries`` times, then it ends as FAILED (``worker_crashed``, retryable).
"""

from __future__ import annotations

import asyncio
import base64
import collections
import json
import logging
import os
import signal
import subprocess
import sys
import time
from asyncio.streams import FlowControlMixin
from dataclasses import dataclass, field
from typing import Any

from rollart.runtime.telemetry import log_fields
from rollart.runtime.timeutil import duration
from rollart.runtime.timeutil import timestamp as _ts
from rollart.v1 import reward_pb2

from . import metrics
from .protocol import FrameError, encode, read_frame
from .scorers.base import FAILED, TIMEOUT, Verdict
from .worker import ENV_KEY

log = logging.getLogger(__name__)
WS = reward_pb2.RewardWorkerState
STATE_NAMES = {
    WS.REWARD_WORKER_STATE_STARTING: "starting",
    WS.REWARD_WORKER_STATE_IDLE: "idle",
    WS.REWARD_WORKER_STATE_BUSY: "busy",
    WS.REWARD_WORKER_STATE_STOPPING: "stopping",
}


# Consecutive worker start failures after which waiting jobs fail (pool_unavailable) instead of waiting.
MAX_START_FAILURES = 3


@dataclass
class PoolSettings:
    min_workers: int = 0
    max_workers: int = 2
    idle_timeout: float = 30.0
    start_timeout: float = 60.0
    crash_retries: int = 1
    # Extra time past a job's budget before its worker is killed (the scorer should report its own timeout first).
    kill_grace: float = 0.5
    # Settings the workers receive (sandbox limits, custom scorers, preload list), as JSON in their environment.
    worker_settings: dict[str, Any] = field(default_factory=dict)


@dataclass
class JobOutcome:
    verdict: Verdict
    worker_id: str = ""
    queue_seconds: float = 0.0
    scoring_seconds: float = 0.0
    attempts: int = 0


@dataclass
class Job:
    job_id: int
    trajectory_id: str
    kind: str
    name: str
    options: dict[str, str]
    trajectory: bytes
    budget: float
    # Absolute time.monotonic() after which nobody waits for the answer (the call's deadline), or None.
    deadline: float | None
    future: asyncio.Future
    enqueued_at: float = field(default_factory=time.monotonic)
    attempts: int = 0
    queue_seconds: float = 0.0


class WorkerProcess:
    """A worker child with asyncio pipes, started with subprocess.Popen instead of the loop's spawn.

    The service is a multithreaded gRPC process; uvloop's spawn forks it, and the child can crash before exec
    (seen as SIGSEGV at start). Popen without preexec_fn uses vfork + exec, which runs nothing in the child.
    """

    def __init__(self, popen: subprocess.Popen, stdin: asyncio.StreamWriter, stdout: asyncio.StreamReader) -> None:
        self._popen = popen
        self.stdin = stdin
        self.stdout = stdout

    @classmethod
    async def spawn(cls, argv: list[str], env: dict[str, str]) -> "WorkerProcess":
        popen = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, close_fds=True)
        loop = asyncio.get_running_loop()
        try:
            reader = asyncio.StreamReader(limit=1 << 20)
            await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), popen.stdout)
            transport, protocol = await loop.connect_write_pipe(FlowControlMixin, popen.stdin)
        except BaseException:
            popen.kill()
            popen.wait()
            raise
        return cls(popen, asyncio.StreamWriter(transport, protocol, None, loop), reader)

    @property
    def pid(self) -> int:
        return self._popen.pid

    @property
    def returncode(self) -> int | None:
        return self._popen.poll()

    def kill(self) -> None:
        self._popen.kill()

    async def wait(self) -> int:
        while (code := self._popen.poll()) is None:
            await asyncio.sleep(0.01)
        return code


@dataclass
class Worker:
    worker_id: str
    state: reward_pb2.RewardWorkerState = WS.REWARD_WORKER_STATE_STARTING
    proc: WorkerProcess | None = None
    started_at: float = field(default_factory=time.time)
    last_active: float = field(default_factory=time.time)
    idle_since: float = field(default_factory=time.monotonic)
    scored: int = 0
    job: Job | None = None
    task: asyncio.Task | None = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "no exit status"
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"exit code {code}"


class ElasticPool:
    def __init__(self, settings: PoolSettings) -> None:
        self.s = settings
        self.min_workers = settings.min_workers
        self.max_workers = settings.max_workers
        self.idle_timeout = settings.idle_timeout
        self.workers: dict[str, Worker] = {}
        self.queue: collections.deque[Job] = collections.deque()
        self._next_worker = 0
        self._next_job = 0
        self._reaper: asyncio.Task | None = None
        self._tasks: set[asyncio.Task] = set()
        self._closed = False
        self._start_failures = 0  # consecutive
        self.scored_total = 0
        self.scale_ups = 0
        self.scale_downs = 0
        self.crashes = 0
        self.kills = 0
        self.last_scale_at: float | None = None
        env = dict(os.environ)
        env[ENV_KEY] = json.dumps(settings.worker_settings)
        env.setdefault("HF_HUB_OFFLINE", "1")
        self._env = env

    # ------------------------------------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        self._reaper = asyncio.create_task(self._reap_loop(), name="reward-pool-reaper")
        self._ensure_min()
        self._gauges()

    async def close(self) -> None:
        self._closed = True
        if self._reaper is not None:
            self._reaper.cancel()
        while self.queue:
            job = self.queue.popleft()
            self._resolve(
                job, Verdict(status=FAILED, error="the reward service is stopping", cause="shutdown", retryable=True)
            )
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await asyncio.gather(
            *(self._stop_worker(w, count=False) for w in list(self.workers.values())), return_exceptions=True
        )

    def _spawn_task(self, coro, name: str) -> asyncio.Task:
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # ----------------------------------------------------------------------------------------------- interface

    def submit(
        self,
        *,
        trajectory_id: str,
        kind: str,
        name: str,
        options: dict[str, str],
        trajectory: bytes,
        budget: float,
        deadline: float | None,
    ) -> asyncio.Future:
        """Queue a job; the future resolves to a JobOutcome (never raises)."""
        fut: asyncio.Future = asyncio.get_running_loop().create_future()
        if self._closed:
            fut.set_result(
                JobOutcome(
                    Verdict(status=FAILED, error="the reward service is stopping", cause="shutdown", retryable=True)
                )
            )
            return fut
        self._next_job += 1
        job = Job(self._next_job, trajectory_id, kind, name, options, trajectory, budget, deadline, fut)
        self.queue.append(job)
        self._pump()
        return fut

    def configure(self, min_workers: int, max_workers: int, idle_timeout: float | None) -> None:
        self.min_workers, self.max_workers = min_workers, max_workers
        if idle_timeout is not None:
            self.idle_timeout = idle_timeout
        # Shrink now: idle workers above the maximum stop; busy ones retire when their job ends.
        excess = len(self._active()) - self.max_workers
        for w in sorted(self._idle(), key=lambda w: w.idle_since):
            if excess <= 0:
                break
            self._retire(w)
            excess -= 1
        self._ensure_min()
        self._pump()

    def status(self) -> reward_pb2.RewardPoolStatus:
        out = reward_pb2.RewardPoolStatus(
            backend=reward_pb2.REWARD_POOL_BACKEND_PROCESS,
            min_workers=self.min_workers,
            max_workers=self.max_workers,
            idle_timeout=duration(self.idle_timeout),
            queued=len(self.queue),
            in_flight=sum(1 for w in self.workers.values() if w.state == WS.REWARD_WORKER_STATE_BUSY),
            scored_total=self.scored_total,
            scale_ups=self.scale_ups,
            scale_downs=self.scale_downs,
        )
        if self.last_scale_at is not None:
            out.last_scale_at.CopyFrom(_ts(self.last_scale_at))
        for w in sorted(self.workers.values(), key=lambda w: w.worker_id):
            out.workers.append(
                reward_pb2.RewardWorker(
                    worker_id=w.worker_id,
                    state=w.state,
                    handle=str(w.pid or ""),
                    trajectory_id=w.job.trajectory_id if w.job is not None else "",
                    scored=w.scored,
                    started_at=_ts(w.started_at),
                    last_active=_ts(w.last_active),
                )
            )
        return out

    # ------------------------------------------------------------------------------------------------ internals

    def _active(self) -> list[Worker]:
        return [w for w in self.workers.values() if w.state != WS.REWARD_WORKER_STATE_STOPPING]

    def _idle(self) -> list[Worker]:
        return [w for w in self.workers.values() if w.state == WS.REWARD_WORKER_STATE_IDLE]

    def _gauges(self) -> None:
        counts = collections.Counter(w.state for w in self.workers.values())
        for state, name in STATE_NAMES.items():
            metrics.WORKERS.labels(name).set(counts.get(state, 0))
        metrics.QUEUE_DEPTH.set(len(self.queue))
        metrics.IN_FLIGHT.set(counts.get(WS.REWARD_WORKER_STATE_BUSY, 0))
        metrics.WORKERS_MIN.set(self.min_workers)
        metrics.WORKERS_MAX.set(self.max_workers)

    def _resolve(self, job: Job, verdict: Verdict, worker: Worker | None = None, scoring: float = 0.0) -> None:
        if not job.future.done():
            job.future.set_result(
                JobOutcome(verdict, worker.worker_id if worker else "", job.queue_seconds, scoring, job.attempts)
            )

    def _pump(self) -> None:
        """Hand queued jobs to idle workers, then start workers for the jobs still waiting."""
        if self._closed:
            return
        idle = sorted(self._idle(), key=lambda w: -w.idle_since)  # most recently used first: keeps others idle
        while self.queue and idle:
            job = self.queue.popleft()
            if job.future.done():
                continue
            w = idle.pop(0)
            w.state, w.job = WS.REWARD_WORKER_STATE_BUSY, job
            w.task = self._spawn_task(self._run(w, job), f"reward-job-{job.job_id}")
        if self.queue:
            starting = sum(1 for w in self.workers.values() if w.state == WS.REWARD_WORKER_STATE_STARTING)
            want = min(self.max_workers - len(self._active()), len(self.queue) - starting)
            for _ in range(max(0, want)):
                self._start_worker()
        self._gauges()

    def _ensure_min(self) -> None:
        for _ in range(self.min_workers - len(self._active())):
            self._start_worker()

    def _start_worker(self) -> None:
        self._next_worker += 1
        w = Worker(worker_id=f"w{self._next_worker}")
        self.workers[w.worker_id] = w
        self.scale_ups += 1
        self.last_scale_at = time.time()
        metrics.SCALE_UPS.inc()
        w.task = self._spawn_task(self._launch(w), f"reward-start-{w.worker_id}")
        self._gauges()

    async def _launch(self, w: Worker) -> None:
        t0 = time.monotonic()
        try:
            w.proc = await WorkerProcess.spawn([sys.executable, "-m", "rollart_reward.worker"], self._env)
            msg = await asyncio.wait_for(read_frame(w.proc.stdout), self.s.start_timeout)
            if msg is None or msg.get("op") != "ready":
                raise FrameError(f"worker said {msg!r} instead of ready")
        except asyncio.CancelledError:
            await self._kill(w)
            raise
        except (OSError, FrameError, TimeoutError, ValueError) as exc:
            await self._kill(w)
            code = w.proc.returncode if w.proc is not None else None
            why = f"{exc or type(exc).__name__} ({_describe_exit(code)})"
            log.error(f"pool worker failed to start: {why}", extra=log_fields(worker_id=w.worker_id, pid=w.pid))
            self.crashes += 1
            metrics.WORKER_CRASHES.inc()
            self._forget(w)
            self._start_failures += 1
            if self._start_failures < MAX_START_FAILURES:
                self._pump()  # try another worker for the waiting jobs
            elif not self._active():
                # Workers keep failing to start: fail the waiting jobs now rather than let them wait forever.
                while self.queue:
                    self._resolve(
                        self.queue.popleft(),
                        Verdict(
                            status=FAILED,
                            error=f"no pool worker could start: {why}",
                            cause="pool_unavailable",
                            retryable=True,
                        ),
                    )
            self._gauges()
            return
        w.state = WS.REWARD_WORKER_STATE_IDLE
        w.idle_since = time.monotonic()
        self._start_failures = 0
        log.info(
            "pool worker started",
            extra=log_fields(worker_id=w.worker_id, pid=w.pid, seconds=round(time.monotonic() - t0, 3)),
        )
        self._pump()

    async def _run(self, w: Worker, job: Job) -> None:
        now = time.monotonic()
        job.queue_seconds += now - job.enqueued_at
        metrics.QUEUE_SECONDS.observe(now - job.enqueued_at)
        budget = job.budget if job.deadline is None else min(job.budget, job.deadline - now)
        if budget <= 0:
            self._resolve(
                job,
                Verdict(
                    status=TIMEOUT, error="the call's deadline passed while waiting for a worker", cause="deadline"
                ),
            )
            self._done(w)
            return
        job.attempts += 1
        msg = {
            "op": "score",
            "job_id": job.job_id,
            "kind": job.kind,
            "name": job.name,
            "options": job.options,
            "trajectory": base64.b64encode(job.trajectory).decode(),
            "budget": budget,
        }
        started = time.monotonic()

        async def exchange() -> dict[str, Any] | None:
            assert w.proc is not None and w.proc.stdin is not None and w.proc.stdout is not None
            w.proc.stdin.write(encode(msg))
            await w.proc.stdin.drain()  # blocks while a hung (stopped) worker leaves a full pipe unread
            return await read_frame(w.proc.stdout)

        try:
            # One bound for sending the job and reading the verdict: a worker that hangs at either end is killed.
            reply = await asyncio.wait_for(exchange(), budget + self.s.kill_grace)
            if reply is None:
                raise FrameError("worker closed its output")
        except TimeoutError:
            self.kills += 1
            metrics.WORKER_KILLS.inc()
            log.warning(
                "scorer past its deadline: killing its worker",
                extra=log_fields(
                    worker_id=w.worker_id, pid=w.pid, trajectory_id=job.trajectory_id, budget=round(budget, 3)
                ),
            )
            await self._kill(w)
            self._forget(w)
            self._resolve(
                job,
                Verdict(
                    status=TIMEOUT,
                    cause="deadline",
                    error=f"the {job.kind} scorer ran past its {budget:.2f}s budget; "
                    f"its worker {w.worker_id} was killed",
                ),
                w,
                time.monotonic() - started,
            )
            self._pump()
            return
        except asyncio.CancelledError:
            await self._kill(w)
            self._forget(w)
            raise
        except (OSError, FrameError, ValueError, AssertionError) as exc:
            code = await self._reap_exit(w)
            self.crashes += 1
            metrics.WORKER_CRASHES.inc()
            self._forget(w)
            why = f"pool worker {w.worker_id} (pid {w.pid}) died while scoring ({_describe_exit(code)}: {exc})"
            log.error(
                "pool worker died", extra=log_fields(worker_id=w.worker_id, trajectory_id=job.trajectory_id, why=why)
            )
            left = job.budget if job.deadline is None else job.deadline - time.monotonic()
            if job.attempts <= self.s.crash_retries and left > 0 and not self._closed:
                job.enqueued_at = time.monotonic()
                self.queue.appendleft(job)  # first in line: it already waited once
            else:
                self._resolve(
                    job,
                    Verdict(status=FAILED, error=why, cause="worker_crashed", retryable=True),
                    w,
                    time.monotonic() - started,
                )
            self._pump()
            return
        verdict = Verdict.from_dict(reply)
        w.scored += 1
        self.scored_total += 1
        self._resolve(job, verdict, w, float(reply.get("scoring_seconds", time.monotonic() - started)))
        self._done(w)

    def _done(self, w: Worker) -> None:
        w.job = None
        w.last_active = time.time()
        w.idle_since = time.monotonic()
        if w.state == WS.REWARD_WORKER_STATE_BUSY:
            w.state = WS.REWARD_WORKER_STATE_IDLE
            if len(self._active()) > self.max_workers and not self.queue:
                self._retire(w)
        self._pump()

    def _retire(self, w: Worker) -> None:
        w.state = WS.REWARD_WORKER_STATE_STOPPING
        self._spawn_task(self._stop_worker(w), f"reward-stop-{w.worker_id}")
        self._gauges()

    async def _stop_worker(self, w: Worker, count: bool = True) -> None:
        """Graceful stop: close its stdin (it exits at EOF), SIGKILL if it lingers."""
        w.state = WS.REWARD_WORKER_STATE_STOPPING
        if w.proc is not None and w.proc.returncode is None:
            try:
                if w.proc.stdin is not None:
                    w.proc.stdin.close()
                await asyncio.wait_for(w.proc.wait(), 2.0)
            except (TimeoutError, OSError):
                await self._kill(w)
        log.info("pool worker stopped", extra=log_fields(worker_id=w.worker_id, pid=w.pid))
        self._forget(w)

    async def _kill(self, w: Worker) -> None:
        if w.proc is None:
            return
        if w.proc.returncode is None:
            try:
                w.proc.kill()
            except ProcessLookupError:
                pass
        try:
            await asyncio.wait_for(w.proc.wait(), 5.0)
        except TimeoutError:
            log.error("pool worker did not die after SIGKILL", extra=log_fields(pid=w.pid))

    async def _reap_exit(self, w: Worker) -> int | None:
        if w.proc is None:
            return None
        try:
            return await asyncio.wait_for(w.proc.wait(), 2.0)
        except TimeoutError:
            await self._kill(w)
            return w.proc.returncode

    def _forget(self, w: Worker) -> None:
        if self.workers.pop(w.worker_id, None) is not None:
            self.scale_downs += 1
            self.last_scale_at = time.time()
            metrics.SCALE_DOWNS.inc()
        self._gauges()

    async def _reap_loop(self) -> None:
        while True:
            await asyncio.sleep(max(0.05, min(0.25, self.idle_timeout / 4)))
            try:
                now = time.monotonic()
                excess = len(self._active()) - self.min_workers
                for w in sorted(self._idle(), key=lambda w: w.idle_since):
                    if excess <= 0:
                        break
                    if now - w.idle_since >= self.idle_timeout:
                        log.info("pool worker idle: scaling down", extra=log_fields(worker_id=w.worker_id))
                        self._retire(w)
                        excess -= 1
                self._ensure_min()
            except Exception:  # noqa: BLE001 - keep reaping
                log.exception("pool reaper failed")
