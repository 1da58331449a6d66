"""The actor's host copy of the served weights (:class:`HostWeights`) and the files it is loaded from.

vLLM on CPU prepacks every linear layer and cannot hand its weights back, so the actor keeps the served weights
itself: numpy arrays under HF names (bf16 as uint16 bit patterns), memory-mapped copy-on-write from the
checkpoint, with the active version, ``h(v)`` and the recent ``h(v)`` per version that chunks report. A delta
chain is applied all or nothing (:meth:`HostWeights.apply_chain` returns its undo). Only
:class:`~rollart_actor.weights.WeightManager` changes it.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np

from rollart.delta import Delta, ParamMap, WeightSet, apply_delta, load_safetensors, save_safetensors
from rollart.delta.errors import DeltaError, IncompatibleTargetError
from rollart.runtime import errors


class WeightError(errors.Coded):
    """A weight operation was refused; ``code`` is the gRPC status name. Nothing was changed.

    A ``runtime.errors.Coded`` error: raised from a servicer, the server's one mapper ends the call.
    """


def load_weight_files(path: str | Path) -> tuple[WeightSet, list[Path]]:
    """Every tensor of a .safetensors file or of a folder's *.safetensors files (copy-on-write mappings)."""
    p = Path(path)
    if p.is_dir():
        files = sorted(p.glob("*.safetensors"))
        if not files:
            raise WeightError("FAILED_PRECONDITION", f"no .safetensors files in {p}")
    elif p.is_file():
        files = [p]
    else:
        raise WeightError("NOT_FOUND", f"no weights at {p}")
    arrays: dict[str, np.ndarray] = {}
    dtypes: dict[str, str] = {}
    meta: dict[str, str] = {}
    version = applied = None
    for f in files:
        try:
            ws = load_safetensors(f, writable=True)
        except DeltaError as exc:
            raise WeightError("FAILED_PRECONDITION", f"{f}: {exc}") from None
        dup = set(arrays) & set(ws.arrays)
        if dup:
            raise WeightError("FAILED_PRECONDITION", f"{f}: tensors also in another file: {sorted(dup)[:4]}")
        arrays.update(ws.arrays)
        dtypes.update(ws.dtypes)
        meta.update(ws.metadata)
        version = ws.version if ws.version is not None else version
        applied = ws.applied_hash or applied
    return WeightSet(arrays, dtypes, version, applied, meta), files


def open_checkpoint(uri: str, version: int) -> tuple[WeightSet, Path | None]:
    """A checkpoint store (s3:// or a folder of v<12 digits> folders) at ``version``, else safetensors files.

    Returns the weights and a path the engine can load them from as they are (None: write them first).
    """
    p = Path(uri[len("file://") :] if uri.startswith("file://") else uri)
    store_like = uri.startswith("s3://") or (p.is_dir() and any(p.glob("v[0-9]*/manifest.json")))
    if store_like:
        from rollart.weights.checkpoint_store import CheckpointError, open_store

        try:
            store = open_store(uri)
            ws = store.open(version, writable=True)
            return ws, Path(store.local_path(version, verify=False))
        except CheckpointError as exc:
            raise WeightError(getattr(exc, "grpc_status", "FAILED_PRECONDITION"), str(exc)) from None
    ws, files = load_weight_files(p)
    if ws.version is not None and ws.version != version:
        raise WeightError("FAILED_PRECONDITION", f"{uri} holds version {ws.version}, not {version}")
    return ws, (files[0] if len(files) == 1 else p)


class HostWeights:
    """The served weights as numpy arrays (HF names), with the active version and h(v)."""

    # How many recently active versions keep their h(v): enough for any request in flight to have
    # started on one of them (requests cross a handful of versions at most).
    HISTORY = 64
    writes_adapter = False  # AdapterHost (LoRA jobs): commits write a peft folder, not tensors to reload
    pending = False  # AdapterHost only: no adapter version loaded yet

    def __init__(self, ws: WeightSet, version: int, hash_: bytes | None) -> None:
        self.ws = ws
        self.pm = ParamMap.from_weights(ws)
        # version -> h(v) of the weights this actor had active under that version (the chunk's
        # version_hashes come from here, not from the ledger, so settlement can catch wrong weights).
        self.history: collections.OrderedDict[int, bytes] = collections.OrderedDict()
        self.set_version(version, hash_)

    @classmethod
    def load(cls, path: str | Path, version: int, hash_: bytes | None = None) -> HostWeights:
        ws, _ = load_weight_files(path)
        return cls(ws, version, hash_ if hash_ is not None else ws.applied_hash)

    def like(self, ws: WeightSet, version: int, hash_: bytes | None) -> HostWeights:
        """A host copy of the same kind holding ``ws`` (a full load's replacement)."""
        return HostWeights(ws, version, hash_)

    def adapter_dir(self, work_dir: Path, version: int) -> Path:
        raise NotImplementedError("full weights are written to a file (AdapterHost writes adapter folders)")

    @property
    def version(self) -> int:
        assert self.ws.version is not None
        return self.ws.version

    @property
    def hash(self) -> bytes:
        return self.ws.applied_hash or b""

    def set_version(self, version: int, hash_: bytes | None) -> None:
        self.ws.version = version
        self.ws.applied_hash = hash_
        # The latest activation of a version decides its hash; an unknown hash forgets an older one
        # rather than vouching for weights that are no longer what ran.
        self.history.pop(version, None)
        if hash_:
            self.history[version] = hash_
            while len(self.history) > self.HISTORY:
                self.history.popitem(last=False)

    def hashes_for(self, versions: Iterable[int]) -> dict[int, bytes]:
        """h(v) of each of ``versions`` this actor had active with a known hash (unknown ones omitted)."""
        return {v: self.history[v] for v in set(versions) if v in self.history}

    def check_delta(self, delta: Delta) -> None:
        """Every tensor of the delta exists here with its dtype and shape (IncompatibleTargetError if not)."""
        for td in delta.tensors.values():
            et = self.pm.engine(td.name)
            if et.dtype != td.dtype or tuple(et.shape) != tuple(td.shape):
                raise IncompatibleTargetError(
                    f"{td.name}: delta has {td.dtype}{list(td.shape)}, the served model {et.dtype}{list(et.shape)}"
                )

    def check_full(self, ws: WeightSet) -> None:
        """Full weights must have exactly the served tensors, dtypes and shapes."""
        mine = {n: (self.ws.dtypes[n], tuple(a.shape)) for n, a in self.ws.arrays.items()}
        theirs = {n: (ws.dtypes[n], tuple(a.shape)) for n, a in ws.arrays.items()}
        if mine != theirs:
            missing = sorted(set(mine) - set(theirs))[:4]
            extra = sorted(set(theirs) - set(mine))[:4]
            differ = sorted(n for n in set(mine) & set(theirs) if mine[n] != theirs[n])[:4]
            raise WeightError(
                "FAILED_PRECONDITION",
                f"the weights do not fit the served model (missing {missing}, extra {extra}, differ {differ})",
            )

    def apply_chain(self, deltas: list[Delta]) -> tuple[list[str], int, Callable[[], None]]:
        """Apply deltas in order to the host copy. Returns (engine tensors touched, entries, undo).

        All or nothing: the touched tensors are copied first and restored if any delta fails.
        """
        touched: list[str] = []
        seen: set[str] = set()
        for d in deltas:
            for name in d.tensors:
                if name not in seen:
                    seen.add(name)
                    touched.append(name)
        hf = [h for name in touched for h in self.pm.to_hf(name)]
        backup = {h: self.ws.arrays[h].copy() for h in hf}
        old = (self.ws.version, self.ws.applied_hash)

        def undo() -> None:
            for h, a in backup.items():
                self.ws.arrays[h][...] = a
            self.ws.version, self.ws.applied_hash = old

        entries = 0
        try:
            for d in deltas:
                apply_delta(d, self.ws, self.pm)
                entries += d.total_entries
        except BaseException:
            undo()
            raise
        return touched, entries, undo

    def write(self, path: Path, engine_names: list[str] | None = None) -> int:
        """Write the given engine tensors (all their HF members) or everything; returns bytes written."""
        if engine_names is None:
            names = list(self.ws.arrays)
        else:
            names = [h for n in engine_names for h in self.pm.to_hf(n)]
        arrays = {n: self.ws.arrays[n] for n in names}
        save_safetensors(path, arrays, {n: self.ws.dtypes[n] for n in names})
        return int(sum(a.nbytes for a in arrays.values()))
