"""A job with dynamic sampling (issue 25 item 4) on the step driver's cluster (real ledger over Redis, relay,
trainer; scripted rollout, tests/integration/trainer/fakes.py): every even group's rewards are all equal. The
ledger filters those groups, every step still trains on whole batches with signal, the prompt pool is topped up
by the groups filtered (without it the job starves: half of the groups are consumed without training), and the
step metrics, metrics.jsonl and the ledger's accounting agree on what was filtered."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rollart.runtime.client import channel
from rollart.v1 import ledger_pb2, ledger_pb2_grpc
from tests.conftest import TOKEN
from tests.integration.trainer import test_step_driver as drv
from tests.integration.trainer.fakes import ScriptedRollout

pytest.importorskip("torch")
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from rollart_devtools.tiny_model import build_tiny_model

    out = tmp_path_factory.mktemp("ds") / "tiny"
    build_tiny_model(out, layers=2, hidden=128, vocab_size=drv.VOCAB, seed=0, pretrain_steps=0)
    return out


class _FlatEvenGroups:
    """The rollout's ledger stub, with the rewards of every even group (``<job>-g<i>``) set to 1."""

    def __init__(self, stub: Any) -> None:
        self._stub = stub

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stub, name)

    async def Submit(self, req: ledger_pb2.SubmitRequest, **kw: Any) -> Any:  # noqa: N802 - the RPC's name
        if int(req.trajectory.group_id.rsplit("-g", 1)[1]) % 2 == 0:
            req.reward.reward = 1.0
        return await self._stub.Submit(req, **kw)


class FlatEvenRollout(ScriptedRollout):
    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.ledger = _FlatEvenGroups(self.ledger)


async def test_zero_variance_groups_are_filtered_and_replaced(services, redis_url, tmp_path, tiny_model, monkeypatch):
    monkeypatch.setattr(drv, "ScriptedRollout", FlatEvenRollout)
    cluster = drv.Cluster(services, redis_url, tmp_path)
    cluster.start_trainer()
    grpo = {"learning_rate": 1e-3, "max_grad_norm": 1.0, "dynamic_sampling": True}
    spec = cluster.spec(tiny_model, max_steps=5, grpo=grpo, sampling={"max_tokens": 3})
    job, _, metrics, _, _ = await drv.run_job(cluster, tiny_model, spec)
    assert job.steps_completed == 5
    for m in metrics:
        assert m.samples == 8 and m.groups == 2
        assert m.extra["zero_advantage_groups"] == 0  # the kept groups all carry signal
        assert m.extra["response_length_max"] == 6 and m.extra["response_clip_fraction"] == 1.0  # 3 = max_tokens
    filtered = [int(m.extra["filtered_groups"]) for m in metrics]
    assert sum(filtered) >= 3  # half of the groups are flat: about two a step (groups complete about in order)
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [int(x["extra"]["filtered_groups"]) for x in lines] == filtered
    ch = channel(cluster.ledger, token=TOKEN, default_timeout=10)
    st = await ledger_pb2_grpc.LedgerStub(ch).GetStatus(ledger_pb2.LedgerStatusRequest())
    await ch.close()
    acc = st.accounting
    assert acc.trained.samples == 5 * 8
    # every filtered sample was filtered for one of the steps' batches (none since: no sixth GetBatch)
    assert acc.filtered.samples == 4 * sum(filtered) == sum(int(x["extra"]["filtered_samples"]) for x in lines)
    assert lines[-1]["accounting_total"]["filtered"]["samples"] == acc.filtered.samples
    assert st.buffer.reserved_samples == 0
