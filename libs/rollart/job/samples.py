"""Rollout samples: a few trajectories of a step's batch, as text, for people to read.

Where they come from: the trainer does not send trajectories to ``rollart run``; the ledger holds the batch it
formed for a step until the trainer acknowledges it, and ``GetBatch`` for a step whose batch exists returns that
same batch (its idempotency contract). :func:`read_batch` asks for it once the trainer announced a later phase of
the step than GET_BATCH (so the call can only replay, never form a batch); a step whose batch was acknowledged
before the call has no samples (FAILED_PRECONDITION: returns None).

:func:`pick` takes K trajectories per task (spread over the batch's rewards, lowest to highest), and
:func:`to_row` makes each a plain dict: prompt (the environment's first observation), turns, reward, the version
it was leased for, the versions of its tokens and its staleness at the step. ``<out>/samples.jsonl`` holds one
row a line (rollart.job.tracking writes it); ``rollart samples <out>`` prints them.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from rollart.v1 import common_pb2, ledger_pb2

_STATUS = {v: k.removeprefix("TRAJECTORY_STATUS_").lower() for k, v in common_pb2.TrajectoryStatus.items()}


def _cut(text: str, max_chars: int) -> str:
    return text if len(text) <= max_chars else text[: max_chars - 1] + "…"


def to_row(t: common_pb2.Trajectory, step: int, max_chars: int = 2000) -> dict[str, Any]:
    """One trajectory of step ``step``'s batch as a samples.jsonl row."""
    versions = [v for turn in t.turns for v in turn.action_versions]
    trained_on = step - 1  # the version step s trains (StepMetrics.version_trained)
    turns = [
        {
            "observation": _cut(turn.observation, max_chars),
            "action": _cut(turn.action, max_chars),
            "tokens": len(turn.action_token_ids),
            "env_reward": turn.env_reward,
            "actor": turn.actor_id,
            "versions": [min(turn.action_versions), max(turn.action_versions)] if turn.action_versions else [],
        }
        for turn in t.turns
    ]
    return {
        "step": step,
        "task": t.task,
        "trajectory_id": t.trajectory_id,
        "group_id": t.group_id,
        "prompt_id": t.prompt_id,
        "sample_index": t.sample_index,
        "reward": t.reward,
        "status": _STATUS.get(t.status, str(t.status)),
        "version": t.lease_version,
        "token_versions": [min(versions), max(versions)] if versions else [],
        "staleness": trained_on - min(versions) if versions else 0,
        "prompt": turns[0]["observation"] if turns else "",
        "prompt_tokens": len(t.prompt_token_ids),
        "response_tokens": sum(x["tokens"] for x in turns),
        "turns": turns,
        "metadata": dict(t.metadata),
    }


def pick(batch: ledger_pb2.Batch, per_task: int) -> list[common_pb2.Trajectory]:
    """``per_task`` trajectories of each task in the batch, evenly spread over its rewards (lowest and highest
    included), in a stable order."""
    by_task: dict[str, list[common_pb2.Trajectory]] = {}
    for g in batch.groups:
        for t in g.trajectories:
            by_task.setdefault(t.task, []).append(t)
    out: list[common_pb2.Trajectory] = []
    for task in sorted(by_task):
        ts = sorted(by_task[task], key=lambda t: (t.reward, t.trajectory_id))
        k = min(per_task, len(ts))
        if k == 1:
            idx = [len(ts) - 1]
        else:
            idx = sorted({round(i * (len(ts) - 1) / (k - 1)) for i in range(k)})
        out.extend(ts[i] for i in idx)
    return out


def rows(batch: ledger_pb2.Batch, step: int, per_task: int, max_chars: int = 2000) -> list[dict[str, Any]]:
    return [to_row(t, step, max_chars) for t in pick(batch, per_task)]


async def read_batch(address: str, token: str, step: int, batch_size: int) -> ledger_pb2.Batch | None:
    """The batch of ``step`` as the ledger holds it, or None when the trainer already acknowledged it. Call only
    once the trainer's step is past GET_BATCH: the batch then exists and this call replays it."""
    from grpc import StatusCode, aio

    from rollart.runtime.client import channel
    from rollart.v1 import ledger_pb2_grpc

    ch = channel(address, token=token, default_timeout=15.0)
    try:
        req = ledger_pb2.GetBatchRequest(step=step, batch_size=max(batch_size, 1))
        return await ledger_pb2_grpc.LedgerStub(ch).GetBatch(req, timeout=15.0)
    except aio.AioRpcError as exc:
        if exc.code() in (StatusCode.FAILED_PRECONDITION, StatusCode.NOT_FOUND):
            return None
        raise
    finally:
        await ch.close(grace=None)


# ------------------------------------------------------------------------------------------- reading back


def read_samples(path: str | Path) -> Iterator[dict[str, Any]]:
    """The rows of a samples.jsonl (lines that do not parse are skipped: a line cut by a crash)."""
    p = Path(path)
    if not p.is_file():
        return
    for line in p.read_text().splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and "step" in row:
            yield row


def format_row(row: Mapping[str, Any], width: int = 100, color: bool = False) -> str:
    """A sample for a terminal: one header line, then each turn's observation and action, indented."""

    def style(code: str, text: str) -> str:
        return f"\x1b[{code}m{text}\x1b[0m" if color else text

    versions = row.get("token_versions") or []
    if not versions:
        tokens_v = "-"
    elif versions[0] == versions[-1]:
        tokens_v = f"v{versions[0]}"
    else:
        tokens_v = f"v{versions[0]}-{versions[-1]}"
    head = (
        f"step {row.get('step')}  {row.get('task', '')}  reward {float(row.get('reward') or 0.0):.3g}  "
        f"leased at v{row.get('version')}, tokens {tokens_v}, staleness {row.get('staleness')}  "
        f"{len(row.get('turns') or [])} turns  {row.get('status', '')}  {row.get('trajectory_id', '')}"
    )
    lines = [style("1", head)]
    for i, t in enumerate(row.get("turns") or []):
        lines.extend(_wrap(f"  [{i}] env    ", str(t.get("observation", "")), width))
        act = f"  [{i}] policy "
        lines.extend(style("36", x) for x in _wrap(act, str(t.get("action", "")), width))
        if t.get("env_reward"):
            lines.append(f"        reward {t['env_reward']}")
    return "\n".join(lines)


def _wrap(label: str, text: str, width: int) -> list[str]:
    import textwrap

    pad = " " * len(label)
    out: list[str] = []
    for j, para in enumerate(text.splitlines() or [""]):
        wrapped = textwrap.wrap(para, max(width - len(label), 20)) or [""]
        for k, w in enumerate(wrapped):
            out.append((label if j == 0 and k == 0 else pad) + w)
    return out
