"""The job policy: defaults, validation, and the flat fields the Lua scripts read."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import cast

from google.protobuf.duration_pb2 import Duration

from rollart.runtime import timeutil
from rollart.v1 import common_pb2
from rollart.v1 import ledger_pb2 as lp

from .config import JOB_RE

BOUNDED = common_pb2.ADMISSION_POLICY_BOUNDED
STRICT = common_pb2.ADMISSION_POLICY_STRICT
AT_START = common_pb2.ADMISSION_POLICY_AT_START

# Defaults, in the units the scripts use (ms for durations). The single source for Python and Lua.
DEFAULTS: dict[str, float] = {
    "adm": float(BOUNDED),
    "alpha": 0.0,
    "G": 8.0,
    "R": 0.0,
    "mult": 2.5,
    "ttl0": 300_000.0,
    "tmin": 5_000.0,
    "tmax": 3_600_000.0,
    "maxatt": 5.0,
    "tout": 15_000.0,
    "w": 0.3,
    "decay": 0.5,
    "tau0": 1000.0,
    "cap": 0.0,
    "ret": 3_600_000.0,
    "unif": 0.0,  # 1: the batch split evenly over eligible actors (uniform_allocation), not by tau
    "nts": 0.0,  # tasks with a share (multi-task jobs); their shares are the fields ts:<task>
}
MAX_TASKS = 64
MAX_TASK_TAG = 128
MAX_ALPHA = 1000
MAX_GROUP = 4096
MAX_CAPACITY = 10_000_000
MAX_DURATION_S = 7 * 24 * 3600


class PolicyError(ValueError):
    """An invalid policy field; the message names it."""


def _dur(seconds_ms: float) -> Duration:
    return timeutil.duration_ms(seconds_ms)


def _ms(d: Duration) -> float:
    return timeutil.milliseconds(d)


def _check_duration(name: str, d: Duration) -> None:
    if d.seconds < 0 or d.nanos < 0 or d.nanos >= 1_000_000_000:
        raise PolicyError(f"{name} must be a non-negative duration")
    if d.seconds > MAX_DURATION_S:
        raise PolicyError(f"{name} must be at most {MAX_DURATION_S} s")


def _check_fraction(name: str, x: float) -> None:
    if math.isnan(x) or x < 0 or x > 1:
        raise PolicyError(f"{name} must be within (0, 1] (0: the default), got {x}")


def fill(policy: lp.JobPolicy, job_id: str) -> lp.JobPolicy:
    """Validate ``policy`` and return a copy with every default filled in."""
    p = lp.JobPolicy()
    p.CopyFrom(policy)
    if not JOB_RE.match(p.job_id or job_id or ""):
        raise PolicyError(f"policy.job_id must match {JOB_RE.pattern}, got {p.job_id!r}")
    p.job_id = p.job_id or job_id
    if p.admission not in (0, STRICT, BOUNDED, AT_START):
        raise PolicyError(f"policy.admission {p.admission} is not an AdmissionPolicy")
    if not 0 <= p.alpha <= MAX_ALPHA:
        raise PolicyError(f"policy.alpha must be within [0, {MAX_ALPHA}], got {p.alpha}")
    if not 0 <= p.group_size <= MAX_GROUP:
        raise PolicyError(
            f"policy.group_size must be within [1, {MAX_GROUP}] (0: default 8), got {p.group_size}"
        )
    if not 0 <= p.redundancy <= MAX_GROUP:
        raise PolicyError(f"policy.redundancy must be within [0, {MAX_GROUP}], got {p.redundancy}")
    m = p.lease_ttl_multiplier
    if math.isnan(m) or (m != 0 and not 2.0 <= m <= 3.0):
        raise PolicyError(f"policy.lease_ttl_multiplier must be within [2, 3] (0: default 2.5), got {m}")
    for name in ("initial_lease_ttl", "min_lease_ttl", "max_lease_ttl", "actor_timeout", "command_retention"):
        _check_duration(f"policy.{name}", getattr(p, name))
    if not 0 <= p.max_lease_attempts <= 1000:
        raise PolicyError(
            f"policy.max_lease_attempts must be within [1, 1000] (0: default 5), got {p.max_lease_attempts}"
        )
    _check_fraction("policy.tau_ema_weight", p.tau_ema_weight)
    _check_fraction("policy.tau_decay", p.tau_decay)
    if math.isnan(p.initial_tau) or not 0 <= p.initial_tau <= 1e12:
        raise PolicyError(f"policy.initial_tau must be within [0, 1e12] tokens/s, got {p.initial_tau}")
    if not 0 <= p.buffer_capacity <= MAX_CAPACITY:
        raise PolicyError(
            f"policy.buffer_capacity must be within [0, {MAX_CAPACITY}], got {p.buffer_capacity}"
        )

    _check_task_shares(p)
    d = DEFAULTS
    p.admission = p.admission or cast(common_pb2.AdmissionPolicy, int(d["adm"]))
    p.group_size = p.group_size or int(d["G"])
    p.lease_ttl_multiplier = p.lease_ttl_multiplier or d["mult"]
    for name, key in (
        ("initial_lease_ttl", "ttl0"),
        ("min_lease_ttl", "tmin"),
        ("max_lease_ttl", "tmax"),
        ("actor_timeout", "tout"),
        ("command_retention", "ret"),
    ):
        if not p.HasField(name) or _ms(getattr(p, name)) == 0:
            getattr(p, name).CopyFrom(_dur(d[key]))
    if _ms(p.min_lease_ttl) > _ms(p.max_lease_ttl):
        raise PolicyError("policy.min_lease_ttl must not exceed policy.max_lease_ttl")
    p.max_lease_attempts = p.max_lease_attempts or int(d["maxatt"])
    p.tau_ema_weight = p.tau_ema_weight or d["w"]
    p.tau_decay = p.tau_decay or d["decay"]
    p.initial_tau = p.initial_tau or d["tau0"]
    return p


def _check_task_shares(p: lp.JobPolicy) -> None:
    shares = p.task_shares
    if not shares:
        return
    if len(shares) > MAX_TASKS:
        raise PolicyError(f"policy.task_shares names {len(shares)} tasks, at most {MAX_TASKS}")
    for task, share in shares.items():
        if not task or len(task) > MAX_TASK_TAG or any(c.isspace() for c in task):
            raise PolicyError(f"policy.task_shares: task tag {task!r} must be 1-{MAX_TASK_TAG} non-blank characters")
        if not math.isfinite(share) or share < 0:
            raise PolicyError(f"policy.task_shares[{task}] must be finite and >= 0, got {share}")
    if not sum(shares.values()) > 0:
        raise PolicyError("policy.task_shares must sum to a positive number")


def task_shares(p: lp.JobPolicy) -> dict[str, float]:
    """The normalised shares of a validated policy (empty: one pool)."""
    total = sum(p.task_shares.values())
    return {t: s / total for t, s in sorted(p.task_shares.items())} if total > 0 else {}


def task_group_quotas(groups: int, shares: Mapping[str, float]) -> dict[str, int]:
    """Whole groups per task out of ``groups`` in proportion to ``shares`` (largest remainder, ties by task tag);
    get_batch.lua applies the same rule, tests/unit/ledger checks the two agree."""
    total = sum(shares.values())
    if groups <= 0 or total <= 0:
        return dict.fromkeys(shares, 0)
    exact = {t: groups * s / total for t, s in shares.items()}
    out = {t: int(math.floor(x)) for t, x in exact.items()}
    rest = groups - sum(out.values())
    for t in sorted(exact, key=lambda t: (-(exact[t] - out[t]), t))[:rest]:
        out[t] += 1
    return out


def defaults(job_id: str) -> lp.JobPolicy:
    p = lp.JobPolicy(job_id=job_id or "")
    if not job_id:
        # No job fixed yet: fill() needs a valid id, so fill with a placeholder and blank it again.
        out = fill(p, "unset")
        out.job_id = ""
        return out
    return fill(p, job_id)


def fields(p: lp.JobPolicy) -> dict[str, float]:
    """The flat numbers the Lua scripts read (hash ``pol``)."""
    return {
        "adm": float(p.admission),
        "alpha": float(p.alpha),
        "G": float(p.group_size),
        "R": float(p.redundancy),
        "mult": p.lease_ttl_multiplier,
        "ttl0": _ms(p.initial_lease_ttl),
        "tmin": _ms(p.min_lease_ttl),
        "tmax": _ms(p.max_lease_ttl),
        "maxatt": float(p.max_lease_attempts),
        "tout": _ms(p.actor_timeout),
        "w": p.tau_ema_weight,
        "decay": p.tau_decay,
        "tau0": p.initial_tau,
        "cap": float(p.buffer_capacity),
        "ret": _ms(p.command_retention),
        "unif": 1.0 if p.uniform_allocation else 0.0,
        "nts": float(len(p.task_shares)),
        **{f"ts:{t}": s for t, s in task_shares(p).items()},
    }


def derived_capacity(
    pol: dict[str, float], holders: int, batch: int, group: int, *, ahead: int | None = None
) -> int:
    """The most samples started groups not yet in a batch may hold (acquire.lua's back-pressure): the policy's
    capacity; with the derived one (0), AT_START: (alpha + 1) * max(B, G); before any plan (``ahead`` None):
    (alpha + 1) * max(E, B, G); planned: the batches whose floor admits work on the planned version, alpha + 1
    - ``ahead`` of them (``ahead``: how many batches were formed for the planned step and after), times
    max(B, G)."""
    if pol["cap"] > 0:
        return int(pol["cap"])
    alpha = pol["alpha"]
    if int(pol["adm"]) == AT_START:
        return int((alpha + 1) * max(batch or holders, group))
    if ahead is None:
        return int((alpha + 1) * max(holders, batch, group))
    return int(max(alpha + 1 - ahead, 0) * max(batch, group))


def numbers(stored: Mapping[bytes | str, bytes | str]) -> dict[str, float]:
    """The policy numbers of a stored hash (``pol`` or ``pol:next``; ``blob`` skipped), defaults filled in."""
    out = dict(DEFAULTS)
    for key, value in stored.items():
        name = key.decode() if isinstance(key, bytes) else key
        if name != "blob":
            out[name] = float(value)
    return out
