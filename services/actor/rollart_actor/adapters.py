"""LoRA jobs on the actor: the host copy of the adapter (:class:`AdapterHost`) and the folders vLLM loads.

In a LoRA job (``ActorConfig.lora``) a version is the adapter's tensor set, named as peft's
``get_peft_model_state_dict`` names them, plus ``rollart.base_hash`` (uint8[32]: the weights digest of the base
model the adapter was trained on). The host copy holds that set, so deltas, staging, catch-up and checkpoints
work as for full weights. What differs:

- *Base check*: before anything is applied, the set's ``rollart.base_hash`` must equal the digest of the base
  this actor serves (full sets at :meth:`AdapterHost.check_full`; a delta may not touch the tensor at all).
- *Commit*: instead of tensors for an in-place reload, :meth:`AdapterHost.write` writes a peft folder
  (``adapter_config.json`` and ``adapter_model.safetensors`` without ``rollart.base_hash``) under the actor's
  work dir, one per version; the engine registers it as a LoRARequest (``ActorEngine`` in LoRA mode). The base
  is never reloaded.
- *Pending*: an actor started without the adapter (its job had not started yet) holds a zero template of the
  right names and shapes (``pending``); until the first full set arrives it serves the base, which is what
  version 0 (lora_B = 0) computes. Deltas cannot be applied to the template: a commit first loads a full set.
"""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from rollart.delta import Delta, WeightSet, save_safetensors
from rollart.delta.errors import IncompatibleTargetError
from rollart.delta.identity import weights_digest

from .config import ActorLoraConfig
from .host_weights import HostWeights, WeightError

log = logging.getLogger(__name__)

BASE_HASH = "rollart.base_hash"
_ATTN = ("q_proj", "k_proj", "v_proj", "o_proj")


def base_digest(base: WeightSet) -> bytes:
    """The base's h(v0): the weights digest a full-weight job's version 0 has (and the trainer records)."""
    return weights_digest(base.arrays, base.dtypes)


def adapter_shapes(base: WeightSet, settings: ActorLoraConfig) -> dict[str, tuple[int, ...]]:
    """peft name -> shape of every adapter tensor for ``base`` (lora_A [r, in], lora_B [out, r])."""
    out: dict[str, tuple[int, ...]] = {}
    targets = set(settings.target_modules)
    for name, a in base.arrays.items():
        if not name.endswith(".weight") or a.ndim != 2:
            continue
        module = name[: -len(".weight")]
        leaf = module.rpartition(".")[2]
        if leaf not in targets and not any(module.endswith("." + t) for t in targets if "." in t):
            continue
        rows, cols = a.shape
        prefix = f"base_model.model.{module}"
        out[f"{prefix}.lora_A.weight"] = (settings.rank, cols)
        out[f"{prefix}.lora_B.weight"] = (rows, settings.rank)
    return out


def template(base: WeightSet, settings: ActorLoraConfig, base_hash: bytes) -> WeightSet:
    """A zero adapter set of the right names and shapes (a pending actor's placeholder)."""
    shapes = adapter_shapes(base, settings)
    if not shapes:
        raise WeightError("FAILED_PRECONDITION", f"the base has no 2-d weight of {settings.target_modules}")
    arrays: dict[str, np.ndarray] = {n: np.zeros(s, np.float32) for n, s in shapes.items()}
    arrays[BASE_HASH] = np.frombuffer(base_hash, np.uint8).copy()
    dtypes = {n: ("U8" if n == BASE_HASH else "F32") for n in arrays}
    return WeightSet(arrays, dtypes)


class AdapterHost(HostWeights):
    """The host copy of a LoRA job's adapter (see the module docstring)."""

    writes_adapter = True

    def __init__(
        self,
        ws: WeightSet,
        version: int,
        hash_: bytes | None,
        *,
        settings: ActorLoraConfig,
        base_hash: bytes,
        base_model: str,
        pending: bool = False,
    ) -> None:
        self.settings = settings
        self.base_hash = base_hash
        self.base_model = base_model
        self.pending = pending
        if not pending:
            self._check_base(ws)
        super().__init__(ws, version, hash_)

    def like(self, ws: WeightSet, version: int, hash_: bytes | None) -> AdapterHost:
        return AdapterHost(
            ws, version, hash_, settings=self.settings, base_hash=self.base_hash, base_model=self.base_model
        )

    def _check_base(self, ws: WeightSet) -> None:
        a = ws.arrays.get(BASE_HASH)
        if a is None:
            raise WeightError("FAILED_PRECONDITION", f"not a LoRA adapter version: no {BASE_HASH} tensor")
        got = np.ascontiguousarray(a).reshape(-1).view(np.uint8).tobytes()
        if got != self.base_hash:
            raise WeightError(
                "FAILED_PRECONDITION",
                f"the adapter was trained on base {got.hex()[:16]}…, this actor serves base "
                f"{self.base_hash.hex()[:16]}… ({self.base_model}); nothing applied",
            )
        rank = {a.shape[0] for n, a in ws.arrays.items() if n.endswith(".lora_A.weight")}
        if rank - {self.settings.rank}:
            raise WeightError("FAILED_PRECONDITION", f"adapter rank {sorted(rank)}, the job's is {self.settings.rank}")

    def check_full(self, ws: WeightSet) -> None:
        self._check_base(ws)
        super().check_full(ws)

    def check_delta(self, delta: Delta) -> None:
        if BASE_HASH in delta.tensors:
            raise IncompatibleTargetError(
                f"the delta changes {BASE_HASH}: a version for another base ({self.base_model} is served)"
            )
        super().check_delta(delta)

    def apply_chain(self, deltas: list[Delta]) -> Any:
        if self.pending:
            raise WeightError("FAILED_PRECONDITION", "no adapter version loaded yet: a full set is needed first")
        return super().apply_chain(deltas)

    def adapter_dir(self, work_dir: Path, version: int) -> Path:
        """Where version ``version``'s peft folder goes (removed when no request uses it any more)."""
        return Path(work_dir) / "adapters" / f"v{version}"

    def write(self, path: Path, engine_names: list[str] | None = None) -> int:
        """Write the whole adapter as a peft folder at ``path``; returns the bytes of its tensors."""
        path = Path(path)
        if path.exists():
            shutil.rmtree(path)
        path.mkdir(parents=True)
        names = [n for n in self.ws.arrays if n != BASE_HASH]
        arrays = {n: self.ws.arrays[n] for n in names}
        save_safetensors(path / "adapter_model.safetensors", arrays, {n: self.ws.dtypes[n] for n in names})
        cfg = {
            "peft_type": "LORA",
            "task_type": "CAUSAL_LM",
            "r": self.settings.rank,
            "lora_alpha": self.settings.alpha,
            "lora_dropout": 0.0,
            "bias": "none",
            "target_modules": list(self.settings.target_modules),
            "base_model_name_or_path": self.base_model,
        }
        (path / "adapter_config.json").write_text(json.dumps(cfg, indent=1))
        return int(sum(a.nbytes for a in arrays.values()))


def load_adapter_host(base: WeightSet, cfg: Any) -> AdapterHost:
    """The actor's start: the adapter of ``cfg.weight_version`` from ``cfg.lora.adapter``, else a pending
    template. The base check runs before anything is served."""
    from .host_weights import load_weight_files

    settings: ActorLoraConfig = cfg.lora
    base_hash = bytes.fromhex(settings.base_hash) if settings.base_hash else base_digest(base)
    model = str(cfg.model)
    if settings.adapter:
        ws, _ = load_weight_files(settings.adapter)
        ws.version = cfg.weight_version
        host = AdapterHost(
            ws, cfg.weight_version, cfg.initial_hash(), settings=settings, base_hash=base_hash, base_model=model
        )
        host.check_full(template(base, settings, base_hash))  # names and shapes fit the served base
        return host
    ws = template(base, settings, base_hash)
    ws.version = cfg.weight_version
    return AdapterHost(
        ws, cfg.weight_version, None, settings=settings, base_hash=base_hash, base_model=model, pending=True
    )


async def await_first_adapter(manager: Any, host: AdapterHost, job: str = "") -> None:
    """A pending actor (or attached job) serves the base, version 0's policy, until its job's first adapter is in
    the checkpoint store (it gets there at StartJob): load the newest version there as soon as there is one."""
    who = f"job {job}: " if job else ""
    while host.pending:
        try:
            async with manager.lock:
                if host.pending and await asyncio.to_thread(manager.adapter_store.latest, 1 << 62):
                    await manager._load_checkpoint(1 << 62, manager.adapter_store)
        except WeightError as exc:
            log.warning("%sthe store's adapter cannot be loaded: %s", who, exc)
            await asyncio.sleep(5.0)
        except Exception as exc:  # noqa: BLE001 - a store not reachable yet: try again
            log.debug("%sno adapter in the checkpoint store yet: %s", who, exc)
        await asyncio.sleep(0.5)
