"""Request builders shared by the ledger tests (and the benchmark)."""

from __future__ import annotations

import hashlib
import itertools
import threading
import time

from google.protobuf.duration_pb2 import Duration

from rollart.v1 import common_pb2
from rollart.v1 import ledger_pb2 as lp

_tids = itertools.count()
_lock = threading.Lock()


def h(v: int) -> bytes:
    """A stand-in h(v): SHA-256 of the version number."""
    return hashlib.sha256(f"version-{v}".encode()).digest()


def dur(seconds: float) -> Duration:
    d = Duration()
    d.FromNanoseconds(int(seconds * 1e9))
    return d


def policy(stub, md, job="job-1", **kw) -> lp.JobPolicy:
    """Sets the job policy; the buffer is large unless a test asks for the derived O(alpha * E) bound."""
    kw.setdefault("buffer_capacity", 100_000)
    durations = {k: dur(kw.pop(k)) for k in list(kw) if k.endswith("_ttl") or k in ("actor_timeout", "command_retention")}
    return stub.SetJobPolicy(lp.SetJobPolicyRequest(policy=lp.JobPolicy(job_id=job, **kw, **durations)), metadata=md)


def version(stub, md, v: int, base: int | None = None, digest: bytes | None = None):
    pv = common_pb2.PolicyVersion(version=v, base_version=(v - 1) if base is None else base, hash=digest or h(v))
    return stub.RegisterVersion(lp.RegisterVersionRequest(version=pv), metadata=md)


def prompts(stub, md, n: int, group_size: int = 2, redundancy: int = 0, prefix: str = "p", task: str = "math", **kw):
    req = lp.AddPromptsRequest(
        prompts=[lp.Prompt(prompt_id=f"{prefix}{i}", task=task, text=f"question {i}") for i in range(n)],
        group_size=group_size,
        redundancy=redundancy,
        **kw,
    )
    return stub.AddPrompts(req, metadata=md)


def acquire(stub, md, holder: str, n: int = 1, wait: float = 0.0, **kw) -> list[lp.Lease]:
    return list(
        stub.AcquireLeases(lp.AcquireLeasesRequest(holder=holder, max_leases=n, wait=dur(wait), **kw), metadata=md).leases
    )


def trajectory(lease: lp.Lease, versions=None, hashes=None, tid: str | None = None, scored: bool = True,
               reward: float = 1.0, status=common_pb2.TRAJECTORY_STATUS_OK) -> common_pb2.Trajectory:
    """A one- or multi-turn trajectory; ``versions`` lists each turn's token versions (default: all on v_j)."""
    versions = versions if versions is not None else [[lease.version] * 3]
    if tid is None:
        with _lock:
            tid = f"t{next(_tids)}-{lease.lease_id}"
    used = sorted({v for turn in versions for v in turn})
    hashes = hashes if hashes is not None else {v: h(v) for v in used}
    return common_pb2.Trajectory(
        trajectory_id=tid,
        lease_id=lease.lease_id,
        prompt_id=lease.prompt.prompt_id,
        group_id=lease.group_id,
        sample_index=lease.sample_index,
        task=lease.prompt.task,
        prompt_token_ids=[1, 2, 3],
        turns=[
            common_pb2.Turn(action_token_ids=list(range(len(vs))), action_versions=vs, action_logprobs=[-0.5] * len(vs))
            for vs in versions
        ],
        lease_version=lease.version,
        version_hashes=hashes,
        reward=reward,
        scored=scored,
        status=status,
    )


def submit(stub, md, lease: lp.Lease, holder: str | None = None, work=(), reward: float | None = 1.0, **kw):
    traj = kw.pop("traj", None) or trajectory(lease, scored=False, **kw)
    req = lp.SubmitRequest(trajectory=traj, holder=holder or lease.holder, work=list(work))
    if reward is not None:
        req.reward.CopyFrom(common_pb2.RewardOutcome(trajectory_id=traj.trajectory_id, reward=reward))
    return stub.Submit(req, metadata=md)


def status(stub, md) -> lp.LedgerStatus:
    return stub.GetStatus(lp.LedgerStatusRequest(), metadata=md)


def wait_until(pred, timeout: float = 5.0, interval: float = 0.02):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(interval)
    return pred()


def weights(active: int, staged: tuple[int, ...] = (), digest=h) -> common_pb2.ActorWeightState:
    return common_pb2.ActorWeightState(
        loaded=True,
        active_version=active,
        active_hash=digest(active),
        staged=[
            common_pb2.StagedWeights(version=s, base_version=s - 1, hash=digest(s), complete=True, verified=True)
            for s in staged
        ],
    )


def actor(stub, md, aid: str, active: int, staged=(), region: str = "us", relay: str = ""):
    a = lp.LedgerActor(actor_id=aid, endpoint=f"127.0.0.1:{7000 + (hash(aid) % 1000)}", region=region,
                       relay_id=relay, weights=weights(active, staged))
    return stub.RegisterActor(lp.RegisterActorRequest(actor=a), metadata=md)


def heartbeat(stub, md, aid: str, active: int, staged=(), tps: float = 0.0, **kw):
    return stub.ActorHeartbeat(
        lp.ActorHeartbeatRequest(actor_id=aid, weights=weights(active, staged), observed_tokens_per_s=tps, **kw),
        metadata=md,
    )


class Watch:
    """A WatchCommands stream consumed on a thread."""

    def __init__(self, stub, md, subscriber: str, kind: int, from_sequence: int = 0, only_new: bool = False):
        req = lp.WatchCommandsRequest(subscriber_id=subscriber, kind=kind, from_sequence=from_sequence, only_new=only_new)
        self.call = stub.WatchCommands(req, metadata=md, timeout=60)
        self.items: list[lp.LedgerCommand] = []
        self.error: Exception | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            for cmd in self.call:
                self.items.append(cmd)
        except Exception as exc:  # noqa: BLE001 - cancelled at close, or the error a test looks at
            self.error = exc

    def of(self, what: str) -> list[lp.LedgerCommand]:
        return [c for c in self.items if c.WhichOneof("command") == what]

    def wait(self, pred, timeout: float = 5.0):
        return wait_until(lambda: pred(self), timeout)

    def close(self) -> None:
        self.call.cancel()
        self.thread.join(2)
