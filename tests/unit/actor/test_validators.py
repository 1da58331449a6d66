"""The actor's request checks (rollart_actor.validators): the same messages, the field named, and path strings
refused before the file system or a checkpoint store sees them."""

from __future__ import annotations

import pytest

from rollart.runtime import errors
from rollart.v1 import actor_pb2, common_pb2
from rollart_actor import validators


def details(exc: errors.ServiceError) -> str:
    return errors.status_of(exc)[1]


def test_generate_checks_keep_their_messages():
    ok = actor_pb2.ActorGenerateRequest(request_id="r1", sampling=common_pb2.SamplingParams(max_tokens=4))
    assert validators.generate(ok, priority_scheduling=False) == (1.0, -1, 1.0)
    cases = [
        (actor_pb2.ActorGenerateRequest(sampling=common_pb2.SamplingParams(max_tokens=4)), "request_id is required"),
        (actor_pb2.ActorGenerateRequest(request_id="r"), "sampling.max_tokens must be > 0"),
        (actor_pb2.ActorGenerateRequest(request_id="r", priority=3, sampling=common_pb2.SamplingParams(max_tokens=4)),
         "priority needs scheduling_policy: priority on this actor"),
        (actor_pb2.ActorGenerateRequest(request_id="r", kv_transfer_params_json="{}",
                                        sampling=common_pb2.SamplingParams(max_tokens=4)),
         "kv_transfer_params_json is only for PD_PHASE_DECODE"),
    ]
    for request, message in cases:
        with pytest.raises(errors.InvalidArgument) as info:
            validators.generate(request, priority_scheduling=False)
        assert details(info.value) == message


@pytest.mark.parametrize("uri", ["\u202e🧪" * 400, "/ckpt/v1\x00", "/ckpt/" + "x" * 300])
def test_checkpoint_paths_are_refused_naming_the_field(uri):
    with pytest.raises(errors.InvalidArgument) as info:
        validators.load_checkpoint(actor_pb2.LoadCheckpointRequest(uri=uri, version=1))
    assert info.value.field == "uri"
    with pytest.raises(errors.InvalidArgument) as info:
        validators.weight_source(actor_pb2.WeightSource(checkpoint_store=uri))
    assert info.value.field == "source.checkpoint_store"


def test_pause_and_commit():
    assert validators.pause(actor_pb2.ActorPauseRequest()) is None
    with pytest.raises(errors.InvalidArgument, match="unknown pause mode 77"):
        validators.pause(actor_pb2.ActorPauseRequest(mode=77))
    with pytest.raises(errors.InvalidArgument, match="order.hash must be 32 bytes"):
        validators.commit(actor_pb2.ActorCommitRequest(order=common_pb2.CommitOrder(version=1, hash=b"x")))


def test_domain_errors_are_coded():
    from rollart_actor.engine import EngineError
    from rollart_actor.weights import WeightError

    for cls in (EngineError, WeightError):
        exc = cls("FAILED_PRECONDITION", "based on v1")
        assert exc.code == "FAILED_PRECONDITION" and str(exc) == "based on v1"
        assert errors.status_of(exc)[1] == "based on v1"
