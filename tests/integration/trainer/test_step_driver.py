"""The trainer service drives real steps: real ledger (Redis), real relay and weight plane, a real trainer
process; the rollout side is scripted (tests/integration/trainer/fakes.py) so no inference engine runs.

- An ASYNC job (alpha = 1) runs its steps: every batch is trained on and acknowledged, every version is
  registered once with the hash the actor verified, the actor ends on the newest version, staleness stays
  within alpha, and the metrics file has one line per step.
- SYNC: no admitted token is older than the version trained on (staleness 0).
- The trainer is SIGKILLed in the middle of a job and started again: it resumes from its checkpoint on its
  own, re-publishes the interrupted version with identical bits (the ledger accepts each version once),
  and the job completes with every step trained exactly once.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from pathlib import Path

import grpc
import pytest

from rollart.delta import WeightSet
from rollart.job.spec import job_spec, model_dir_digest, weights_digest
from rollart.runtime.client import channel
from rollart.v1 import ledger_pb2, ledger_pb2_grpc, trainer_pb2, trainer_pb2_grpc
from tests.conftest import BIN, TOKEN
from tests.integration.ledger.conftest import start_ledger
from tests.integration.trainer.fakes import ScriptedRollout, WeightActor

pytest.importorskip("torch")
pytestmark = pytest.mark.slow

JOB = "drv-job"
KEY = "test-segment-key-0123456789abcdef"
VOCAB = 512


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from rollart_devtools.tiny_model import build_tiny_model

    out = tmp_path_factory.mktemp("drv") / "tiny"
    build_tiny_model(out, layers=2, hidden=128, vocab_size=VOCAB, seed=0, pretrain_steps=0)
    return out


class Cluster:
    def __init__(self, services, redis_url: str, tmp: Path) -> None:
        self.services, self.tmp = services, tmp
        self.killed_at = 0.0  # time.time() of the trainer's SIGKILL, when a test kills it
        self.ledger_proc, self.ledger = start_ledger(services, redis_url)
        self.relay_proc, info = services.start(
            "relay",
            [str(BIN / "rollart-relay")],
            ROLLART_JOB_ID=JOB,
            ROLLART_JOB_KEY=KEY,
            ROLLART_CACHE_DIR=str(tmp / "relay-cache"),
        )
        self.relay = info["address"]
        self.trainer_proc = None
        self.trainer = ""

    def start_trainer(self) -> None:
        self.trainer_proc, info = self.services.start(
            "trainer",
            [str(BIN / "rollart-trainer")],
            timeout=90,
            ROLLART_JOB_ID=JOB,
            ROLLART_JOB_KEY=KEY,
            ROLLART_WORK_DIR=str(self.tmp / "trainer-state"),
            ROLLART_TORCH_THREADS="1",
            ROLLART_STAGE_WAIT_SECONDS="3",
        )
        self.trainer = info["address"]

    def spec(self, model: Path, **kw) -> trainer_pb2.TrainerJobSpec:
        d = {
            "job_id": JOB,
            "model": str(model),
            "mode": "async",
            "alpha": 1,
            "batch_size": 8,
            "group_size": 4,
            "max_steps": 4,
            "seed": 0,
            "grpo": {"learning_rate": 1e-3, "max_grad_norm": 1.0, "normalize_advantage_std": True},
            "publish": {"weight_sync": "delta", "relay_endpoints": [self.relay], "streams": 2},
            "checkpoint": {"every_steps": 1, "keep_last": 2, "resume": True},
            "prompts": {"task": "scripted", "environment": "scripted", "seed": 100},
            "endpoints": {"ledger": self.ledger},
            "metrics_path": str(self.tmp / "metrics.jsonl"),
            "batch_timeout": 60,
        }
        d.update(kw)
        return job_spec(d)


async def wait_job(stub, states, timeout: float) -> trainer_pb2.TrainerJob:
    deadline = time.monotonic() + timeout
    job = None
    while time.monotonic() < deadline:
        try:
            job = await stub.GetJob(trainer_pb2.GetTrainerJobRequest(), timeout=5)
            if job.state in states:
                return job
            if job.state == trainer_pb2.TRAINER_JOB_STATE_FAILED:
                raise AssertionError(f"job failed: {job.error}")
        except grpc.aio.AioRpcError as exc:
            if exc.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.NOT_FOUND):
                raise
        await asyncio.sleep(0.3)
    raise AssertionError(f"job not in {states} after {timeout}s: {job}")


async def check_versions(ledger_addr: str, actor: WeightActor, upto: int) -> dict[int, bytes]:
    ch = channel(ledger_addr, token=TOKEN, default_timeout=10)
    stub = ledger_pb2_grpc.LedgerStub(ch)
    resp = await stub.ListVersions(ledger_pb2.ListVersionsRequest(from_version=0))
    await ch.close()
    got = {v.version: v.hash for v in resp.versions}
    assert sorted(got) == list(range(upto + 1)), sorted(got)
    assert all(resp.versions[i].base_version == i - 1 for i in range(1, upto + 1))
    await actor.sub.wait_version(upto, timeout=30)
    assert actor.sub.active_version == upto
    assert actor.sub.active_hash == got[upto]  # the actor verified the trainer's h(v)
    for v, h in actor.sub.applied:
        assert got[v] == h
    return got


async def collect_phases(stub, into: list) -> None:
    """(step, phase name) of every phase change, until the job ends."""
    async for ev in stub.WatchJob(trainer_pb2.WatchTrainerJobRequest(), timeout=None):
        if ev.WhichOneof("event") == "phase":
            into.append((ev.phase.step, trainer_pb2.StepPhase.Name(ev.phase.phase).removeprefix("STEP_PHASE_")))


async def run_job(
    cluster: Cluster,
    model: Path,
    spec,
    *,
    kill_after_step: int = 0,
    phases: list | None = None,
    initial: WeightSet | None = None,
):
    """``initial``: the actor's version-0 weights when they are not the model's (a LoRA job's adapter)."""
    actor = WeightActor(
        "actor-a",
        ledger=cluster.ledger,
        relays=[cluster.relay, cluster.trainer],
        job=JOB,
        key=KEY.encode(),
        token=TOKEN,
        model=model,
        initial_hash=model_dir_digest(model) if initial is None else weights_digest(initial.arrays, initial.dtypes),
        initial=initial,
    )
    await actor.start()
    rollout = ScriptedRollout(ledger=cluster.ledger, token=TOKEN, actor=actor, vocab=VOCAB, loops=6)
    await rollout.start()
    ch = channel(cluster.trainer, token=TOKEN, default_timeout=30)
    stub = trainer_pb2_grpc.TrainerStub(ch)
    try:
        job = await stub.StartJob(trainer_pb2.StartJobRequest(spec=spec))
        assert job.state == trainer_pb2.TRAINER_JOB_STATE_STARTING
        # Idempotent while it runs.
        again = await stub.StartJob(trainer_pb2.StartJobRequest(spec=spec))
        assert again.spec.job_id == JOB
        watcher = asyncio.ensure_future(collect_phases(stub, phases)) if phases is not None else None
        if kill_after_step:
            deadline = time.monotonic() + 120
            while (await stub.GetJob(trainer_pb2.GetTrainerJobRequest())).steps_completed < kill_after_step:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.05)
            os.kill(cluster.trainer_proc.pid, signal.SIGKILL)
            cluster.killed_at = time.time()
            cluster.trainer_proc.proc.wait(10)
            await ch.close()
            cluster.start_trainer()  # finds job.json and resumes by itself
            ch = channel(cluster.trainer, token=TOKEN, default_timeout=30)
            stub = trainer_pb2_grpc.TrainerStub(ch)
            actor.sub.follower.endpoints[1:] = [cluster.trainer]
        job = await wait_job(stub, (trainer_pb2.TRAINER_JOB_STATE_COMPLETED,), 180)
        if watcher is not None:
            await asyncio.wait_for(watcher, 10)  # WatchJob ends with the job
        hashes = await check_versions(cluster.ledger, actor, spec.max_steps)
        metrics = await stub.GetStepMetrics(trainer_pb2.GetStepMetricsRequest(from_step=1))
        published = await stub.ListPublishedVersions(trainer_pb2.ListPublishedVersionsRequest())
        return job, hashes, list(metrics.steps), list(published.versions), rollout
    finally:
        await rollout.stop()
        await actor.stop()
        await ch.close()


async def test_async_job_trains_publishes_and_actor_follows(services, redis_url, tmp_path, tiny_model):
    cluster = Cluster(services, redis_url, tmp_path)
    cluster.start_trainer()
    spec = cluster.spec(tiny_model)
    phases: list = []
    job, hashes, metrics, published, rollout = await run_job(cluster, tiny_model, spec, phases=phases)
    # The six steps in order (the update makes v = s-1 active before training on the batch).
    # The first step the watch saw from its start: the watch starts after StartJob, and on a fast machine steps
    # 1-3 may be under way by then (step 3 was, once). The last step is followed by the final UPDATE (the last
    # version onto the actors), so a step is compared up to its IDLE.
    def of(step: int) -> list:
        return [p for s, p in phases if s == step]

    whole = [s for s in (2, 3, 4) if of(s)[:1] == ["GET_BATCH"]]
    assert whole, phases
    seen = of(whole[0])[:8]
    assert seen == ["GET_BATCH", "SUSPEND", "UPDATE", "RESUME", "TRAIN", "CHECKPOINT", "PUBLISH", "IDLE"], seen
    assert job.steps_completed == 4 and job.policy_version == 4 and job.latest_published_version == 4
    assert [m.step for m in metrics] == [1, 2, 3, 4]
    for m in metrics:
        assert m.samples == 8 and m.groups == 2
        assert m.version_trained == m.step - 1 and m.version_produced == m.step
        assert 0 <= m.staleness_mean <= 1 and m.staleness_max <= 1  # alpha = 1
        assert m.tokens_trained > 0 and m.train_time.ToNanoseconds() > 0
        assert m.actor_versions["actor-a"] >= m.step - 1
    assert [p.version.version for p in published] == [0, 1, 2, 3, 4]
    assert all(p.version.hash == hashes[p.version.version] for p in published)
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [1, 2, 3, 4]
    # The generation accounting: every trained sample of a step is in its accounting, totals add up.
    for x, m in zip(lines, metrics):
        assert x["accounting"]["trained"]["samples"] == m.samples == m.accounting.trained.samples
        assert x["accounting_total"]["trained"]["tokens"] >= x["accounting"]["trained"]["tokens"] > 0
        assert 0.0 <= x["wasted_token_fraction"] <= x["wasted_token_fraction_total"] + 1.0
        assert x["extra"]["t_train_end"] > x["extra"]["t_train_start"] > x["extra"]["t_batch_ready"]
    assert lines[-1]["accounting_total"]["trained"]["samples"] == 4 * 8
    # Every trained batch was acknowledged: the ledger holds no reserved samples.
    ch = channel(cluster.ledger, token=TOKEN, default_timeout=10)
    st = await ledger_pb2_grpc.LedgerStub(ch).GetStatus(ledger_pb2.LedgerStatusRequest())
    await ch.close()
    assert st.buffer.reserved_samples == 0
    assert st.current_version == 4  # the final update planned the last version


async def test_sync_mode_trains_on_fresh_samples_only(services, redis_url, tmp_path, tiny_model):
    cluster = Cluster(services, redis_url, tmp_path)
    cluster.start_trainer()
    spec = cluster.spec(tiny_model, mode="sync", max_steps=3)
    phases: list = []
    job, _, metrics, _, _ = await run_job(cluster, tiny_model, spec, phases=phases)
    # Nothing is generated between SUSPEND and RESUME: training, publishing and the update all happen there.
    # Step 3: the watch starts after StartJob, and on a fast machine step 1 or 2 may be under way by then.
    step3 = [p for s, p in phases if s == 3]
    assert step3 == ["GET_BATCH", "SUSPEND", "TRAIN", "CHECKPOINT", "PUBLISH", "UPDATE", "RESUME", "IDLE"], step3
    assert job.steps_completed == 3
    assert [m.staleness_max for m in metrics] == [0, 0, 0]
    assert all(m.extra["batch_min_version"] == m.step - 1 for m in metrics)


async def test_trainer_sigkill_resumes_without_double_publication(services, redis_url, tmp_path, tiny_model):
    cluster = Cluster(services, redis_url, tmp_path)
    cluster.start_trainer()
    spec = cluster.spec(tiny_model, max_steps=5)
    job, hashes, metrics, _, _ = await run_job(cluster, tiny_model, spec, kill_after_step=2)
    assert job.state == trainer_pb2.TRAINER_JOB_STATE_COMPLETED and job.steps_completed == 5
    assert job.HasField("resumed_from") and job.resumed_from.step >= 2
    # Steps 1..5 each trained once (the metrics file is appended across the restart).
    lines = [json.loads(x)["step"] for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert sorted(set(lines)) == [1, 2, 3, 4, 5]
    assert len(lines) == len(set(lines))
    assert [m.step for m in metrics] == [1, 2, 3, 4, 5]
    # A step the kill interrupted counts from its first start, and its record says it was restarted.
    for m in metrics:
        start, end = m.started_at.ToNanoseconds() / 1e9, m.finished_at.ToNanoseconds() / 1e9
        if m.finished_at.seconds and start < cluster.killed_at < end:
            assert m.extra["trainer_restarts"] == 1, m
            assert m.step_time.ToNanoseconds() / 1e9 >= end - start - 0.5, m
        else:
            assert "trainer_restarts" not in m.extra, m


async def test_stop_job_after_step(services, redis_url, tmp_path, tiny_model):
    cluster = Cluster(services, redis_url, tmp_path)
    cluster.start_trainer()
    actor = WeightActor(
        "actor-a",
        ledger=cluster.ledger,
        relays=[cluster.relay],
        job=JOB,
        key=KEY.encode(),
        token=TOKEN,
        model=tiny_model,
        initial_hash=model_dir_digest(tiny_model),
    )
    await actor.start()
    rollout = ScriptedRollout(ledger=cluster.ledger, token=TOKEN, actor=actor, vocab=VOCAB, loops=4)
    await rollout.start()
    ch = channel(cluster.trainer, token=TOKEN, default_timeout=30)
    stub = trainer_pb2_grpc.TrainerStub(ch)
    try:
        with pytest.raises(grpc.aio.AioRpcError) as exc:
            await stub.GetJob(trainer_pb2.GetTrainerJobRequest())
        assert exc.value.code() == grpc.StatusCode.NOT_FOUND
        bad = cluster.spec(tiny_model, job_id="another-job")
        with pytest.raises(grpc.aio.AioRpcError) as exc:
            await stub.StartJob(trainer_pb2.StartJobRequest(spec=bad))
        assert exc.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        await stub.StartJob(trainer_pb2.StartJobRequest(spec=cluster.spec(tiny_model, max_steps=0)))  # until stopped
        deadline = time.monotonic() + 120
        while (await stub.GetJob(trainer_pb2.GetTrainerJobRequest())).steps_completed < 2:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.1)
        other = cluster.spec(tiny_model, max_steps=3)
        with pytest.raises(grpc.aio.AioRpcError) as exc:  # another spec while one runs
            await stub.StartJob(trainer_pb2.StartJobRequest(spec=other))
        assert exc.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        await stub.StopJob(trainer_pb2.StopJobRequest(job_id=JOB, mode=trainer_pb2.STOP_MODE_AFTER_STEP))
        job = await wait_job(stub, (trainer_pb2.TRAINER_JOB_STATE_STOPPED,), 60)
        assert job.steps_completed >= 2 and job.latest_published_version == job.policy_version
        saved = json.loads((tmp_path / "trainer-state" / "job.json").read_text())
        assert saved["state"] == "stopped"  # a restart does not resume a stopped job
        ckpts = await stub.ListCheckpoints(trainer_pb2.ListCheckpointsRequest())
        assert ckpts.checkpoints and ckpts.checkpoints[-1].step == job.steps_completed
        info = await stub.SaveCheckpoint(trainer_pb2.SaveCheckpointRequest())
        assert info.step == job.steps_completed and info.includes_optimizer
    finally:
        await rollout.stop()
        await actor.stop()
        await ch.close()
