"""Latency injection: spec parsing, the distributions' moments, clipping, seeded streams, the proto form."""

import statistics

import pytest
from google.protobuf.duration_pb2 import Duration

from rollart.v1 import envmanager_pb2
from rollart_envmanager.latency import LatencySpec


def draws(spec: LatencySpec, n: int = 4000, stream: int = 0) -> list[float]:
    s = spec.sampler(stream)
    return [s.sample() for _ in range(n)]


def test_parse_forms():
    assert LatencySpec.parse("none").kind == "none"
    assert LatencySpec.parse("fixed(0.25)") == LatencySpec("constant", mean=0.25)
    assert LatencySpec.parse("normal(0.5, 0.1)") == LatencySpec("normal", mean=0.5, stddev=0.1)
    assert LatencySpec.parse("uniform(0.1, 0.3)") == LatencySpec("uniform", low=0.1, high=0.3)
    spec = LatencySpec.parse("lognormal(1.0, 0.5) clip(0.2, 3)")
    assert (spec.kind, spec.mean, spec.stddev, spec.low, spec.high) == ("lognormal", 1.0, 0.5, 0.2, 3.0)
    assert LatencySpec.parse("exponential(0.2)").kind == "exponential"


@pytest.mark.parametrize("bad", ["normal(1)", "gamma(1, 2)", "uniform(0.3, 0.1)", "fixed(-1)", "normal(a, b)",
                                 "lognormal(0, 1)", "fixed(nan)", "((("])
def test_parse_rejects(bad):
    with pytest.raises(ValueError):
        LatencySpec.parse(bad)


def test_constant_and_none():
    assert set(draws(LatencySpec.parse("fixed(0.3)"), 50)) == {0.3}
    assert set(draws(LatencySpec(), 50)) == {0.0}


def test_normal_moments_and_clipping_at_zero():
    xs = draws(LatencySpec("normal", mean=1.0, stddev=0.2, seed=1))
    assert abs(statistics.mean(xs) - 1.0) < 0.02
    assert abs(statistics.stdev(xs) - 0.2) < 0.02
    wide = draws(LatencySpec("normal", mean=0.1, stddev=1.0, seed=2))
    assert min(wide) == 0.0 and sum(x == 0.0 for x in wide) > 1000  # about half is clipped to 0


def test_lognormal_matches_mean_and_stddev_of_the_latency():
    xs = draws(LatencySpec("lognormal", mean=0.5, stddev=0.25, seed=3), 20000)
    assert abs(statistics.mean(xs) - 0.5) < 0.02
    assert abs(statistics.stdev(xs) - 0.25) < 0.03
    assert min(xs) > 0


def test_uniform_bounds_and_upper_clamp():
    xs = draws(LatencySpec("uniform", low=0.2, high=0.4, seed=4))
    assert 0.2 <= min(xs) and max(xs) <= 0.4
    assert abs(statistics.mean(xs) - 0.3) < 0.01
    clamped = draws(LatencySpec("exponential", mean=1.0, high=0.5, seed=5))
    assert max(clamped) == 0.5


def test_seeded_streams_are_reproducible_and_distinct():
    spec = LatencySpec("normal", mean=1.0, stddev=0.5, seed=42)
    assert draws(spec, 20, stream=3) == draws(spec, 20, stream=3)
    assert draws(spec, 20, stream=3) != draws(spec, 20, stream=4)


def test_from_proto():
    msg = envmanager_pb2.LatencyDistribution(
        kind=envmanager_pb2.DISTRIBUTION_KIND_NORMAL, mean=Duration(nanos=500_000_000),
        stddev=Duration(nanos=100_000_000), max=Duration(seconds=2), seed=9,
    )
    spec = LatencySpec.from_proto(msg)
    assert (spec.kind, spec.mean, spec.stddev, spec.high, spec.seed) == ("normal", 0.5, 0.1, 2.0, 9)
    assert LatencySpec.from_proto(envmanager_pb2.LatencyDistribution()).kind == "none"
