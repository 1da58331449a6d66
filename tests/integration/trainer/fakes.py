"""Stand-ins for the rollout side, so the trainer's step driver can be tested against the real ledger, relay
and weight plane without inference engines:

- ``WeightActor``: an actor without an engine. It follows the relay with the real ``WeightSubscriber``
  (segments verified, deltas applied to numpy weights), registers with the ledger, heartbeats its weight
  state, and executes the ledger's Commit orders (acknowledging them with its weight state).
- ``ScriptedRollout``: environment loops without environments. It takes leases, makes two-turn
  trajectories whose tokens are stamped with the version the actor has active, scores them with a
  rule on the tokens, and settles them with the ledger.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from pathlib import Path

from rollart.delta import WeightSet, load_safetensors
from rollart.runtime.client import channel
from rollart.v1 import common_pb2, ledger_pb2, ledger_pb2_grpc
from rollart.weights.subscriber import WeightSubscriber


def dur(seconds: float):
    from google.protobuf.duration_pb2 import Duration

    d = Duration()
    d.FromNanoseconds(int(seconds * 1e9))
    return d


class WeightActor:
    def __init__(
        self,
        actor_id: str,
        *,
        ledger: str,
        relays: list[str],
        job: str,
        key: bytes,
        token: str,
        model: Path,
        initial_hash: bytes,
        initial: WeightSet | None = None,
    ) -> None:
        self.actor_id = actor_id
        # ``initial``: the host weights of version 0 when they are not the model's file (a LoRA job's adapter).
        ws = initial.copy() if initial is not None else load_safetensors(model / "model.safetensors").copy()
        ws.version, ws.applied_hash = 0, initial_hash
        self.sub = WeightSubscriber(
            subscriber_id=actor_id,
            job=job,
            key=key,
            token=token,
            sources=relays,
            weights=ws,
            version=0,
            streams=2,
            commit_timeout=30.0,
        )  # active h(v) comes from ws.applied_hash
        self.ch = channel(ledger, token=token, default_timeout=10.0)
        self.ledger = ledger_pb2_grpc.LedgerStub(self.ch)
        self.tasks: list[asyncio.Task] = []
        self.commits: list[int] = []

    def state(self) -> common_pb2.ActorWeightState:
        return self.sub.status()

    async def start(self) -> None:
        await self.sub.start(bootstrap=False)
        actor = ledger_pb2.LedgerActor(
            actor_id=self.actor_id, endpoint=f"fake-{self.actor_id}:1", region="local", weights=self.state()
        )
        await self.ledger.RegisterActor(ledger_pb2.RegisterActorRequest(actor=actor))
        self.tasks = [asyncio.ensure_future(self._heartbeat()), asyncio.ensure_future(self._commands())]

    async def stop(self) -> None:
        for t in self.tasks:
            t.cancel()
        for t in self.tasks:
            with contextlib.suppress(BaseException):
                await t
        with contextlib.suppress(Exception):
            await self.ledger.LeaveActor(ledger_pb2.LeaveActorRequest(actor_id=self.actor_id, reason="test"))
        await self.sub.stop()
        await self.ch.close()

    async def _heartbeat(self) -> None:
        while True:
            with contextlib.suppress(Exception):
                await self.ledger.ActorHeartbeat(
                    ledger_pb2.ActorHeartbeatRequest(
                        actor_id=self.actor_id, weights=self.state(), observed_tokens_per_s=100.0
                    )
                )
            await asyncio.sleep(0.2)

    async def _commands(self) -> None:
        req = ledger_pb2.WatchCommandsRequest(
            subscriber_id=self.actor_id, kind=ledger_pb2.SUBSCRIBER_KIND_ACTOR, only_new=False
        )
        async for cmd in self.ledger.WatchCommands(req, timeout=None):
            if cmd.WhichOneof("command") != "commit":
                continue
            ok, err = True, ""
            try:
                await self.sub.commit(cmd.commit)
                self.commits.append(cmd.commit.version)
            except Exception as exc:  # noqa: BLE001 - reported to the ledger
                ok, err = False, str(exc)
            if cmd.ack_required:
                await self.ledger.AckCommand(
                    ledger_pb2.AckCommandRequest(
                        subscriber_id=self.actor_id, sequence=cmd.sequence, ok=ok, error=err, weights=self.state()
                    )
                )


class ScriptedRollout:
    """``loops`` concurrent loops taking one lease at a time (holder ``<name>/<i>``)."""

    def __init__(
        self,
        *,
        ledger: str,
        token: str,
        actor: WeightActor,
        vocab: int,
        loops: int = 4,
        name: str = "env",
        delay: float = 0.02,
        tasks: tuple[str, ...] = (),
        rewards: dict[str, float] | None = None,
        seed_by_sample: bool = False,
    ) -> None:
        self.ch = channel(ledger, token=token, default_timeout=15.0)
        # Tokens drawn from the sample's (prompt id, index), not the loop's stream: two runs of one job get the
        # same trajectories whichever loop leases which sample.
        self.seed_by_sample = seed_by_sample
        self.ledger = ledger_pb2_grpc.LedgerStub(self.ch)
        self.actor = actor
        self.vocab = vocab
        self.loops = loops
        self.name = name
        self.delay = delay
        self.lease_tasks = tasks  # ledger task filter (multi-task jobs: one rollout per task)
        self.rewards = rewards or {}  # a fixed reward per task instead of the token rule
        self.tasks: list[asyncio.Task] = []
        self.submitted = 0
        self.admitted = 0
        self.hashes: dict[int, bytes] = {}

    async def start(self) -> None:
        self.tasks = [asyncio.ensure_future(self._loop(i)) for i in range(self.loops)]

    async def stop(self) -> None:
        for t in self.tasks:
            t.cancel()
        for t in self.tasks:
            with contextlib.suppress(BaseException):
                await t
        await self.ch.close()

    async def _hash(self, v: int) -> bytes:
        if v not in self.hashes:
            self.hashes[v] = (await self.ledger.GetVersion(ledger_pb2.GetVersionRequest(version=v))).hash
        return self.hashes[v]

    async def _loop(self, i: int) -> None:
        rng = random.Random(i)
        holder = f"{self.name}/{i}"
        while True:
            try:
                resp = await self.ledger.AcquireLeases(
                    ledger_pb2.AcquireLeasesRequest(
                        holder=holder, max_leases=1, wait=dur(1.0), tasks=list(self.lease_tasks)
                    )
                )
                for lease in resp.leases:
                    r = random.Random(f"{lease.prompt.prompt_id}/{lease.sample_index}") if self.seed_by_sample else rng
                    await self._episode(r, holder, lease)
                if not resp.leases:
                    await asyncio.sleep(0.05)
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - a restarting peer: try again
                await asyncio.sleep(0.2)

    async def _episode(self, rng: random.Random, holder: str, lease: ledger_pb2.Lease) -> None:
        turns, versions = [], set()
        for _ in range(2):
            await asyncio.sleep(self.delay)
            v = self.actor.sub.active_version or 0
            versions.add(v)
            toks = [rng.randrange(3, self.vocab) for _ in range(3)]
            turns.append(
                common_pb2.Turn(
                    observation_token_ids=[rng.randrange(3, self.vocab) for _ in range(2)],
                    action_token_ids=toks,
                    action_logprobs=[-6.0] * 3,
                    action_versions=[v] * 3,
                    actor_id=self.actor.actor_id,
                )
            )
        turns[0].ClearField("observation_token_ids")
        reward = sum(t < self.vocab // 2 for turn in turns for t in turn.action_token_ids) / 6.0
        reward = self.rewards.get(lease.prompt.task, reward)
        traj = common_pb2.Trajectory(
            trajectory_id=f"{lease.lease_id}-t",
            lease_id=lease.lease_id,
            prompt_id=lease.prompt.prompt_id,
            group_id=lease.group_id,
            sample_index=lease.sample_index,
            task=lease.prompt.task,
            prompt_token_ids=[rng.randrange(3, self.vocab) for _ in range(4)],
            turns=turns,
            lease_version=lease.version,
            status=common_pb2.TRAJECTORY_STATUS_OK,
            version_hashes={u: await self._hash(u) for u in versions},
        )
        resp = await self.ledger.Submit(
            ledger_pb2.SubmitRequest(
                trajectory=traj,
                holder=holder,
                work=[ledger_pb2.ActorWork(actor_id=self.actor.actor_id, tokens=6, generation_time=dur(0.01))],
                reward=common_pb2.RewardOutcome(trajectory_id=traj.trajectory_id, reward=reward),
            )
        )
        self.submitted += 1
        self.admitted += int(resp.admitted)
