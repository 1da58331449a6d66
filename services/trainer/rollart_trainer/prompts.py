"""The job's prompt groups in the ledger's pool: group ``i`` is always ``<job>-g<i>`` with seed ``seed + i``, so
adding a range again after a restart changes nothing (docs/trainer.md, "The job")."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rollart.v1 import ledger_pb2, ledger_pb2_grpc, trainer_pb2

from . import tasks
from .jobspec import JobError, Settings

T = trainer_pb2


class PromptFeed:
    """Keeps (alpha + 2) steps of the job's groups in the ledger's pool."""

    def __init__(self, spec: T.TrainerJobSpec, settings: Settings) -> None:
        self.spec = spec
        self.settings = settings
        self._rows: dict[str, list[dict[str, Any]]] = {}  # by dataset uri
        self._tasks = tasks.Plan.of(spec, settings.groups_per_step)  # which task each group comes from

    def prompt(self, i: int) -> ledger_pb2.Prompt:
        """The prompt of the job's group ``i`` (multi-task jobs: of the task that position belongs to)."""
        src, i = self._tasks.group(i)
        task = src.task or src.environment
        p = ledger_pb2.Prompt(
            prompt_id=f"{task}-{src.seed + i}",
            task=task,
            environment=src.environment,
            seed=src.seed + i,
            metadata=dict(src.metadata),
        )
        if src.HasField("reward"):
            p.reward.CopyFrom(src.reward)
        if src.dataset_uri:
            rows = self._dataset(src.dataset_uri)
            row = rows[i % len(rows)]
            p.prompt_id = str(row.get("prompt_id") or f"{task}-{i}")
            p.text = str(row.get("text") or row.get("question") or "")
            for k, val in (row.get("metadata") or {}).items():
                p.metadata[str(k)] = str(val)
            if "answer" in row:
                p.metadata["answer"] = str(row["answer"])
        return p

    def _dataset(self, dataset_uri: str) -> list[dict[str, Any]]:
        if dataset_uri not in self._rows:
            uri = dataset_uri.removeprefix("file://")
            rows = [json.loads(line) for line in Path(uri).read_text().splitlines() if line.strip()]
            if not rows:
                raise JobError("INVALID_ARGUMENT", f"prompt dataset {uri} is empty")
            self._rows[dataset_uri] = rows
        return self._rows[dataset_uri]

    async def ensure(
        self, ledger: ledger_pb2_grpc.LedgerStub, extra: dict[str, Any], step: int, extra_groups: int = 0
    ) -> None:
        """Groups up to step ``step + alpha + 1`` in the pool, plus ``extra_groups`` (dynamic sampling: the groups
        the ledger filtered, which no step trains); ``extra`` (the trainer state's, checkpointed) remembers how
        many were added."""
        st = self.settings
        target = st.groups_per_step * (step + st.alpha + 2) + extra_groups
        done = int(extra.get("prompts_added", 0))
        if done >= target:
            return
        idx = range(done, target)
        req = ledger_pb2.AddPromptsRequest(
            prompts=[self.prompt(i) for i in idx],
            group_size=st.group_size,
            redundancy=st.redundancy,
            step=step,
            group_ids=[f"{self.spec.job_id}-g{i:07d}" for i in idx],
        )
        await ledger.AddPrompts(req)
        extra["prompts_added"] = target
