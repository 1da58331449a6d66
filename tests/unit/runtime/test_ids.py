"""rollart.runtime.ids: one id rule and one name rule."""

from __future__ import annotations

import pytest

from rollart.runtime import errors, ids

# Ids the services, tests and examples really use: all must pass.
REAL_IDS = [
    "w1",
    "actor-under-test",
    "traj-0123456789abcdef0123456789abcdef",
    "oai-0123456789abcdef",
    "env/a",  # lease holder: holder_prefix/index
    "mgr-1/group-7/3",  # loop id
    "traj-1:2:deadbeef",  # proxy-made request id
    "traj-1:2:deadbeef~r1",  # its retry
    "traj-1:2:deadbeef~prefill",
    "node-1.example.org:50051@gpu#0",
    "a+b=c",
    "x" * ids.MAX_ID_CHARS,
]
NOT_IDS = ["", "-leading-dash", "/abs", "has space", "tab\tin", "nul\x00", "é", "x" * (ids.MAX_ID_CHARS + 1), "a\nb"]


@pytest.mark.parametrize("value", REAL_IDS)
def test_real_ids_pass(value):
    assert ids.is_id(value)
    assert ids.check_id("trajectory_id", value) == value


@pytest.mark.parametrize("value", NOT_IDS)
def test_bad_ids_are_invalid_argument_naming_the_field(value):
    assert not ids.is_id(value)
    with pytest.raises(errors.InvalidArgument) as info:
        ids.check_id("worker.worker_id", value)
    assert info.value.field == "worker.worker_id"
    assert len(info.value.details()) < 400  # a long value is echoed shortened


def test_optional_and_shorter_ids():
    assert ids.check_id("request_id", "", required=False) == ""
    with pytest.raises(errors.InvalidArgument, match="is required"):
        ids.check_id("request_id", "")
    with pytest.raises(errors.InvalidArgument, match="1-150 characters"):
        ids.check_id("holder_prefix", "p" * 151, max_chars=150)
    assert ids.check_id("holder_prefix", "p" * 150, max_chars=150)


def test_names():
    for good in ("gpu", "cpu-pool.a_1", "j", "a" * ids.MAX_NAME_CHARS):
        assert ids.check_name("pool.name", good) == good
        assert ids.is_id(good)  # every name is also an id
    for bad in ("GPU", "a/b", "-x", "a" * (ids.MAX_NAME_CHARS + 1), "a b"):
        with pytest.raises(errors.InvalidArgument) as info:
            ids.check_name("pool.name", bad)
        assert info.value.field == "pool.name"
    assert ids.name_problem("ok") is None and ids.id_problem("ok") is None


def test_optional_name_allows_empty_and_names_and_refuses_the_rest_naming_the_field() -> None:
    import pytest

    from rollart.runtime.ids import optional_name

    assert optional_name("job", "") == "" and optional_name("job", "job-b") == "job-b"
    with pytest.raises(ValueError, match="^llmproxy_job_id must be"):
        optional_name("llmproxy_job_id", "a b")
