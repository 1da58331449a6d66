"""A Megatron job with tensor parallel 2 through the trainer *service*: the service (rank 0) starts its follower
rank itself (rollart_trainer.ranks) and mirrors every backend call to it.

- Parity: the same SYNC job (scripted rollouts drawn per sample, so both runs train on the same trajectories)
  at TP1 and at TP2, each in its own cluster: the TP2 job completes, publishes every version, and its step
  losses and gradient norms match TP1's within the tolerances of the backend's TP tests.
- A follower SIGKILLed in the middle of the job: the job fails within a bound with one error naming the rank
  and the signal, no follower is left running, and the next StartJob builds a new world that resumes from the
  last complete checkpoint and finishes the job.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import pytest

from rollart.job.spec import model_dir_digest
from rollart.local.processes import start_redis
from rollart.runtime.client import channel
from rollart.v1 import trainer_pb2, trainer_pb2_grpc
from tests.conftest import TOKEN
from tests.integration.trainer.fakes import ScriptedRollout, WeightActor
from tests.integration.trainer.test_step_driver import JOB, KEY, VOCAB, Cluster, check_versions, wait_job

pytest.importorskip("torch")
pytest.importorskip("megatron.core")
pytestmark = pytest.mark.slow

T = trainer_pb2
#: How long rank 0 may take to notice a follower that died inside a collective and fail the job (gloo sees the
#: connection close; loaded 2-core host).
FAIL_BOUND_S = 30.0


@pytest.fixture(scope="module")
def gqa_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Four heads over two key/value heads: splittable in two tensor-parallel ranks."""
    from rollart_devtools.tiny_model import build_tiny_model

    out = tmp_path_factory.mktemp("megatron-world") / "tiny"
    build_tiny_model(out, seed=2, pretrain_steps=0, layers=2, hidden=128, heads=4, kv_heads=2, vocab_size=VOCAB)
    return out


def megatron_spec(cluster: Cluster, model: Path, tp: int, **kw) -> T.TrainerJobSpec:
    kw.setdefault("max_steps", 2)
    return cluster.spec(model, backend="megatron", parallel={"tensor_parallel_size": tp}, mode="sync", **kw)


def followers_of(pid: int) -> list[int]:
    """Live follower ranks (``python -m rollart_trainer.ranks``) whose parent is ``pid``."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        fields = stat.rpartition(")")[2].split()
        if int(fields[1]) == pid and fields[0] != "Z" and b"rollart_trainer.ranks" in cmd:
            out.append(int(entry))
    return out


async def no_followers_within(pid: int, seconds: float) -> None:
    """The job's end stops its followers (after its state is reported: the cleanup runs next)."""
    deadline = time.monotonic() + seconds
    while followers_of(pid):
        assert time.monotonic() < deadline, f"followers of {pid} still running: {followers_of(pid)}"
        await asyncio.sleep(0.2)


class Rollout:
    """The scripted actor and rollout loops of one cluster (seeded per sample)."""

    def __init__(self, cluster: Cluster, model: Path) -> None:
        self.actor = WeightActor(
            "actor-a", ledger=cluster.ledger, relays=[cluster.relay, cluster.trainer], job=JOB, key=KEY.encode(),
            token=TOKEN, model=model, initial_hash=model_dir_digest(model),
        )
        self.rollout = ScriptedRollout(
            ledger=cluster.ledger, token=TOKEN, actor=self.actor, vocab=VOCAB, loops=4, seed_by_sample=True
        )

    async def __aenter__(self) -> Rollout:
        await self.actor.start()
        await self.rollout.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.rollout.stop()
        await self.actor.stop()


async def run_to_completion(cluster: Cluster, model: Path, spec: T.TrainerJobSpec) -> list[T.StepMetrics]:
    async with Rollout(cluster, model) as r:
        ch = channel(cluster.trainer, token=TOKEN, default_timeout=30)
        stub = trainer_pb2_grpc.TrainerStub(ch)
        try:
            await stub.StartJob(T.StartJobRequest(spec=spec))
            job = await wait_job(stub, (T.TRAINER_JOB_STATE_COMPLETED,), 600)
            assert job.steps_completed == spec.max_steps
            await check_versions(cluster.ledger, r.actor, spec.max_steps)
            return list((await stub.GetStepMetrics(T.GetStepMetricsRequest(from_step=1))).steps)
        finally:
            await ch.close()


async def test_tp2_job_through_the_service_matches_tp1(services, redis_url, tmp_path, gqa_model):
    one = Cluster(services, redis_url, tmp_path / "tp1")
    one.start_trainer()
    tp1 = await run_to_completion(one, gqa_model, megatron_spec(one, gqa_model, 1))
    redis2, url2 = start_redis(tmp_path / "redis-tp2")
    try:
        two = Cluster(services, url2, tmp_path / "tp2")
        two.start_trainer()
        tp2 = await run_to_completion(two, gqa_model, megatron_spec(two, gqa_model, 2))
        await no_followers_within(two.trainer_proc.pid, 30)
    finally:
        redis2.stop()
    assert [m.step for m in tp1] == [m.step for m in tp2] == [1, 2]
    for a, b in zip(tp1, tp2, strict=True):
        assert a.tokens_trained == b.tokens_trained > 0  # the same trajectories
    # The backend's TP tests: step 1 from equal weights tight, step 2 after one AdamW step looser.
    assert tp2[0].loss == pytest.approx(tp1[0].loss, rel=1e-4, abs=1e-6)
    assert tp2[0].grad_norm == pytest.approx(tp1[0].grad_norm, rel=1e-4)
    assert tp2[1].loss == pytest.approx(tp1[1].loss, rel=1e-3, abs=1e-4)
    assert tp2[1].grad_norm == pytest.approx(tp1[1].grad_norm, rel=1e-3)


async def test_follower_sigkilled_mid_job_fails_naming_the_rank_then_resumes(
    services, redis_url, tmp_path, gqa_model
):
    cluster = Cluster(services, redis_url, tmp_path)
    cluster.start_trainer()
    spec = megatron_spec(cluster, gqa_model, 2, max_steps=3)
    trainer_pid = cluster.trainer_proc.pid
    async with Rollout(cluster, gqa_model) as r:
        ch = channel(cluster.trainer, token=TOKEN, default_timeout=30)
        stub = trainer_pb2_grpc.TrainerStub(ch)
        try:
            await stub.StartJob(T.StartJobRequest(spec=spec))
            # Mid-step, for sure: stop the follower after step 1, so rank 0 blocks in the next collective it
            # needs it for (step 2's train step, or step 1's checkpoint), then kill it there.
            deadline = time.monotonic() + 600
            while (job := await stub.GetJob(T.GetTrainerJobRequest())).steps_completed < 1:
                assert job.state != T.TRAINER_JOB_STATE_FAILED, job.error
                assert time.monotonic() < deadline, job
                await asyncio.sleep(0.05)
            (follower,) = followers_of(trainer_pid)
            os.kill(follower, signal.SIGSTOP)
            backend_phases = (T.STEP_PHASE_TRAIN, T.STEP_PHASE_CHECKPOINT)
            seen, since = None, time.monotonic()
            # Until rank 0 has been in one backend phase for 3 s: blocked inside a collective.
            while seen is None or seen[1] not in backend_phases or time.monotonic() - since < 3.0:
                job = await stub.GetJob(T.GetTrainerJobRequest())
                if (job.current_step, job.phase) != seen:
                    seen, since = (job.current_step, job.phase), time.monotonic()
                assert job.state == T.TRAINER_JOB_STATE_RUNNING and time.monotonic() < deadline, job
                await asyncio.sleep(0.1)
            os.kill(follower, signal.SIGKILL)
            killed_at = time.monotonic()
            while (job := await stub.GetJob(T.GetTrainerJobRequest())).state != T.TRAINER_JOB_STATE_FAILED:
                assert job.state != T.TRAINER_JOB_STATE_COMPLETED, "the job went on without its follower"
                assert time.monotonic() - killed_at < FAIL_BOUND_S, job
                await asyncio.sleep(0.1)
            assert job.error.startswith("ABORTED: ") and f"rank 1 (pid {follower}) died: SIGKILL" in job.error, job.error
            await no_followers_within(trainer_pid, 30)  # the broken world is torn down
            assert cluster.trainer_proc.proc.poll() is None  # the service is still up
            # The next StartJob: a new world, resumed from the newest complete checkpoint.
            await stub.StartJob(T.StartJobRequest(spec=spec))
            job = await wait_job(stub, (T.TRAINER_JOB_STATE_COMPLETED,), 600)
            assert job.HasField("resumed_from") and 1 <= job.resumed_from.step <= 2
            assert job.steps_completed == 3
            await check_versions(cluster.ledger, r.actor, 3)  # every version once, the actor on the newest
            await no_followers_within(trainer_pid, 30)
        finally:
            await ch.close()


async def test_a_world_larger_than_the_host_is_refused_naming_the_field(services, redis_url, tmp_path, gqa_model):
    import grpc

    cluster = Cluster(services, redis_url, tmp_path)
    cluster.start_trainer()
    ch = channel(cluster.trainer, token=TOKEN, default_timeout=30)
    stub = trainer_pb2_grpc.TrainerStub(ch)
    try:
        if len(os.sched_getaffinity(0)) >= 4:
            pytest.skip("this host has room for the 4 ranks of TP2 x PP2")
        parallel = {"tensor_parallel_size": 2, "pipeline_parallel_size": 2}  # a layout the model takes
        spec = cluster.spec(gqa_model, backend="megatron", parallel=parallel)
        with pytest.raises(grpc.aio.AioRpcError) as exc:
            await stub.StartJob(T.StartJobRequest(spec=spec))
        assert exc.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        details = exc.value.details()
        assert details.startswith("spec.parallel.pipeline_parallel_size") and "= 4 ranks, more than" in details
        assert not followers_of(cluster.trainer_proc.pid)  # nothing was started
    finally:
        await ch.close()
