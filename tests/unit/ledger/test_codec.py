"""Command addressing and decoding."""

from __future__ import annotations

from rollart.v1 import common_pb2
from rollart.v1 import ledger_pb2 as lp
from rollart_ledger.codec import addressed, command_from, turn_versions

K = lp.SubscriberKind


def test_addressing_targets_kinds_and_holder_loops():
    assert addressed("actor-1", [], "actor-1", K.SUBSCRIBER_KIND_ACTOR)
    assert not addressed("actor-1", [], "actor-2", K.SUBSCRIBER_KIND_ACTOR)
    # One envmanager stream serves all of its loops.
    assert addressed("env-a/loop-3", [], "env-a", K.SUBSCRIBER_KIND_HOLDER)
    assert not addressed("env-ab/loop-3", [], "env-a", K.SUBSCRIBER_KIND_HOLDER)
    assert not addressed("env-a/loop-3", [], "env-a", K.SUBSCRIBER_KIND_ACTOR)
    assert addressed("", [K.SUBSCRIBER_KIND_ROUTER, K.SUBSCRIBER_KIND_TRAINER], "proxy", K.SUBSCRIBER_KIND_ROUTER)
    assert not addressed("", [K.SUBSCRIBER_KIND_ROUTER], "a1", K.SUBSCRIBER_KIND_ACTOR)
    assert addressed("", [], "anyone", K.SUBSCRIBER_KIND_RELAY)


def test_compact_cancel_and_blob_commands_decode():
    cmd = command_from(b"17-1", {b"t": b"env/1", b"k": b"3", b"a": b"0", b"ts": b"1700000000123", b"x": b"cancel",
                                 b"ids": b"L1,L2", b"r": b"1"})
    assert cmd.sequence == 17 and cmd.target == "env/1" and list(cmd.kinds) == [3] and not cmd.ack_required
    assert list(cmd.cancel_leases.lease_ids) == ["L1", "L2"] and cmd.cancel_leases.reason == lp.CANCEL_REASON_GROUP_COMPLETE
    assert cmd.issued_at.ToMilliseconds() == 1700000000123
    blob = lp.LedgerCommand(commit=common_pb2.CommitOrder(order_id="o", version=3)).SerializeToString()
    cmd = command_from("18-1", {b"t": b"a1", b"k": b"1", b"a": b"1", b"ts": b"5", b"c": blob})
    assert cmd.WhichOneof("command") == "commit" and cmd.commit.version == 3 and cmd.ack_required


def test_turn_versions_checks_parallel_arrays():
    t = common_pb2.Trajectory(turns=[common_pb2.Turn(action_token_ids=[1, 2], action_versions=[3, 4]),
                                     common_pb2.Turn(action_token_ids=[5], action_versions=[4])])
    assert turn_versions(t) == ({3, 4}, None)
    bad = common_pb2.Trajectory(turns=[common_pb2.Turn(action_token_ids=[1, 2], action_versions=[3])])
    assert "action_versions" in turn_versions(bad)[1]
