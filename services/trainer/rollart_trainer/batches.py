"""The trainer's view of a batch: scored trajectories flattened to token streams, packed into micro-batches.

Invariants: a trajectory is one stream (the prompt, then per turn the observation and the action tokens),
truncated to ``max_seq_len``; streams share a packed row but never see each other (position ids restart at 0
for every stream and for the padding, which makes transformers build a block-diagonal causal mask); only the
positions that predict an agent token are scored. docs/objective.md.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

# ====================================================================================================
# Batches
# ====================================================================================================


@dataclass
class TurnTokens:
    """One turn: the environment's observation tokens, then the agent's action tokens."""

    observation_ids: Sequence[int]
    action_ids: Sequence[int]
    action_logprobs: Sequence[float]  # behaviour logprob of every action token
    action_versions: Sequence[int] = ()  # policy version of every action token (empty: unknown)


@dataclass
class Sample:
    """One scored trajectory as the trainer sees it."""

    prompt_ids: Sequence[int]
    turns: Sequence[TurnTokens]
    reward: float
    group_id: str
    sample_id: str = ""

    @classmethod
    def from_proto(cls, traj: Any) -> Sample:
        """From ``rollart.v1.Trajectory`` (must be scored)."""
        if not traj.scored:
            raise ValueError(f"trajectory {traj.trajectory_id!r} is not scored")
        turns = [
            TurnTokens(t.observation_token_ids, t.action_token_ids, t.action_logprobs, t.action_versions)
            for t in traj.turns
        ]
        return cls(traj.prompt_token_ids, turns, float(traj.reward), traj.group_id, traj.trajectory_id)


@dataclass
class TrainBatch:
    """A batch of complete GRPO groups (what the ledger's ``GetBatch`` returns)."""

    samples: list[Sample]
    batch_id: str = ""
    policy_version: int | None = None  # the version the policy is at (for staleness metrics)

    @classmethod
    def from_trajectories(
        cls, trajectories: Iterable[Any], batch_id: str = "", policy_version: int | None = None
    ) -> TrainBatch:
        return cls([Sample.from_proto(t) for t in trajectories], batch_id, policy_version)


@dataclass
class TokenStream:
    """A sample flattened: token ids and, per token, whether the agent produced it."""

    ids: np.ndarray  # int64 [n]
    action: np.ndarray  # bool [n]
    behaviour_logp: np.ndarray  # float32 [n] (0 on environment tokens)
    versions: np.ndarray  # int64 [n] (-1 on environment tokens and where unknown)

    def __len__(self) -> int:
        return int(self.ids.size)

    @property
    def loss_positions(self) -> np.ndarray:
        """Positions of agent tokens that have a predecessor (a stream's first token is never predicted)."""
        pos = np.flatnonzero(self.action)
        return pos[pos >= 1]


def flatten_sample(sample: Sample, max_len: int = 0) -> TokenStream:
    """prompt, then per turn observation then action tokens; truncated to ``max_len`` (0: no limit)."""
    ids: list[np.ndarray] = [np.asarray(sample.prompt_ids, dtype=np.int64)]
    action: list[np.ndarray] = [np.zeros(len(ids[0]), dtype=bool)]
    blp: list[np.ndarray] = [np.zeros(len(ids[0]), dtype=np.float32)]
    ver: list[np.ndarray] = [np.full(len(ids[0]), -1, dtype=np.int64)]
    for k, turn in enumerate(sample.turns):
        obs = np.asarray(turn.observation_ids, dtype=np.int64)
        act = np.asarray(turn.action_ids, dtype=np.int64)
        lp = np.asarray(turn.action_logprobs, dtype=np.float32)
        if lp.size != act.size:
            raise ValueError(
                f"sample {sample.sample_id!r} turn {k}: {lp.size} behaviour logprobs for {act.size} action tokens"
            )
        if not np.all(np.isfinite(lp)):
            raise ValueError(f"sample {sample.sample_id!r} turn {k}: non-finite behaviour logprob")
        vs = np.asarray(turn.action_versions, dtype=np.int64)
        if vs.size == 0:
            vs = np.full(act.size, -1, dtype=np.int64)
        elif vs.size != act.size:
            raise ValueError(f"sample {sample.sample_id!r} turn {k}: {vs.size} versions for {act.size} action tokens")
        ids += [obs, act]
        action += [np.zeros(obs.size, dtype=bool), np.ones(act.size, dtype=bool)]
        blp += [np.zeros(obs.size, dtype=np.float32), lp]
        ver += [np.full(obs.size, -1, dtype=np.int64), vs]
    stream = TokenStream(np.concatenate(ids), np.concatenate(action), np.concatenate(blp), np.concatenate(ver))
    if max_len and len(stream) > max_len:
        stream = TokenStream(
            stream.ids[:max_len], stream.action[:max_len], stream.behaviour_logp[:max_len], stream.versions[:max_len]
        )
    return stream


# ====================================================================================================
# Packing
# ====================================================================================================


@dataclass
class MicroBatch:
    """Packed rows and the agent tokens to score in them."""

    input_ids: torch.Tensor  # int64 [R, L]
    position_ids: torch.Tensor  # int64 [R, L]; restarts at 0 for every stream and for the padding
    pred_rows: torch.Tensor  # int64 [N]: row of the position whose output predicts the token
    pred_cols: torch.Tensor  # int64 [N]: column of that position (the token's column - 1)
    targets: torch.Tensor  # int64 [N]: the agent token
    behaviour_logp: torch.Tensor  # float32 [N]
    advantages: torch.Tensor  # float32 [N]
    versions: torch.Tensor  # int64 [N] (-1: unknown)
    sample_index: torch.Tensor  # int64 [N]: index of the token's sample in the batch
    samples: list[int] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return int(self.targets.numel())

    @property
    def num_positions(self) -> int:
        return int(self.input_ids.numel())

    def to(self, device: torch.device) -> MicroBatch:
        if device.type == "cpu":
            return self
        moved = {k: v.to(device, non_blocking=True) for k, v in vars(self).items() if isinstance(v, torch.Tensor)}
        return MicroBatch(**moved, samples=self.samples)


def pack_first_fit(lengths: Sequence[int], capacity: int) -> list[list[int]]:
    """Indices into rows of at most ``capacity`` tokens, first-fit decreasing (longest streams first)."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    rows: list[list[int]] = []
    free: list[int] = []
    for i in order:
        n = lengths[i]
        for r, room in enumerate(free):
            if n <= room:
                rows[r].append(i)
                free[r] -= n
                break
        else:
            rows.append([i])
            free.append(capacity - n)
    return rows


def build_micro_batch(
    streams: Sequence[TokenStream], indices: Sequence[int], advantages: np.ndarray, row_tokens: int, pad_id: int
) -> MicroBatch:
    """Pack the streams ``indices`` into rows (capacity: ``row_tokens`` or the longest stream)."""
    lengths = [len(streams[i]) for i in indices]
    capacity = max(row_tokens, max(lengths))
    rows = pack_first_fit(lengths, capacity)
    width = max(sum(lengths[j] for j in row) for row in rows)
    ids = np.full((len(rows), width), pad_id, dtype=np.int64)
    pos = np.empty((len(rows), width), dtype=np.int64)
    parts: dict[str, list[np.ndarray]] = {k: [] for k in ("r", "c", "t", "b", "a", "v", "s")}
    for r, row in enumerate(rows):
        off = 0
        for j in row:
            i = indices[j]
            s = streams[i]
            n = len(s)
            ids[r, off : off + n] = s.ids
            pos[r, off : off + n] = np.arange(n)
            lp = s.loss_positions
            parts["r"].append(np.full(lp.size, r, dtype=np.int64))
            parts["c"].append(off + lp - 1)
            parts["t"].append(s.ids[lp])
            parts["b"].append(s.behaviour_logp[lp])
            parts["a"].append(np.full(lp.size, advantages[i], dtype=np.float32))
            parts["v"].append(s.versions[lp])
            parts["s"].append(np.full(lp.size, i, dtype=np.int64))
            off += n
        pos[r, off:] = np.arange(width - off)  # padding is a stream of its own: nobody attends to it

    def cat(k: str, dtype: Any) -> torch.Tensor:
        return torch.from_numpy(np.concatenate(parts[k]).astype(dtype, copy=False))

    return MicroBatch(
        torch.from_numpy(ids),
        torch.from_numpy(pos),
        cat("r", np.int64),
        cat("c", np.int64),
        cat("t", np.int64),
        cat("b", np.float32),
        cat("a", np.float32),
        cat("v", np.int64),
        cat("s", np.int64),
        samples=list(indices),
    )


def plan_micro_batches(
    streams: Sequence[TokenStream],
    advantages: np.ndarray,
    include: Sequence[int],
    micro_batch_size: int,
    row_tokens: int = 0,
    pad_id: int = 0,
) -> list[MicroBatch]:
    """Micro-batches of ``micro_batch_size`` samples (0: one), longest first so their lengths are alike."""
    order = sorted(include, key=lambda i: -len(streams[i]))
    size = micro_batch_size or max(1, len(order))
    return [
        build_micro_batch(streams, order[k : k + size], advantages, row_tokens, pad_id)
        for k in range(0, len(order), size)
    ]
