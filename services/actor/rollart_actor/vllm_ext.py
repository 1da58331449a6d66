"""vLLM worker extension: in-place weight updates for the actor, without restarting the engine.

vLLM mixes this class into its worker when the engine is built with
`worker_extension_cls="rollart_actor.vllm_ext.WeightUpdateExtension"`; the methods then run inside the
engine-core process (a child process even with VLLM_ENABLE_V1_MULTIPROCESSING=0: AsyncLLM always talks to
its engine core over ZMQ) and are called with

    await engine.collective_rpc("rollart_update_weights", args=(payload,))

where `payload` is safetensors bytes (`safetensors.torch.save(tensors)`) or a path to a .safetensors file
or a directory of them. Tensors cannot cross the process boundary; bytes and paths can.

Accepted tensor names: Hugging Face names (`model.layers.0.self_attn.q_proj.weight`) or the engine's
fused names (`...self_attn.qkv_proj.weight`, `...mlp.gate_up_proj.weight`), which are split into their HF
members here. Everything is checked before the model is touched: vLLM's reload puts every layer on the
meta device first, so a failure halfway would leave the engine broken. Checks: every name is a parameter
of the served model, every shape matches, and every module that is touched is updated whole (q, k and v
together; gate and up together). A lone q_proj would load "successfully" in vLLM and silently produce
wrong output, because the layer is then re-processed with uninitialised k and v slices.

The caller must reset the prefix cache afterwards (`engine.reset_prefix_cache(reset_running_requests=
True)`), otherwise KV computed under the old weights is reused silently. The worker cannot do that: the
scheduler owns the cache.

Only this module's methods prefixed `rollart_` are added to the worker (vLLM refuses name clashes).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


class WeightUpdateError(ValueError):
    """The payload does not fit the served model; nothing was changed."""


def load_payload(payload: bytes | bytearray | memoryview | str | os.PathLike[str]) -> dict[str, torch.Tensor]:
    """Tensors from safetensors bytes, a .safetensors file, or a directory of .safetensors files."""
    from safetensors.torch import load, load_file

    if isinstance(payload, (bytes, bytearray, memoryview)):
        return load(bytes(payload))
    path = Path(payload)
    if path.is_dir():
        files = sorted(path.glob("*.safetensors"))
        if not files:
            raise WeightUpdateError(f"no .safetensors files in {path}")
        tensors: dict[str, torch.Tensor] = {}
        for f in files:
            tensors.update(load_file(str(f)))
        return tensors
    if not path.is_file():
        raise WeightUpdateError(f"weights file not found: {path}")
    return load_file(str(path))


@contextmanager
def _quiet_partial_reload() -> Iterator[None]:
    # vLLM warns once per untouched layer ("Failed to load weights", "weights were not loaded"); for a
    # partial update that is the expected outcome, not a problem worth hundreds of log lines.
    names = (
        "vllm.model_executor.model_loader.reload.layerwise",
        "vllm.model_executor.model_loader.reload.inplace",
    )
    loggers = [logging.getLogger(n) for n in names]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)


class _ModelIndex:
    """What the served model accepts, in HF names: shapes, and the groups that must load together."""

    def __init__(self, model: torch.nn.Module, tp_size: int) -> None:
        from vllm.model_executor.model_loader.reload.layerwise import get_layerwise_info

        self.packed: dict[str, list[str]] = dict(getattr(model, "packed_modules_mapping", {}) or {})
        self.check_shapes = tp_size == 1  # sharded metadata shapes are per rank; skip rather than guess
        self.shapes: dict[str, tuple[int, ...]] = {}
        self.groups: dict[str, tuple[str, ...]] = {}  # HF name -> every HF name of its module
        self.fused: dict[str, list[tuple[str, int]]] = {}  # engine fused name -> [(HF name, rows)]
        # Tied parameters (lm_head.weight is embed_tokens.weight when tie_word_embeddings): the alias is
        # not loadable (vLLM's loader skips it), but its module must be re-processed when the target
        # changes, because on CPU lm_head computes through its own prepacked copy of the weight.
        by_id: dict[int, list[str]] = {}
        for name, param in model.named_parameters(remove_duplicate=False):
            if param.numel() > 0:  # CPU linears keep an empty placeholder after prepacking
                by_id.setdefault(id(param), []).append(name)
        self.aliases = {alias: names[0] for names in by_id.values() for alias in names[1:]}
        self.modules = dict(model.named_modules(remove_duplicate=False))
        for mod_name, module in model.named_modules():
            meta_params = get_layerwise_info(module).restore_metadata[0]
            if not meta_params:
                continue
            leaf = mod_name.rpartition(".")[2]
            group: list[str] = []
            for pname, meta in meta_params.items():
                full = f"{mod_name}.{pname}"
                if full in self.aliases:
                    continue
                shape = tuple(meta.shape)
                if leaf in self.packed:
                    sizes = list(getattr(module, "output_sizes", []) or [])
                    members = self.packed[leaf]
                    if len(sizes) != len(members):
                        raise RuntimeError(f"{mod_name}: cannot split {leaf} into {members} (sizes {sizes})")
                    parent = mod_name.rpartition(".")[0]
                    out_dim = getattr(meta, "output_dim", 0)
                    parts = []
                    for member, rows in zip(members, sizes, strict=True):
                        hf = f"{parent}.{member}.{pname}"
                        member_shape = list(shape)
                        member_shape[out_dim] = rows
                        self.shapes[hf] = tuple(member_shape)
                        group.append(hf)
                        parts.append((hf, rows))
                    self.fused[full] = parts
                else:
                    org_vocab = getattr(module, "org_vocab_size", None)
                    if org_vocab is not None and len(shape) == 2:
                        shape = (org_vocab, shape[1])  # vocab rows are padded in the engine
                    self.shapes[full] = shape
                    group.append(full)
            for hf in group:
                self.groups[hf] = tuple(group)

    def to_hf(self, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Split engine-fused tensors into their HF members; drop tied aliases; other names pass through."""
        out: dict[str, torch.Tensor] = {}
        for name, t in tensors.items():
            if name in self.aliases:
                continue  # e.g. lm_head.weight of a tied model: vLLM's loader ignores it too
            parts = self.fused.get(name)
            if parts is None:
                out[name] = t
                continue
            total = sum(rows for _, rows in parts)
            if t.ndim == 0 or t.shape[0] != total:
                raise WeightUpdateError(f"{name}: {tuple(t.shape)}, expected {total} rows (members stacked)")
            # Members are stacked along the output dimension (dim 0), q|k|v and gate|up, as vLLM does.
            for (hf, _), piece in zip(parts, t.split([rows for _, rows in parts], dim=0), strict=True):
                out[hf] = piece
        return out

    def tied_modules_of(self, names: Iterable[str]) -> list[torch.nn.Module]:
        """Modules that alias one of the updated parameters (they hold derived copies to rebuild)."""
        updated = set(names)
        return [self.modules[a.rpartition(".")[0]] for a, target in self.aliases.items() if target in updated]

    def validate(self, tensors: dict[str, torch.Tensor]) -> None:
        unknown = sorted(n for n in tensors if n not in self.shapes)
        if unknown:
            raise WeightUpdateError(
                f"not parameters of the served model: {unknown[:8]}"
                + (f" (+{len(unknown) - 8} more)" if len(unknown) > 8 else "")
            )
        if self.check_shapes:
            bad = [
                f"{n}: {tuple(t.shape)} != {self.shapes[n]}"
                for n, t in tensors.items()
                if tuple(t.shape) != self.shapes[n]
            ]
            if bad:
                raise WeightUpdateError(f"shape mismatch: {bad[:8]}")
        missing = sorted({m for n in tensors for m in self.groups[n] if m not in tensors})
        if missing:
            raise WeightUpdateError(
                f"partial fused group: {missing[:8]} must be updated together with their group members"
            )


class WeightUpdateExtension:
    """Mixed into vLLM's worker (CPUWorker / GPU Worker); `self` is the worker."""

    _rollart_index: _ModelIndex | None = None

    def _rollart_model_index(self) -> _ModelIndex:
        if self._rollart_index is None:
            model = self.model_runner.get_model()  # type: ignore[attr-defined]
            tp = self.vllm_config.parallel_config.tensor_parallel_size  # type: ignore[attr-defined]
            self._rollart_index = _ModelIndex(model, tp)
        return self._rollart_index

    def rollart_weight_shapes(self) -> dict[str, list[int]]:
        """HF name -> shape of every tensor an update may carry (for clients to check against)."""
        return {n: list(s) for n, s in self._rollart_model_index().shapes.items()}

    def rollart_update_weights(self, payload: bytes | str) -> dict[str, Any]:
        """Load the given tensors into the running model in place. Returns counts and timing.

        Raises WeightUpdateError (model unchanged) when a name, shape or fused group does not fit.
        """
        t0 = time.perf_counter()
        index = self._rollart_model_index()
        tensors = index.to_hf(load_payload(payload))
        if not tensors:
            raise WeightUpdateError("empty weight update")
        index.validate(tensors)
        t_decode = time.perf_counter()
        # Keep each layer's tensors adjacent: vLLM buffers a layer until all its elements arrived.
        items = sorted(tensors.items())
        partial = len(items) < len(index.shapes)
        with _quiet_partial_reload() if partial else nullcontext():
            self.reload_weights(weights_iterator=iter(items), is_checkpoint_format=True)  # type: ignore[attr-defined]
            # vLLM re-processes only the modules it loaded; a tied lm_head keeps a stale prepacked copy.
            for module in index.tied_modules_of(tensors.keys()):
                quant_method = getattr(module, "quant_method", None)
                if quant_method is not None:
                    quant_method.process_weights_after_loading(module)
        t1 = time.perf_counter()
        return {
            "tensors": len(items),
            "elements": int(sum(t.numel() for _, t in items)),
            "bytes": int(sum(t.numel() * t.element_size() for _, t in items)),
            "partial": partial,
            "decode_s": round(t_decode - t0, 6),
            "reload_s": round(t1 - t_decode, 6),
        }
