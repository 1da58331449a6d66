"""Conversions between the ledger's Redis records and rollart.v1 messages."""

from __future__ import annotations

from typing import Any, cast

from rollart.runtime import timeutil
from rollart.v1 import common_pb2
from rollart.v1 import ledger_pb2 as lp

HOLDER = lp.SUBSCRIBER_KIND_HOLDER


# The records keep epoch/duration milliseconds; the conversions are rollart.runtime.timeutil's.
ts_ms = timeutil.timestamp_ms
dur_ms = timeutil.duration_ms
ms_of = timeutil.milliseconds


def text(b: Any) -> str:
    return b.decode() if isinstance(b, bytes) else str(b)


def hdict(flat: list | dict) -> dict[str, bytes]:
    """HGETALL as a dict with str keys (flat arrays come back from Lua)."""
    if isinstance(flat, dict):
        return {text(k): v for k, v in flat.items()}
    return {text(flat[i]): flat[i + 1] for i in range(0, len(flat), 2)}


def num(h: dict[str, bytes], key: str, default: float = 0) -> float:
    v = h.get(key)
    return float(v) if v not in (None, b"") else default


def lease_from_row(row: list) -> lp.Lease:
    """A lease from a script's row: [HGETALL of the lease, prompt blob, h(v_j)]."""
    flat, prompt, vhash = row
    return lease_from(hdict(flat), prompt or b"", vhash or b"")


def lease_from(h: dict[str, bytes], prompt: bytes, vhash: bytes) -> lp.Lease:
    lease = lp.Lease(
        lease_id=text(h["id"]),
        group_id=text(h["gid"]),
        sample_index=int(h["idx"]),
        version=int(h["ver"]),
        version_hash=vhash,
        holder=text(h["holder"]),
        issued_at=ts_ms(num(h, "iss")),
        expires_at=ts_ms(num(h, "exp")),
        state=cast(lp.LeaseState, int(h["st"])),
        attempt=int(num(h, "att")),
        assigned_actor_id=text(h.get("as", b"")),
        step=int(num(h, "step")),
        trajectory_id=text(h.get("traj", b"")),
        rejection=cast(lp.RejectionReason, int(num(h, "rej"))),
        cancel_reason=cast(lp.CancelReason, int(num(h, "can"))),
        release_reason=cast(lp.ReleaseReason, int(num(h, "rel"))),
    )
    if prompt:
        lease.prompt.ParseFromString(prompt)
    if h.get("end"):
        lease.ended_at.CopyFrom(ts_ms(num(h, "end")))
    return lease


def actor_from(h: dict[str, bytes], now_ms: float, timeout_ms: float) -> lp.LedgerActor:
    a = lp.LedgerActor.FromString(h.get("info", b""))
    if h.get("w"):
        a.weights.ParseFromString(h["w"])
    a.tau = num(h, "tau")
    live = cast(lp.ActorLiveness, int(num(h, "live")))
    hb = num(h, "hb")
    # Judged on read too, so an actor past its timeout shows as dead before the reaper runs.
    if live in (lp.ACTOR_LIVENESS_ALIVE, lp.ACTOR_LIVENESS_DRAINING) and hb + timeout_ms < now_ms:
        live = lp.ACTOR_LIVENESS_DEAD
    a.liveness = live
    a.registered_at.CopyFrom(ts_ms(num(h, "reg")))
    a.last_heartbeat.CopyFrom(ts_ms(hb))
    a.in_flight_requests = int(num(h, "infl"))
    a.settled_tokens = int(num(h, "tok"))
    a.excluded_steps = int(num(h, "excl"))
    a.relay_id = text(h.get("relay", b""))
    return a


def actor_info(actor: lp.LedgerActor) -> bytes:
    """The part of an actor the actor itself declares (the ledger owns the rest)."""
    info = lp.LedgerActor()
    info.CopyFrom(actor)
    for f in ("weights", "registered_at", "last_heartbeat"):
        info.ClearField(f)
    info.tau = 0
    info.liveness = lp.ACTOR_LIVENESS_UNSPECIFIED
    info.in_flight_requests = 0
    info.settled_tokens = 0
    info.excluded_steps = 0
    return info.SerializeToString()


def command_from(entry_id: bytes | str, fields: dict[bytes, bytes]) -> lp.LedgerCommand:
    seq = int(text(entry_id).split("-", 1)[0])
    if b"c" in fields:
        cmd = lp.LedgerCommand.FromString(fields[b"c"])
    else:  # compact form the Lua scripts write for lease cancellations
        ids = text(fields.get(b"ids", b""))
        cmd = lp.LedgerCommand(
            cancel_leases=lp.CancelLeasesCommand(
                lease_ids=[i for i in ids.split(",") if i],
                reason=cast(lp.CancelReason, int(fields.get(b"r", b"0"))),
            )
        )
    cmd.sequence = seq
    cmd.issued_at.CopyFrom(ts_ms(float(fields.get(b"ts", b"0"))))
    cmd.target = text(fields.get(b"t", b""))
    del cmd.kinds[:]
    cmd.kinds.extend(cast(lp.SubscriberKind, int(x)) for x in text(fields.get(b"k", b"")).split(",") if x)
    cmd.ack_required = fields.get(b"a") == b"1"
    return cmd


def addressed(target: str, kinds: list[int] | tuple[int, ...], subscriber: str, kind: int) -> bool:
    """Whether a command reaches a subscriber: its own, its loops' (holders), or a broadcast to its kind."""
    if target:
        return target == subscriber or (kind == HOLDER and target.startswith(subscriber + "/"))
    return not kinds or kind in kinds


def turn_versions(trajectory: common_pb2.Trajectory) -> tuple[set[int], str | None]:
    """Distinct versions of the trajectory's action tokens, or an error naming the malformed turn."""
    versions: set[int] = set()
    for i, turn in enumerate(trajectory.turns):
        if len(turn.action_versions) != len(turn.action_token_ids):
            return versions, (
                f"trajectory.turns[{i}] has {len(turn.action_token_ids)} action tokens but "
                f"{len(turn.action_versions)} action_versions"
            )
        if turn.action_versions:
            vs = set(turn.action_versions)
            if min(vs) < 0:
                return versions, f"trajectory.turns[{i}].action_versions has a negative version"
            versions |= vs
    return versions, None


FATES = ("trained", "evicted", "cancelled", "rejected", "failed", "filtered")


def accounting(stats: dict[str, int]) -> common_pb2.GenerationAccounting:
    """The generation accounting from the ledger's ``stats`` hash (fields ``gen:<fate>:n`` and ``gen:<fate>:t``)."""
    out = common_pb2.GenerationAccounting()
    for fate in FATES:
        getattr(out, fate).samples = int(stats.get(f"gen:{fate}:n", 0))
        getattr(out, fate).tokens = int(stats.get(f"gen:{fate}:t", 0))
    generated = sum(getattr(out, f).tokens for f in FATES)
    out.wasted_token_fraction = (generated - out.trained.tokens) / generated if generated > 0 else 0.0
    return out
