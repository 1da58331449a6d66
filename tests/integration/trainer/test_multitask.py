"""A multi-task job through the real trainer and ledger (issue 12): two tasks whose rollouts run at very
different speeds (one loop set per task, as one envmanager group per task would), shares 3:1.

Every batch holds each task's share in whole groups (the fast task cannot crowd out the slow one, in the
batch or in the in-flight window), the trainer reports per-task figures in StepMetrics.tasks and
metrics.jsonl, its prompts follow the tasks' own seeds, and the ledger's status lists both pools.
"""

from __future__ import annotations

import json

import pytest

from rollart.job.metrics import from_record
from rollart.job.spec import model_dir_digest
from rollart.runtime.client import channel
from rollart.v1 import ledger_pb2, ledger_pb2_grpc, trainer_pb2, trainer_pb2_grpc
from tests.conftest import TOKEN
from tests.integration.trainer.fakes import ScriptedRollout, WeightActor
from tests.integration.trainer.test_step_driver import JOB, KEY, VOCAB, Cluster, tiny_model, wait_job  # noqa: F401

pytest.importorskip("torch")
pytestmark = pytest.mark.slow


async def test_batches_mix_tasks_by_share_and_metrics_are_per_task(services, redis_url, tmp_path, tiny_model):  # noqa: F811
    cluster = Cluster(services, redis_url, tmp_path)
    cluster.start_trainer()
    spec = cluster.spec(
        tiny_model,
        batch_size=16,
        group_size=4,
        max_steps=3,
        prompts=None,
        tasks=[
            {"task": "fast", "environment": "scripted", "seed": 100, "share": 3},
            {"task": "slow", "environment": "scripted", "seed": 5000, "share": 1},
        ],
    )
    actor = WeightActor(
        "actor-a", ledger=cluster.ledger, relays=[cluster.relay], job=JOB, key=KEY.encode(), token=TOKEN,
        model=tiny_model, initial_hash=model_dir_digest(tiny_model),
    )  # fmt: skip
    await actor.start()
    # The slow task's loops take ten times longer per turn: without shares the fast task's groups would fill
    # the batches (oldest ready first) and the in-flight window.
    fast = ScriptedRollout(ledger=cluster.ledger, token=TOKEN, actor=actor, vocab=VOCAB, loops=6, name="env-fast",
                           delay=0.01, tasks=("fast",), rewards={"fast": 1.0})
    slow = ScriptedRollout(ledger=cluster.ledger, token=TOKEN, actor=actor, vocab=VOCAB, loops=2, name="env-slow",
                           delay=0.1, tasks=("slow",))
    await fast.start()
    await slow.start()
    ch = channel(cluster.trainer, token=TOKEN, default_timeout=30)
    stub = trainer_pb2_grpc.TrainerStub(ch)
    try:
        await stub.StartJob(trainer_pb2.StartJobRequest(spec=spec))
        job = await wait_job(stub, (trainer_pb2.TRAINER_JOB_STATE_COMPLETED,), 240)
        assert job.steps_completed == 3
        metrics = list((await stub.GetStepMetrics(trainer_pb2.GetStepMetricsRequest(from_step=1))).steps)
        lch = channel(cluster.ledger, token=TOKEN, default_timeout=10)
        st = await ledger_pb2_grpc.LedgerStub(lch).GetStatus(ledger_pb2.LedgerStatusRequest())
        await lch.close()
    finally:
        await fast.stop()
        await slow.stop()
        await actor.stop()
        await ch.close()
    for m in metrics:
        assert set(m.tasks) == {"fast", "slow"}, m.tasks
        f, s = m.tasks["fast"], m.tasks["slow"]
        assert (f.groups, f.samples, s.groups, s.samples) == (3, 12, 1, 4)
        assert f.batch_share == 0.75 and s.batch_share == 0.25
        assert f.reward_mean == 1.0 and 0.0 <= s.reward_mean <= 1.0
        assert f.turns_mean == 2.0 and f.tokens == 12 * 6 and f.prompt_tokens == 12 * (4 + 2)
        assert m.reward_mean == pytest.approx(0.75 * f.reward_mean + 0.25 * s.reward_mean)
    # metrics.jsonl carries the same, and reads back.
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [x["tasks"]["slow"]["batch_share"] for x in lines] == [0.25] * 3
    assert from_record(lines[0]).tasks["fast"].samples == 12
    # The ledger's policy has the shares, and its status lists both pools.
    assert dict(st.policy.task_shares) == {"fast": 0.75, "slow": 0.25}
    pools = {p.task: p for p in st.task_pools}
    assert set(pools) == {"fast", "slow"} and pools["fast"].share == 0.75
    assert fast.admitted > 0 and slow.admitted >= 3 * 4
