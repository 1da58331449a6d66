"""Step planning as pure functions: the proportional split and who is eligible for version v."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rollart.v1 import common_pb2
from rollart.v1 import ledger_pb2 as lp
from rollart_ledger.scheduling import ActorView, allocate, classify, order

EX = lp.ExclusionReason
H1, H2 = b"\x01" * 32, b"\x02" * 32


def test_worked_example_5000_and_2500_split_300_as_200_and_100():
    assert allocate(300, {"fast": 5000.0, "slow": 2500.0}) == {"fast": 200, "slow": 100}


def test_remainder_goes_to_the_fastest():
    # floor(7 * 1/3) = 2, floor(7 * 2/3) = 4: one request left, and it goes to y (the faster).
    assert allocate(7, {"x": 1.0, "y": 2.0}) == {"x": 2, "y": 5}
    # Equal tau: the tie goes to the smaller id, so a plan is deterministic.
    assert allocate(10, {"b": 3.0, "a": 3.0, "c": 3.0}) == {"a": 4, "b": 3, "c": 3}
    assert order({"a": 4, "b": 3, "c": 3}, {"a": 3.0, "b": 3.0, "c": 3.0}) == ["a", "b", "c"]


def test_zero_total_tau_splits_evenly_and_empty_is_empty():
    assert allocate(5, {"a": 0.0, "b": 0.0}) == {"a": 3, "b": 2}
    assert allocate(5, {}) == {}


@settings(max_examples=200, deadline=None)
@given(
    batch=st.integers(min_value=1, max_value=100_000),
    taus=st.dictionaries(
        st.text(alphabet="abcdefgh", min_size=1, max_size=3),
        st.floats(min_value=0.0, max_value=1e7, allow_nan=False),
        min_size=1,
        max_size=12,
    ),
)
def test_allocation_always_sums_to_b_and_is_proportional(batch, taus):
    out = allocate(batch, taus)
    assert sum(out.values()) == batch and set(out) == set(taus)
    total = sum(taus.values())
    if total > 0:
        fastest = min(taus, key=lambda a: (-taus[a], a))
        for a, n in out.items():
            exact = batch * taus[a] / total
            assert n >= int(exact) - 1  # floor (up to float error)
            if a != fastest:
                assert n <= exact + 1e-6  # only the fastest gets more than its share


def view(active=1, staged=(), alive=True, draining=False, loaded=True, complete=True, digest=H2, error=""):
    w = common_pb2.ActorWeightState(
        loaded=loaded,
        active_version=active,
        staged=[common_pb2.StagedWeights(version=s, base_version=s - 1, hash=digest, complete=complete, error=error) for s in staged],
    )
    return ActorView("a", 100.0, alive, draining, w)


@pytest.mark.parametrize(
    "actor, expected",
    [
        (view(active=2), (None, False)),
        (view(active=1, staged=(2,)), (None, True)),
        (view(active=1, staged=(2,), complete=False), (EX.EXCLUSION_REASON_DELTA_NOT_STAGED, False)),
        (view(active=1, staged=(2,), error="bad hmac"), (EX.EXCLUSION_REASON_DELTA_NOT_STAGED, False)),
        (view(active=1, staged=(2,), digest=H1), (EX.EXCLUSION_REASON_DELTA_NOT_STAGED, False)),
        (view(active=1), (EX.EXCLUSION_REASON_DELTA_NOT_STAGED, False)),
        (view(active=0, staged=(1, 2)), (EX.EXCLUSION_REASON_WRONG_VERSION, False)),
        (view(active=3), (EX.EXCLUSION_REASON_WRONG_VERSION, False)),
        (view(active=2, loaded=False), (EX.EXCLUSION_REASON_WRONG_VERSION, False)),
        (view(active=2, alive=False), (EX.EXCLUSION_REASON_DEAD, False)),
        (view(active=2, draining=True), (EX.EXCLUSION_REASON_DRAINING, False)),
    ],
)
def test_eligibility_on_v_or_on_v_minus_1_with_d_v_staged(actor, expected):
    assert classify(actor, 2, H2) == expected
