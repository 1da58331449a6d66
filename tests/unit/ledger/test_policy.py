"""The job policy: defaults, validation, and the numbers the Lua scripts read."""

from __future__ import annotations

import pytest
from google.protobuf.duration_pb2 import Duration

from rollart.v1 import common_pb2
from rollart.v1 import ledger_pb2 as lp
from rollart_ledger import policy as pol


def test_defaults_are_filled_and_zero_means_default():
    p = pol.fill(lp.JobPolicy(job_id="job-1", alpha=2), "")
    assert p.admission == common_pb2.ADMISSION_POLICY_BOUNDED and p.alpha == 2 and p.redundancy == 0
    assert p.group_size == 8 and p.lease_ttl_multiplier == 2.5 and p.max_lease_attempts == 5
    assert p.tau_ema_weight == 0.3 and p.tau_decay == 0.5 and p.initial_tau == 1000
    assert p.initial_lease_ttl.seconds == 300 and p.min_lease_ttl.seconds == 5 and p.max_lease_ttl.seconds == 3600
    f = pol.fields(p)
    assert f["alpha"] == 2 and f["ttl0"] == 300_000 and f["adm"] == common_pb2.ADMISSION_POLICY_BOUNDED


@pytest.mark.parametrize(
    "bad, word",
    [
        (lp.JobPolicy(job_id="Bad Job"), "job_id"),
        (lp.JobPolicy(job_id="j", alpha=-1), "alpha"),
        (lp.JobPolicy(job_id="j", group_size=5000), "group_size"),
        (lp.JobPolicy(job_id="j", lease_ttl_multiplier=4.0), "lease_ttl_multiplier"),
        (lp.JobPolicy(job_id="j", lease_ttl_multiplier=1.5), "lease_ttl_multiplier"),
        (lp.JobPolicy(job_id="j", tau_ema_weight=1.5), "tau_ema_weight"),
        (lp.JobPolicy(job_id="j", tau_decay=float("nan")), "tau_decay"),
        (lp.JobPolicy(job_id="j", admission=7), "admission"),
        (lp.JobPolicy(job_id="j", min_lease_ttl=Duration(seconds=10), max_lease_ttl=Duration(seconds=5)), "min_lease_ttl"),
        (lp.JobPolicy(job_id="j", actor_timeout=Duration(seconds=-1)), "actor_timeout"),
        (lp.JobPolicy(job_id="j", buffer_capacity=-3), "buffer_capacity"),
    ],
)
def test_invalid_policies_name_the_field(bad, word):
    with pytest.raises(pol.PolicyError, match=word):
        pol.fill(bad, "")


def test_derived_capacity_is_alpha_plus_one_times_concurrency():
    f = pol.fields(pol.fill(lp.JobPolicy(job_id="j", alpha=2, group_size=4), ""))
    assert pol.derived_capacity(f, holders=32, batch=16, group=4) == 96
    assert pol.derived_capacity(f, holders=0, batch=0, group=4) == 12
    f["cap"] = 50
    assert pol.derived_capacity(f, holders=32, batch=16, group=4) == 50


def test_derived_capacity_follows_the_window_once_planned():
    f = pol.fields(pol.fill(lp.JobPolicy(job_id="j", alpha=2, group_size=4), ""))
    # Planned, no batch formed for the planned step (synchronous): alpha + 1 batches can take the work.
    assert pol.derived_capacity(f, holders=32, batch=16, group=4, ahead=0) == 48
    # The planned step's batch formed (asynchronous): alpha batches; one more formed: alpha - 1.
    assert pol.derived_capacity(f, holders=32, batch=16, group=4, ahead=1) == 32
    assert pol.derived_capacity(f, holders=32, batch=16, group=4, ahead=3) == 0  # the window is closed
    at_start = pol.fields(
        pol.fill(lp.JobPolicy(job_id="j", alpha=1, group_size=4, admission=common_pb2.ADMISSION_POLICY_AT_START), "")
    )
    assert at_start["adm"] == common_pb2.ADMISSION_POLICY_AT_START
    assert pol.derived_capacity(at_start, holders=32, batch=16, group=4, ahead=1) == 32  # (alpha + 1) * B
