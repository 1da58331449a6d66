"""Bad and unauthorised requests to a real trainer process: every RPC (unary and streaming) refuses a missing or
wrong token, malformed bytes are INVALID_ARGUMENT, bad job specs get a clear error naming what is wrong, and none
of it starts a job or changes what the trainer reports.
"""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from rollart.job.spec import job_spec
from rollart.runtime.auth import bearer
from rollart.v1 import trainer_pb2 as T
from rollart.v1 import trainer_pb2_grpc
from tests.conftest import BIN, TOKEN

pytest.importorskip("torch")

JOB = "req-job"
KEY = "test-segment-key-0123456789abcdef"
MD = [bearer(TOKEN)]


@pytest.fixture
def trainer(services, tmp_path: Path):
    _, info = services.start(
        "trainer",
        [str(BIN / "rollart-trainer")],
        timeout=90,
        ROLLART_JOB_ID=JOB,
        ROLLART_JOB_KEY=KEY,
        ROLLART_WORK_DIR=str(tmp_path / "trainer-state"),
        ROLLART_TORCH_THREADS="1",
    )
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")  # a local checkpoint directory, as far as StartJob checks
    ch = grpc.insecure_channel(info["address"])
    yield trainer_pb2_grpc.TrainerStub(ch), ch, tmp_path
    ch.close()


def code_of(fn, req, **kw) -> grpc.StatusCode | None:
    try:
        out = fn(req, **kw)
        if hasattr(out, "__iter__") and not hasattr(out, "ListFields"):
            for _ in out:  # a stream: the status comes with its first read
                pass
    except grpc.RpcError as exc:
        return exc.code()
    return None


def spec(tmp: Path, **kw) -> T.TrainerJobSpec:
    d = {
        "job_id": JOB,
        "model": str(tmp / "model"),
        "batch_size": 8,
        "group_size": 4,
        "max_steps": 2,
        "endpoints": {"ledger": "127.0.0.1:1"},
    }
    d.update(kw)
    return job_spec(d)


def test_every_rpc_needs_the_job_token(trainer):
    stub, _, tmp = trainer
    calls = [
        (stub.StartJob, T.StartJobRequest(spec=spec(tmp))),
        (stub.StopJob, T.StopJobRequest(job_id=JOB)),
        (stub.GetJob, T.GetTrainerJobRequest()),
        (stub.WatchJob, T.WatchTrainerJobRequest()),
        (stub.GetCurrentVersion, T.GetCurrentVersionRequest()),
        (stub.ListPublishedVersions, T.ListPublishedVersionsRequest()),
        (stub.GetStepMetrics, T.GetStepMetricsRequest()),
        (stub.SaveCheckpoint, T.SaveCheckpointRequest()),
        (stub.ListCheckpoints, T.ListCheckpointsRequest()),
    ]
    for fn, req in calls:
        assert code_of(fn, req, timeout=5) == grpc.StatusCode.UNAUTHENTICATED, fn
        assert code_of(fn, req, metadata=[bearer("wrong-token")], timeout=5) == grpc.StatusCode.UNAUTHENTICATED, fn
    # Nothing started.
    assert code_of(stub.GetJob, T.GetTrainerJobRequest(), metadata=MD, timeout=5) == grpc.StatusCode.NOT_FOUND


def test_malformed_bytes_are_invalid_argument(trainer):
    _, ch, _ = trainer
    for method in ("StartJob", "StopJob", "GetJob", "SaveCheckpoint"):
        call = ch.unary_unary(
            f"/rollart.v1.Trainer/{method}", request_serializer=lambda b: b, response_deserializer=lambda b: b
        )
        assert code_of(call, b"\xff\xff\xff\xff\x0f", metadata=MD, timeout=5) == grpc.StatusCode.INVALID_ARGUMENT


@pytest.mark.parametrize(
    "kw, code, says",
    [
        ({"model": ""}, grpc.StatusCode.INVALID_ARGUMENT, "model"),
        ({"batch_size": 10}, grpc.StatusCode.INVALID_ARGUMENT, "multiple of group_size"),
        ({"group_size": 0}, grpc.StatusCode.INVALID_ARGUMENT, "group_size"),
        ({"alpha": -1}, grpc.StatusCode.INVALID_ARGUMENT, "alpha"),
        ({"publish": {"weight_sync": "full_checkpoint"}}, grpc.StatusCode.INVALID_ARGUMENT, "checkpoint_store"),
        ({"job_id": "someone-else"}, grpc.StatusCode.FAILED_PRECONDITION, "someone-else"),
        ({"endpoints": {}}, grpc.StatusCode.INVALID_ARGUMENT, "ledger"),
        ({"model": "/nonexistent/model"}, grpc.StatusCode.INVALID_ARGUMENT, "not a checkpoint directory"),
    ],
)
def test_bad_specs_are_refused_without_starting_a_job(trainer, kw, code, says):
    stub, _, tmp = trainer
    with pytest.raises(grpc.RpcError) as exc:
        stub.StartJob(T.StartJobRequest(spec=spec(tmp, **kw)), metadata=MD, timeout=10)
    assert exc.value.code() == code, exc.value.details()
    assert says in exc.value.details()
    assert code_of(stub.GetJob, T.GetTrainerJobRequest(), metadata=MD, timeout=5) == grpc.StatusCode.NOT_FOUND
    assert not (tmp / "trainer-state" / "job.json").exists()  # a restart would not resume it either


def test_requests_before_any_job_say_so(trainer):
    stub, _, _ = trainer
    for fn, req in [
        (stub.StopJob, T.StopJobRequest(job_id=JOB)),
        (stub.WatchJob, T.WatchTrainerJobRequest()),
        (stub.GetCurrentVersion, T.GetCurrentVersionRequest()),
        (stub.ListPublishedVersions, T.ListPublishedVersionsRequest()),
        (stub.SaveCheckpoint, T.SaveCheckpointRequest()),
    ]:
        assert code_of(fn, req, metadata=MD, timeout=5) == grpc.StatusCode.NOT_FOUND, fn


NEVER_RUN = [
    # (spec changes, the field the error must name)
    ({"device": "fz-1"}, "spec.device"),
    ({"backend": 999}, "spec.backend"),
    ({"backend": "megatron"}, "spec.model"),  # config.json {} is no model the Megatron converter knows
    ({"parallel": {"tensor_parallel_size": 2}}, "spec.parallel.tensor_parallel_size"),  # torch splits nothing
    ({"mode": 77}, "spec.mode"),
    ({"admission": -3}, "spec.admission"),
    ({"grpo": {"learning_rate": float("inf")}}, "spec.grpo.learning_rate"),
    ({"grpo": {"learning_rate": float("nan")}}, "spec.grpo.learning_rate"),
    ({"grpo": {"learning_rate": -1e-4}}, "spec.grpo.learning_rate"),
    ({"grpo": {"clip_eps_low": 1.5}}, "spec.grpo.clip_eps_low"),
    ({"grpo": {"max_grad_norm": float("nan")}}, "spec.grpo.max_grad_norm"),
    ({"grpo": {"epochs_per_batch": -2}}, "spec.grpo.epochs_per_batch"),
    ({"options": {"grpo.temperature": "hot"}}, "spec.grpo"),
    ({"model": "m" * 1_000_000}, "spec.model"),
    ({"model": "not a model name"}, "spec.model"),
    ({"batch_size": 2**31 - 1}, "spec.batch_size"),
    ({"group_size": 100_000}, "spec.group_size"),
    ({"redundancy": -1}, "spec.redundancy"),
    ({"max_steps": 2**63 - 1}, "spec.max_steps"),
    ({"batch_timeout": {"seconds": 2**63 - 1}}, "spec.batch_timeout"),
    ({"batch_timeout": {"nanos": -5}}, "spec.batch_timeout"),
    ({"batch_timeout": {"seconds": 0}}, "spec.batch_timeout"),
    ({"publish": {"max_segment_bytes": 1 << 30}}, "spec.publish.max_segment_bytes"),
    ({"publish": {"dtype": "int3"}}, "spec.publish.dtype"),
    ({"publish": {"streams": 10_000}}, "spec.publish.streams"),
    ({"publish": {"relay_endpoints": ["no port"]}}, "spec.publish.relay_endpoints[0]"),
    ({"sampling": {"temperature": float("nan")}}, "spec.sampling.temperature"),
    ({"sampling": {"top_p": 3}}, "spec.sampling.top_p"),
    ({"endpoints": {"ledger": "x" * 5000}}, "spec.endpoints.ledger"),
    ({"prompts": {"dataset_uri": "/nonexistent/prompts.jsonl"}}, "spec.prompts.dataset_uri"),
    ({"checkpoint": {"keep_last": -1}}, "spec.checkpoint.keep_last"),
]


def test_specs_that_can_never_run_are_refused_naming_the_field(trainer):
    """The whole spec is checked before StartJob accepts it (one trainer for all the cases)."""
    stub, _, tmp = trainer
    for kw, field in NEVER_RUN:
        s = spec(tmp)
        for key, value in kw.items():
            if key == "options":
                s.options.update(value)
            elif isinstance(value, dict):
                target = getattr(s, key)
                for k, val in value.items():
                    if isinstance(val, list):
                        getattr(target, k).extend(val)
                    elif isinstance(val, dict):
                        getattr(target, k).update(val)
                    else:
                        setattr(target, k, val)
            elif key == "backend" and isinstance(value, str):
                s.backend = T.TRAINER_BACKEND_MEGATRON
            else:
                setattr(s, key, value)
        with pytest.raises(grpc.RpcError) as exc:
            stub.StartJob(T.StartJobRequest(spec=s), metadata=MD, timeout=10)
        details = exc.value.details()
        assert exc.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (kw, details)
        assert details.startswith(field), (field, details)
        assert len(details) < 1024
    assert code_of(stub.GetJob, T.GetTrainerJobRequest(), metadata=MD, timeout=5) == grpc.StatusCode.NOT_FOUND
    assert not (tmp / "trainer-state" / "job.json").exists()
