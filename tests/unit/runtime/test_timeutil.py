"""rollart.runtime.timeutil: protobuf Timestamp/Duration helpers."""

from __future__ import annotations

import datetime as dt
import time

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration

from rollart.runtime import errors, timeutil


def test_timestamp_round_trips_seconds_and_datetimes():
    ts = timeutil.timestamp(1_700_000_000.25)
    assert (ts.seconds, ts.nanos) == (1_700_000_000, 250_000_000)
    assert timeutil.seconds(ts) == 1_700_000_000.25
    when = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
    assert timeutil.datetime_of(timeutil.timestamp(when)) == when
    # A naive datetime is UTC.
    assert timeutil.timestamp(when.replace(tzinfo=None)) == timeutil.timestamp(when)
    assert timeutil.milliseconds(timeutil.timestamp_ms(1234)) == 1234.0


def test_now_is_the_wall_clock():
    before = time.time()
    got = timeutil.seconds(timeutil.now())
    assert before - 1 <= got <= time.time() + 1
    assert abs(timeutil.seconds(timeutil.timestamp()) - time.time()) < 1


def test_duration_clamps_negatives_and_refuses_the_unrepresentable():
    assert timeutil.seconds(timeutil.duration(1.5)) == 1.5
    assert timeutil.duration(-3) == Duration()
    assert timeutil.milliseconds(timeutil.duration_ms(250)) == 250.0
    assert timeutil.duration_ms(1234.9) == Duration(seconds=1, nanos=234_000_000)  # whole milliseconds
    assert timeutil.duration_ms(-5) == Duration()
    for bad in (float("nan"), float("inf"), 1e18):
        with pytest.raises(errors.InvalidArgument) as info:
            timeutil.duration(bad, field="ttl")
        assert info.value.field == "ttl"


def test_checked_duration_names_the_field():
    assert timeutil.checked_duration("wait", Duration(seconds=2, nanos=500_000_000)) == 2.5
    assert timeutil.checked_duration("wait", Duration()) == 0.0
    cases = [
        (Duration(seconds=-1), "must not be negative"),
        (Duration(nanos=-5), "must not be negative"),
        (Duration(seconds=1, nanos=1_000_000_000), "is not a valid duration"),
        (Duration(seconds=timeutil.MAX_DURATION_S + 1), "is not a valid duration"),
    ]
    for d, why in cases:
        with pytest.raises(errors.InvalidArgument) as info:
            timeutil.checked_duration("policy.lease_ttl", d)
        code, details, _ = errors.status_of(info.value)
        assert code == grpc.StatusCode.INVALID_ARGUMENT
        assert details == f"policy.lease_ttl: {why}"
    with pytest.raises(errors.InvalidArgument, match="at most 60 s"):
        timeutil.checked_duration("wait", Duration(seconds=61), max_seconds=60)
