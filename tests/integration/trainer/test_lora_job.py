"""A LoRA job through a real trainer process, real ledger (Redis), real relay and weight plane (the rollout side
scripted, as in test_step_driver.py):

- StartJob refuses bad LoRA settings with INVALID_ARGUMENT naming the field, and starts nothing;
- a LoRA job (KL to the base on) trains, publishes adapter versions whose deltas the actor verifies and applies
  along the hash chain from the adapter's v0; the actor's weights are peft's tensor names plus
  ``rollart.base_hash`` = the base's h(v0); checkpoints hold the adapter, not the base;
- the trainer SIGKILLed mid-job resumes from its adapter checkpoint and republishes identical bits.
"""

from __future__ import annotations

from pathlib import Path

import grpc
import numpy as np
import pytest

from rollart.delta import load_safetensors
from rollart.job.spec import model_dir_digest
from rollart.runtime.client import channel
from rollart.v1 import trainer_pb2, trainer_pb2_grpc
from tests.conftest import TOKEN
from tests.integration.trainer.test_step_driver import Cluster, run_job, tiny_model  # noqa: F401 (fixture)

pytest.importorskip("torch")
pytest.importorskip("peft")
pytestmark = pytest.mark.slow

LORA = {"rank": 4, "alpha": 8.0, "target_modules": ["q_proj", "v_proj", "down_proj"]}


def initial_adapter(model: Path, seed: int = 0):
    """Version 0 as the trainer makes it (the same seed draws the same lora_A in any process)."""
    from rollart_trainer.backends import make_backend
    from rollart_trainer.grpo import GrpoSettings
    from rollart_trainer.lora import LoraSettings

    lora = LoraSettings(rank=4, alpha=8.0, target_modules=("q_proj", "v_proj", "down_proj"))
    return make_backend("torch", model, GrpoSettings(), device="cpu", lora=lora, seed=seed).weight_set(0)


async def test_bad_lora_is_refused_then_a_lora_job_trains_and_publishes_adapters(
    services,
    redis_url,
    tmp_path,
    tiny_model,  # noqa: F811
):
    cluster = Cluster(services, redis_url, tmp_path)
    cluster.start_trainer()
    ch = channel(cluster.trainer, token=TOKEN, default_timeout=30)
    stub = trainer_pb2_grpc.TrainerStub(ch)
    for bad, field in [
        ({**LORA, "rank": 4096}, "spec.lora.rank"),
        ({**LORA, "alpha": -1.0}, "spec.lora.alpha"),
        ({**LORA, "target_modules": ["q_proj", "c_attn"]}, "spec.lora.target_modules[1]"),
    ]:
        with pytest.raises(grpc.aio.AioRpcError) as exc:
            await stub.StartJob(trainer_pb2.StartJobRequest(spec=cluster.spec(tiny_model, lora=bad)))
        assert exc.value.code() == grpc.StatusCode.INVALID_ARGUMENT and field in exc.value.details(), exc.value
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await stub.GetJob(trainer_pb2.GetTrainerJobRequest())
    assert exc.value.code() == grpc.StatusCode.NOT_FOUND  # nothing started
    await ch.close()

    v0 = initial_adapter(tiny_model)
    spec = cluster.spec(tiny_model, max_steps=3, lora=LORA, grpo={"learning_rate": 5e-3, "kl_coef": 0.05})
    job, hashes, metrics, published, _ = await run_job(cluster, tiny_model, spec, initial=v0)
    assert job.state == trainer_pb2.TRAINER_JOB_STATE_COMPLETED and job.steps_completed == 3
    assert [p.version.version for p in published] == [0, 1, 2, 3]
    assert published[0].version.hash == hashes[0]  # the trainer's v0 is the adapter the test built: same seed
    assert [m.step for m in metrics] == [1, 2, 3] and all(m.kl >= 0 for m in metrics)
    full_bytes = (tiny_model / "model.safetensors").stat().st_size
    assert all(0 < p.version.delta_bytes < full_bytes / 4 for p in published[1:])
    # What the trainer published and the actor verified is the adapter: peft names + the base's hash.
    ckpts = sorted((tmp_path / "trainer-state").glob("jobs/*/checkpoints/ckpt-*"))
    saved = load_safetensors(ckpts[-1] / "model.safetensors")
    assert set(saved.arrays) == set(v0.arrays)
    assert all(".lora_A." in n or ".lora_B." in n for n in saved.arrays if n != "rollart.base_hash")
    assert saved.arrays["rollart.base_hash"].tobytes() == model_dir_digest(tiny_model)
    last = load_safetensors(ckpts[-1] / "published.safetensors")
    assert set(last.arrays) == set(v0.arrays) and last.dtypes == v0.dtypes
    moved = [n for n in v0.arrays if ".lora_B." in n and np.any(last.arrays[n] != 0)]
    assert moved  # the adapter trained


async def test_lora_trainer_sigkill_resumes_from_the_adapter_checkpoint(
    services,
    redis_url,
    tmp_path,
    tiny_model,  # noqa: F811
):
    cluster = Cluster(services, redis_url, tmp_path)
    cluster.start_trainer()
    spec = cluster.spec(tiny_model, max_steps=4, lora=LORA, grpo={"learning_rate": 5e-3})
    job, _, metrics, _, _ = await run_job(
        cluster, tiny_model, spec, kill_after_step=2, initial=initial_adapter(tiny_model)
    )
    assert job.state == trainer_pb2.TRAINER_JOB_STATE_COMPLETED and job.steps_completed == 4
    assert job.HasField("resumed_from") and job.resumed_from.step >= 2
    assert [m.step for m in metrics] == [1, 2, 3, 4]
    # run_job checked every version 0..4 is registered once and the actor verified each hash along the chain.
