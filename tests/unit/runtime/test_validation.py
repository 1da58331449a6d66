"""The validation layer: field checks name the field, never echo unbounded input, refuse NaN/inf and bad enums;
request limits walk any message."""

from __future__ import annotations

import math

import pytest
from google.protobuf.duration_pb2 import Duration

from rollart.runtime import errors
from rollart.runtime import validation as v
from rollart.v1 import common_pb2
from rollart.v1 import ledger_pb2 as lp
from rollart.v1 import resource_manager_pb2 as rm


def invalid(fn, *args, **kw) -> errors.InvalidArgument:
    with pytest.raises(errors.InvalidArgument) as exc:
        fn(*args, **kw)
    assert len(exc.value.details()) < 400
    return exc.value


def test_integer_and_number_ranges():
    assert v.integer("n", 5, 1, 10) == 5
    assert invalid(v.integer, "n", 2**63 - 1, 1, 10).field == "n"
    assert v.number("lr", 1e-4, 0, 1, lo_open=True) == 1e-4
    for bad in (math.nan, math.inf, -math.inf, 0.0, 2.0):
        e = invalid(v.number, "spec.lr", bad, 0, 1, lo_open=True)
        assert e.field == "spec.lr" and e.details().startswith("spec.lr:")


def test_durations():
    assert v.duration("t", Duration(seconds=2, nanos=500_000_000), max_seconds=10) == 2.5
    for bad in (Duration(seconds=2**63 - 1), Duration(nanos=-5), Duration(seconds=-1), Duration(seconds=11)):
        assert invalid(v.duration, "idle_timeout", bad, max_seconds=10).field == "idle_timeout"
    assert invalid(v.duration, "t", Duration(), required=True).field == "t"


def test_text_ids_and_enums_do_not_echo_huge_values():
    huge = "x" * (1 << 20)
    for fn in (v.ident, v.name):
        e = invalid(fn, "pool.name", huge)
        assert e.field == "pool.name" and len(e.details()) < 400
    assert invalid(v.text, "note", huge, 100).field == "note"
    assert v.enum("kind", common_pb2.POOL_KIND_CPU, common_pb2.PoolKind) == common_pb2.POOL_KIND_CPU
    assert "POOL_KIND_CPU" in invalid(v.enum, "kind", 999, common_pb2.PoolKind).details()
    assert invalid(v.enum, "kind", 0, common_pb2.PoolKind).field == "kind"
    assert v.enum("kind", 0, common_pb2.PoolKind, required=False) == 0
    assert invalid(v.items, "xs", [1, 2, 3], 2).field == "xs"
    assert invalid(v.mapping, "labels", {"k": huge}, 10).field.startswith("labels[")


def test_request_limits_walk_nested_fields_maps_and_lists():
    ok = rm.RegisterWorkerRequest(worker=rm.Worker(worker_id="w", labels={"a": "b"}))
    v.check_limits(ok)
    e = invalid(v.check_limits, rm.SetPoolStateRequest(name="n" * (1 << 20)))
    assert e.field == "name"
    e = invalid(v.check_limits, rm.RegisterWorkerRequest(worker=rm.Worker(labels={f"k{i}": "v" for i in range(1001)})))
    assert e.field == "worker.labels"
    many = lp.AddPromptsRequest(prompts=[lp.Prompt(prompt_id="p")] * 3)
    assert invalid(v.check_limits, many, v.Limits(max_messages=2)).field == "prompts"
    long_task = lp.AddPromptsRequest(prompts=[lp.Prompt(prompt_id="p", task="t" * 70_000)])
    assert invalid(v.check_limits, long_task).field == "prompts[0].task"
    v.check_limits(long_task, v.limits(fields={"rollart.v1.Prompt.task": 100_000}))
    # Documents (prompt text, conversations) are bounded by the receive limit, not the string limit.
    v.check_limits(lp.AddPromptsRequest(prompts=[lp.Prompt(prompt_id="p", text="t" * 70_000)]))
    assert invalid(v.check_limits, lp.CancelLeasesRequest(lease_ids=["L" * 300])).field == "lease_ids[0]"
