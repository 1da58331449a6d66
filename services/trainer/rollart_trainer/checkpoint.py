"""Training checkpoints: model (fp32 master weights), optimizer, RNG state and the job's position.

Layout under the checkpoint root (one writer per root: the job's trainer)::

    ckpt-<step:012d>-<created_ns:020d>/
        model.safetensors   fp32 master weights, Hugging Face names
        optimizer.pt        optimizer state (absent for weights-only checkpoints)
        rng.pt              torch (CPU and CUDA), Python and numpy RNG states
        state.json          TrainerState: step, policy version, last batch id, last published version
        published.safetensors  optional: the bf16 weights of the last published version (WeightSet)
        MANIFEST.json       written last: format, state, every file's size and SHA-256

Atomicity: everything is written into ``.tmp-<name>/`` (each file fsynced), the manifest last, then the
directory is fsynced and renamed to ``ckpt-...`` and the root is fsynced. A ``ckpt-*`` directory therefore
only ever appears complete; a writer killed (SIGKILL) at any point leaves the previous checkpoints intact
plus at most a ``.tmp-*`` directory that readers ignore and the next save removes. Pruning renames a
checkpoint to ``.del-*`` before deleting it, so a half-deleted one is never taken for a checkpoint.
Restore takes the newest checkpoint (by step, then creation time) whose manifest and files verify, and
falls back to older ones if the newest is damaged.

Resuming the weight plane without publishing a version twice: the publisher needs the last published
bf16 weights as the base of the next delta. Two orders work:

- save after publishing v_n (``policy_version == last_published_version``): the restored weights' bf16
  export *is* v_n (the cast is deterministic), so nothing else is needed; a crash between publishing and
  saving, though, restarts from step n-1 with v_n already out;
- save before publishing v_n, passing ``published=`` the WeightSet of v_(n-1): after a crash, restore,
  start the publisher from :meth:`CheckpointManager.published_weights` and publish v_n again from the
  restored weights. The bits are the same as before the crash, so D_n (and h(v_n)) are identical and the
  re-publication is idempotent. This is the order that never publishes two different v_n.
"""

from __future__ import annotations

import builtins
import hashlib
import json
import logging
import os
import random
import re
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch

from rollart.delta import WeightSet, load_safetensors, save_safetensors

log = logging.getLogger(__name__)

FORMAT = "rollart-trainer-checkpoint/1"
MANIFEST = "MANIFEST.json"
MODEL_FILE = "model.safetensors"
OPTIMIZER_FILE = "optimizer.pt"
RNG_FILE = "rng.pt"
STATE_FILE = "state.json"
PUBLISHED_FILE = "published.safetensors"
_NAME = re.compile(r"^ckpt-(\d{12})-(\d{20})$")


class CheckpointError(Exception):
    """A checkpoint is missing, incomplete or does not verify."""


@dataclass
class TrainerState:
    """Where the job is: what the checkpoint's weights include and what has been published."""

    job_id: str = ""
    step: int = 0  # the last step trained into these weights (0: none)
    policy_version: int = 0  # the version these weights are
    last_batch_id: str = ""  # id of the last batch trained (the ledger must not hand it out again)
    last_published_version: int = -1  # newest version published (-1: none)
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrainerState:
        known = {
            k: d[k] for k in ("job_id", "step", "policy_version", "last_batch_id", "last_published_version") if k in d
        }
        return cls(**known, extra=dict(d.get("extra") or {}))


@dataclass
class CheckpointRecord:
    checkpoint_id: str
    path: Path
    state: TrainerState
    created_ns: int
    bytes: int
    includes_optimizer: bool
    manifest_sha256: builtins.bytes  # the field above shadows the name in this class body
    files: dict[str, dict[str, Any]]

    @property
    def step(self) -> int:
        return self.state.step

    @property
    def has_published(self) -> bool:
        return PUBLISHED_FILE in self.files

    def to_proto(self) -> Any:
        """As ``rollart.v1.CheckpointInfo``."""
        from rollart.v1 import trainer_pb2

        info = trainer_pb2.CheckpointInfo(
            checkpoint_id=self.checkpoint_id,
            step=self.state.step,
            version=self.state.policy_version,
            uri=str(self.path),
            bytes=self.bytes,
            includes_optimizer=self.includes_optimizer,
            hash=self.manifest_sha256,
        )
        info.created_at.FromNanoseconds(self.created_ns)
        return info


# ----------------------------------------------------------------------------------------------------
# RNG state
# ----------------------------------------------------------------------------------------------------


def capture_rng() -> dict[str, Any]:
    """Every RNG the trainer may draw from, in a form ``torch.load(weights_only=True)`` accepts."""
    # numpy's stub picks the dict overload for a bare call; legacy=True, the default, returns this tuple.
    name, keys, pos, has_gauss, cached = cast(tuple[str, np.ndarray, int, int, float], np.random.get_state())
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": (name, keys.tolist(), int(pos), int(has_gauss), float(cached)),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    py = state["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    cuda = state.get("cuda")
    if cuda and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(cuda)


# ----------------------------------------------------------------------------------------------------
# Files
# ----------------------------------------------------------------------------------------------------


def _fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def _write_bytes(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _torch_save(path: Path, obj: Any) -> None:
    with open(path, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())


class CheckpointManager:
    """Writes and restores the training checkpoints of one job under ``root``.

    ``fault_hook(phase)`` (tests) is called after each phase of a save: "begin", "model", "optimizer",
    "rng", "published" (when given), "state", "manifest", "renamed", "pruning" (once per checkpoint moved
    aside), "done".
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        keep_last: int = 0,
        verify_hashes: bool = True,
        fault_hook: Callable[[str], None] | None = None,
    ) -> None:
        if keep_last < 0:
            raise ValueError("keep_last must be >= 0")
        self.root = Path(root)
        self.keep_last = keep_last
        self.verify_hashes = verify_hashes
        self._hook = fault_hook or (lambda phase: None)

    # ------------------------------------------------------------------------------------------ save

    def save(
        self, backend: Any, state: TrainerState, *, weights_only: bool = False, published: WeightSet | None = None
    ) -> CheckpointRecord | None:
        """Checkpoint ``backend`` (a :class:`~rollart_trainer.grpo.TrainBackend`) with ``state``, and
        optionally the last published version's bf16 weights (see the module docstring).

        Every rank of a distributed backend must call it (gathering the state is collective); only the
        writer rank writes and gets the record, the others get None.
        """
        model = backend.model_state()
        optim = None if weights_only else backend.optimizer_state()
        if not getattr(backend, "is_writer", True):
            return None
        from safetensors.torch import save_file

        self.root.mkdir(parents=True, exist_ok=True)
        self._remove_leftovers()
        created_ns = time.time_ns()
        name = f"ckpt-{state.step:012d}-{created_ns:020d}"
        tmp = self.root / f".tmp-{name}"
        tmp.mkdir()
        self._hook("begin")
        save_file(model, str(tmp / MODEL_FILE), metadata={"format": FORMAT, "step": str(state.step)})
        _fsync_path(tmp / MODEL_FILE)
        self._hook("model")
        if optim is not None:
            _torch_save(tmp / OPTIMIZER_FILE, optim)
            self._hook("optimizer")
        _torch_save(tmp / RNG_FILE, capture_rng())
        self._hook("rng")
        if published is not None:
            save_safetensors(tmp / PUBLISHED_FILE, published)  # fsynced; records published.version
            self._hook("published")
        state_raw = json.dumps(asdict(state), indent=2, sort_keys=True).encode()
        _write_bytes(tmp / STATE_FILE, state_raw)
        self._hook("state")
        files: dict[str, dict[str, Any]] = {
            p.name: {"bytes": p.stat().st_size, "sha256": _sha256(p)}
            for p in sorted(tmp.iterdir())
            if p.name != MANIFEST
        }
        manifest = {
            "format": FORMAT,
            "checkpoint_id": name,
            "created_ns": created_ns,
            "includes_optimizer": optim is not None,
            "state": asdict(state),
            "files": files,
        }
        raw = json.dumps(manifest, indent=2, sort_keys=True).encode()
        _write_bytes(tmp / MANIFEST, raw)
        _fsync_path(tmp)
        self._hook("manifest")
        final = self.root / name
        os.rename(tmp, final)
        _fsync_path(self.root)
        self._hook("renamed")
        self.prune()
        self._hook("done")
        record = CheckpointRecord(
            name,
            final,
            state,
            created_ns,
            sum(f["bytes"] for f in files.values()) + len(raw),
            optim is not None,
            hashlib.sha256(raw).digest(),
            files,
        )
        log.info("checkpoint %s written (%d bytes)", name, record.bytes)
        return record

    def _remove_leftovers(self) -> None:
        """Temporary and half-deleted directories of earlier (killed) writers."""
        for p in self.root.iterdir():
            if p.is_dir() and (p.name.startswith(".tmp-ckpt-") or p.name.startswith(".del-ckpt-")):
                shutil.rmtree(p, ignore_errors=True)

    def prune(self) -> list[str]:
        """Delete all but the newest ``keep_last`` checkpoints (0: keep all); returns the deleted ids."""
        if not self.keep_last:
            return []
        names = sorted((p.name for p in self._dirs()), key=_sort_key)
        doomed = names[: max(0, len(names) - self.keep_last)]
        for n in doomed:
            trash = self.root / f".del-{n}"
            os.rename(self.root / n, trash)  # atomic: never a half-deleted ckpt-* directory
            self._hook("pruning")
            shutil.rmtree(trash, ignore_errors=True)
        if doomed:
            _fsync_path(self.root)
        return doomed

    # ------------------------------------------------------------------------------------------ read

    def _dirs(self) -> list[Path]:
        if not self.root.is_dir():
            return []
        return [p for p in self.root.iterdir() if p.is_dir() and _NAME.match(p.name)]

    def read(self, path: Path, *, verify: bool | None = None) -> CheckpointRecord:
        """The record of one checkpoint directory, after checking its manifest and files."""
        verify = self.verify_hashes if verify is None else verify
        try:
            raw = (path / MANIFEST).read_bytes()
            m = json.loads(raw)
            if m.get("format") != FORMAT:
                raise CheckpointError(f"{path.name}: unknown format {m.get('format')!r}")
            files = m["files"]
            for fname, info in files.items():
                p = path / fname
                if not p.is_file() or p.stat().st_size != int(info["bytes"]):
                    raise CheckpointError(f"{path.name}: {fname} is missing or has the wrong size")
                if verify and _sha256(p) != info["sha256"]:
                    raise CheckpointError(f"{path.name}: {fname} does not match its SHA-256")
            for required in (MODEL_FILE, RNG_FILE, STATE_FILE):
                if required not in files:
                    raise CheckpointError(f"{path.name}: manifest lacks {required}")
            if m["includes_optimizer"] and OPTIMIZER_FILE not in files:
                raise CheckpointError(f"{path.name}: manifest lacks {OPTIMIZER_FILE}")
            return CheckpointRecord(
                m["checkpoint_id"],
                path,
                TrainerState.from_dict(m["state"]),
                int(m["created_ns"]),
                sum(int(f["bytes"]) for f in files.values()) + len(raw),
                bool(m["includes_optimizer"]),
                hashlib.sha256(raw).digest(),
                files,
            )
        except CheckpointError:
            raise
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise CheckpointError(f"{path.name}: unreadable manifest: {e}") from None

    def list(self, *, verify: bool = False) -> list[CheckpointRecord]:
        """Readable checkpoints, oldest first (file sizes checked; hashes only with ``verify``)."""
        out = []
        for p in sorted(self._dirs(), key=lambda p: _sort_key(p.name)):
            try:
                out.append(self.read(p, verify=verify))
            except CheckpointError as e:
                log.warning("ignoring checkpoint: %s", e)
        return out

    def latest(self) -> CheckpointRecord | None:
        """The newest checkpoint that verifies (falls back to older ones)."""
        for p in sorted(self._dirs(), key=lambda p: _sort_key(p.name), reverse=True):
            try:
                return self.read(p)
            except CheckpointError as e:
                log.warning("skipping damaged checkpoint: %s", e)
        return None

    def load(self, record: CheckpointRecord, backend: Any, *, restore_rng_state: bool = True) -> TrainerState:
        """Load a checkpoint into ``backend`` (every rank calls it); returns its state."""
        from safetensors.torch import load_file

        backend.load_model_state(load_file(str(record.path / MODEL_FILE), device="cpu"))
        if record.includes_optimizer:
            backend.load_optimizer_state(
                torch.load(record.path / OPTIMIZER_FILE, map_location="cpu", weights_only=True)
            )
        if restore_rng_state:
            restore_rng(torch.load(record.path / RNG_FILE, map_location="cpu", weights_only=True))
        return record.state

    def published_weights(self, record: CheckpointRecord) -> WeightSet | None:
        """The last published version's bf16 weights saved with ``record`` (memory-mapped), if any."""
        if not record.has_published:
            return None
        return load_safetensors(record.path / PUBLISHED_FILE)

    def restore_latest(self, backend: Any) -> tuple[TrainerState, CheckpointRecord] | None:
        rec = self.latest()
        if rec is None:
            return None
        return self.load(rec, backend), rec


def _sort_key(name: str) -> tuple[int, int]:
    m = _NAME.match(name)
    assert m is not None
    return int(m.group(1)), int(m.group(2))
