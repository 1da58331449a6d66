"""Codec benchmark: delta formats 3 (default), 2 and 1 against XOR + zstd-1 and the dense tensors, one run.

    python -m bench codec                                # 92 MiB Qwen3-shaped bf16 model, 0.1/1/3/10/50/100 %
                                                         # changed, and a GRPO-like Adam step (lr 1e-5)
    python -m bench codec --json bench/results/codec-v3-synthetic-92mib.json
    python -m bench codec --real A.safetensors B.safetensors   # plus a real pair (repeatable), e.g. the
                                                         # checkpoints `python -m bench grpo-deltas --save DIR` writes

Every method gets the same inputs in the same run. Per row: bytes, bytes per changed entry, encode and
decode seconds (best of ``--repeat``; wall clock and this process's CPU time, since the machine is shared),
and ratios against XOR + zstd-1 (size; encode and decode speed) and against the dense tensors (size).
``--methods`` picks the rows (default v3, v2, XOR + zstd-1, dense; ``all`` adds v1, the v2 numpy path and
int32 pairs).

- delta v3 / v2 / v1: encode = compare + extract + index stream + Zstandard byte planes (v3: of the XOR with
  the base; dense without positions where most changed) + segments + CRC-32 + HMAC + h(v), with
  rollart.delta.kernels when numba is installed ("delta v2 numpy": the v2 encoder on its numpy path, same
  bytes); decode = parse and verify every check + apply into a copy of the base (base checks included).
- XOR + zstd-1 (the slime / NeMo-RL style): encode = XOR of every tensor into a reused buffer + zstd level 1
  (one reused single-threaded compressor); decode = decompress + XOR in place into the base. No integrity
  checks, no base check.
- int32 pairs: encode = compare + int32 positions + gather; decode = scatter. No checks.
- dense: the new tensors themselves (a full-weight transfer); encode/decode = one memcpy of the model.
- read floor (``read_floor_cpu_s`` on every row): one vectorised OR-reduce over each of the two models, nothing
  written: what any encoder that compares the two must at least spend reading them.

Every method runs on one thread, so CPU seconds compare like with like.

Synthetic updates move a uniformly random fraction of bf16 entries by 1-3 ulps (small optimizer steps), the
input XOR + zstd is best at. The GRPO-like case is what a trainer's bf16 export does after one AdamW step
(the mechanism of ``python -m bench grpo-deltas``, without the model): fp32 master weights (the bf16 values
plus sub-ulp residue), every entry moved by about the learning rate (Adam's normalised step, random signs
and magnitudes), rounded to bf16 again; the changed fraction and the 1-2 ulp moves follow from the rounding.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "libs"))

from rollart.delta import WeightSet, apply_delta, decode_delta, encode_delta, kernels, load_safetensors  # noqa: E402
from rollart.delta.dtypes import BY_NAME  # noqa: E402

try:
    import zstandard
except ImportError:  # the baseline is skipped, not faked
    zstandard = None

KEY = b"bench-job-key-0123456789abcdef!!"
BASE_HASH = b"\x5a" * 32  # h(v-1): the trainer always knows it, so the encoder is not charged for a digest
XOR = "XOR + zstd-1"


def layer_shapes(hidden: int, inter: int, q: int, kv: int, head: int, i: int) -> dict[str, tuple[int, ...]]:
    """Layer ``i`` of a Qwen3 decoder (HF names): ``q``/``kv`` heads of ``head``, MLP width ``inter``."""
    p = f"model.layers.{i}."
    return {
        p + "input_layernorm.weight": (hidden,),
        p + "self_attn.q_proj.weight": (q * head, hidden),
        p + "self_attn.k_proj.weight": (kv * head, hidden),
        p + "self_attn.v_proj.weight": (kv * head, hidden),
        p + "self_attn.o_proj.weight": (hidden, q * head),
        p + "self_attn.q_norm.weight": (head,),
        p + "self_attn.k_norm.weight": (head,),
        p + "post_attention_layernorm.weight": (hidden,),
        p + "mlp.gate_proj.weight": (inter, hidden),
        p + "mlp.up_proj.weight": (inter, hidden),
        p + "mlp.down_proj.weight": (hidden, inter),
    }


def synthetic_model(params: float, seed: int = 0, vocab: int = 32000) -> WeightSet:
    """A bf16 checkpoint with Qwen3-0.6B's layer shapes (hidden 1024, 16 query / 8 KV heads of 128,
    intermediate 3072, q/k norms), as many layers as fit in ``params`` (HF names)."""
    hidden, inter, head, q_heads, kv_heads = 1024, 3072, 128, 16, 8
    per_layer = hidden * head * (2 * q_heads + 2 * kv_heads) + 3 * hidden * inter + 2 * hidden + 2 * head
    layers = max(1, int((params - vocab * hidden) // per_layer))
    rng = np.random.default_rng(seed)
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (vocab, hidden), "model.norm.weight": (hidden,)}
    for i in range(layers):
        shapes |= layer_shapes(hidden, inter, q_heads, kv_heads, head, i)
    arrays = {}
    for name, shape in shapes.items():
        if len(shape) == 1:  # norms: around 1.0
            f = 1.0 + rng.standard_normal(shape, dtype=np.float32) * np.float32(0.05)
        else:
            f = rng.standard_normal(shape, dtype=np.float32) * np.float32(0.02)
        arrays[name] = (f.view(np.uint32) >> 16).astype(np.uint16)  # bf16 bit patterns
    return WeightSet(arrays, {n: "BF16" for n in arrays}, version=0, applied_hash=BASE_HASH)


def perturb(ws: WeightSet, density: float, seed: int = 1) -> WeightSet:
    rng = np.random.default_rng(seed)
    out = {}
    for name, a in ws.arrays.items():
        b = a.copy()
        flat = b.reshape(-1)
        if density >= 1.0:
            pos = np.arange(flat.size)
        else:
            pos = np.flatnonzero(rng.random(flat.size) < density)
        step = rng.integers(1, 4, pos.size).astype(np.uint16)
        flat[pos] = np.where(rng.random(pos.size) < 0.5, flat[pos] + step, flat[pos] - step)
        out[name] = b
    return WeightSet(out, dict(ws.dtypes), version=1)


def grpo_like(ws: WeightSet, lr: float = 1e-5, seed: int = 2) -> WeightSet:
    """The bf16 export after one AdamW-like step on fp32 master weights (see the module docstring)."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, a in ws.arrays.items():
        master = (a.astype(np.uint32) << 16).view(np.float32)
        # sub-ulp residue of earlier steps: the fp32 master sits anywhere within its bf16 rounding interval
        ulp = np.abs(master) * np.float32(2.0**-8)
        master = master + ulp * rng.uniform(-0.5, 0.5, a.shape).astype(np.float32)
        step = np.float32(lr) * rng.standard_normal(a.shape, dtype=np.float32).clip(-3, 3)
        new = (master - step).view(np.uint32)
        new = new + np.uint32(0x7FFF) + ((new >> 16) & np.uint32(1))  # round to nearest even
        out[name] = (new >> 16).astype(np.uint16)
    return WeightSet(out, dict(ws.dtypes), version=1)


def best(
    fn: Callable[..., object], repeat: int, setup: Callable[[], object] | None = None
) -> tuple[float, float, object]:
    """(best wall seconds, best CPU seconds of this process, last result)."""
    walls, cpus, result = [], [], None
    for _ in range(repeat):
        arg = setup() if setup else None
        w, c = time.perf_counter(), time.process_time()
        result = fn(arg) if setup else fn()
        cpus.append(time.process_time() - c)
        walls.append(time.perf_counter() - w)
    return min(walls), min(cpus), result


def copy_arrays(ws: WeightSet) -> dict[str, np.ndarray]:
    return {n: a.copy() for n, a in ws.arrays.items()}


def raw(ws: WeightSet, name: str) -> np.ndarray:
    return ws.arrays[name].reshape(-1).view(BY_NAME[ws.dtypes[name]].raw)


def exact(arrays: dict[str, np.ndarray], target: WeightSet) -> bool:
    return all(np.array_equal(arrays[n].reshape(-1), raw(target, n)) for n in target.arrays)


ALL_METHODS = ("v3", "v2", "v1", "v2-numpy", "xor", "pairs", "dense")
DEFAULT_METHODS = ("v3", "v2", "xor", "dense")


def run_case(
    label: str,
    density: float | None,
    base: WeightSet,
    target: WeightSet,
    repeat: int,
    methods: tuple[str, ...] = ALL_METHODS,
) -> list[dict]:
    dense = base.nbytes
    names = list(base.arrays)
    entries = sum(int(np.count_nonzero(raw(base, n) != raw(target, n))) for n in names)
    rows: list[dict] = []

    def row(method: str, size: int, enc: tuple[float, float], dec: tuple[float, float]) -> None:
        rows.append(
            {
                "case": label,
                "density": density if density is not None else entries / sum(a.size for a in base.arrays.values()),
                "method": method,
                "bytes": size,
                "entries": entries,
                "dense_bytes": dense,
                "bytes_per_entry": size / entries if entries else None,
                "vs_dense": size / dense,
                "encode_s": enc[0],
                "encode_cpu_s": enc[1],
                "decode_s": dec[0],
                "decode_cpu_s": dec[1],
                "mb": size / 1e6,
            }
        )

    variants = [(3, True, "delta v3", "v3"), (2, True, "delta v2", "v2"), (1, True, "delta v1", "v1")]
    if kernels.available():  # the same encoder without its compiled kernels (the numpy path), same bytes
        variants.append((2, False, "delta v2 numpy", "v2-numpy"))
    for fmt, fast, method, key in variants:
        if key not in methods:
            continue

        def encode(fmt: int = fmt, fast: bool = fast) -> list[bytes]:
            saved = kernels._state.get("ok")
            kernels._state["ok"] = bool(saved) and fast
            try:
                return list(encode_delta(base, target, job="bench", version=1, key=KEY, format_version=fmt))
            finally:
                kernels._state["ok"] = saved

        t_w, t_c, segs = best(encode, repeat)
        size = sum(len(s) for s in segs)  # type: ignore[union-attr]

        def decode_apply(w: WeightSet, segs: list[bytes] = segs) -> WeightSet:  # type: ignore[assignment]
            apply_delta(decode_delta(segs, KEY), w)
            return w

        d_w, d_c, out = best(
            decode_apply, repeat, setup=lambda: WeightSet(copy_arrays(base), base.dtypes, 0, BASE_HASH)
        )
        assert exact(out.arrays, target), f"{method} is not exact"  # type: ignore[union-attr]
        row(method, size, (t_w, t_c), (d_w, d_c))

    if zstandard is not None and "xor" in methods:
        cctx, dctx = zstandard.ZstdCompressor(level=1), zstandard.ZstdDecompressor()
        bufs = {n: np.empty_like(raw(base, n)) for n in names}

        def xz_encode() -> list[tuple[str, bytes]]:
            out = []
            for n in names:
                np.bitwise_xor(raw(base, n), raw(target, n), out=bufs[n])
                out.append((n, cctx.compress(memoryview(bufs[n]).cast("B"))))
            return out

        t_w, t_c, blobs = best(xz_encode, repeat)

        def xz_decode(arrs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
            for n, blob in blobs:  # type: ignore[union-attr]
                flat = arrs[n].reshape(-1)
                x = np.frombuffer(dctx.decompress(blob), dtype=flat.dtype)
                np.bitwise_xor(flat, x, out=flat)
            return arrs

        d_w, d_c, got = best(xz_decode, repeat, setup=lambda: copy_arrays(base))
        assert exact(got, target)  # type: ignore[arg-type]
        row(XOR, sum(len(b) for _, b in blobs), (t_w, t_c), (d_w, d_c))  # type: ignore[union-attr]

    if "pairs" in methods:

        def pairs_encode() -> list[tuple[str, np.ndarray, np.ndarray]]:
            out = []
            for n in names:
                a, b = raw(base, n), raw(target, n)
                idx = np.flatnonzero(a != b).astype(np.int32)
                out.append((n, idx, b[idx]))
            return out

        t_w, t_c, pairs = best(pairs_encode, repeat)

        def pairs_decode(arrs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
            for n, idx, vals in pairs:  # type: ignore[union-attr]
                arrs[n].reshape(-1)[idx] = vals
            return arrs

        d_w, d_c, got = best(pairs_decode, repeat, setup=lambda: copy_arrays(base))
        assert exact(got, target)  # type: ignore[arg-type]
        size = sum(i.nbytes + v.nbytes for _, i, v in pairs)  # type: ignore[union-attr]
        row("int32 pairs", size, (t_w, t_c), (d_w, d_c))

    if "dense" in methods:
        dst = copy_arrays(base)

        def memcpy() -> None:
            for n in names:
                np.copyto(dst[n], target.arrays[n])

        c_w, c_c, _ = best(memcpy, repeat)
        row("dense", dense, (c_w, c_c), (c_w, c_c))

    def read_both() -> None:
        for ws in (base, target):
            for a in ws.arrays.values():
                flat = a.reshape(-1)
                words = flat[: flat.size // 4 * 4].view(np.uint64) if flat.dtype.itemsize == 2 else flat
                np.bitwise_or.reduce(words)

    _, floor_c, _ = best(read_both, repeat)
    ref = next((r for r in rows if r["method"] == XOR), None)
    for r in rows:
        r["read_floor_cpu_s"] = floor_c
        r["size_vs_xor"] = r["bytes"] / ref["bytes"] if ref else None
        r["encode_speedup_vs_xor"] = ref["encode_s"] / r["encode_s"] if ref else None
        r["encode_cpu_speedup_vs_xor"] = ref["encode_cpu_s"] / r["encode_cpu_s"] if ref else None
        r["decode_speedup_vs_xor"] = ref["decode_s"] / r["decode_s"] if ref else None
    return rows


def print_table(rows: list[dict]) -> None:
    head = (
        f"{'case':<26} {'method':<14} {'MB':>8} {'B/entry':>7} {'/XOR':>5} {'/dense':>6} "
        f"{'enc s':>7} {'enc cpu':>7} {'x XOR':>5} {'dec s':>7} {'dec cpu':>7} {'x XOR':>5}"
    )
    print(head)
    print("-" * len(head))
    prev: dict | None = None
    for r in rows:
        if prev is not None and r["case"] != prev["case"]:
            print(f"{'':<26} read floor (both models once): {prev['read_floor_cpu_s']:.3f} s CPU")
            print()
        prev = r
        per = (
            f"{r['bytes_per_entry']:7.2f}" if r["bytes_per_entry"] is not None and r["method"] != "dense" else "      -"
        )
        rx = f"{r['size_vs_xor']:5.2f}" if r["size_vs_xor"] is not None else "    -"
        ex = f"{r['encode_cpu_speedup_vs_xor']:5.2f}" if r["encode_cpu_speedup_vs_xor"] is not None else "    -"
        dx = f"{r['decode_speedup_vs_xor']:5.2f}" if r["decode_speedup_vs_xor"] is not None else "    -"
        print(
            f"{r['case']:<26} {r['method']:<14} {r['bytes'] / 1e6:8.2f} {per} {rx} {r['vs_dense']:6.3f} "
            f"{r['encode_s']:7.3f} {r['encode_cpu_s']:7.3f} {ex} {r['decode_s']:7.3f} {r['decode_cpu_s']:7.3f} {dx}"
        )
    if rows:
        print(f"{'':<26} read floor (both models once): {rows[-1]['read_floor_cpu_s']:.3f} s CPU")
    print()


def targets(rows: list[dict], method: str = "delta v3") -> list[str]:
    """The targets of issue 30, checked on this run for ``method``: at most the size of XOR + zstd-1 at every
    row, encode at least 2x its speed (CPU time), never more than 1.02x dense."""
    out = []
    by = {(r["case"], r["method"]): r for r in rows}
    for r in rows:
        if r["method"] != method:
            continue
        x = by.get((r["case"], XOR))
        ok_dense = r["vs_dense"] <= 1.02
        line = f"{r['case']}: {method} size/dense {r['vs_dense']:.3f} ({'ok' if ok_dense else 'MISSED'})"
        if x is not None:
            small = r["bytes"] <= x["bytes"]
            fast = r["encode_cpu_speedup_vs_xor"] >= 2.0
            line += (
                f", size/XOR {r['size_vs_xor']:.3f} ({'ok' if small else 'MISSED'}), encode speed x XOR "
                f"{r['encode_cpu_speedup_vs_xor']:.2f} cpu / {r['encode_speedup_vs_xor']:.2f} wall "
                f"({'ok' if fast else 'MISSED'})"
            )
        out.append(line)
    return out


def bench_pair(base_path: str, target_path: str, repeat: int, methods: tuple[str, ...] = ALL_METHODS) -> list[dict]:
    """The codecs on a real pair of checkpoints (e.g. before and after a few optimizer steps)."""
    base, target = load_safetensors(base_path), load_safetensors(target_path)
    base.version, base.applied_hash, target.version = 0, BASE_HASH, 1
    changed = sum(int(np.count_nonzero(raw(base, n) != raw(target, n))) for n in base.arrays)
    total = sum(a.size for a in base.arrays.values())
    label = f"real {Path(target_path).stem} {100 * changed / total:.1f}%"
    return run_case(label, None, base, target, repeat, methods)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--params", type=float, default=48e6, help="synthetic model size (parameters; at least 64 MiB)")
    ap.add_argument("--densities", default="0.001,0.01,0.03,0.10,0.50,1.0", help="comma-separated changed fractions")
    ap.add_argument("--grpo-lr", type=float, default=1e-5, help="learning rate of the GRPO-like case (0: none)")
    ap.add_argument("--repeat", type=int, default=2, help="timing repeats (best is reported)")
    ap.add_argument("--methods", default=",".join(DEFAULT_METHODS), help=f"of {','.join(ALL_METHODS)}, or all")
    ap.add_argument(
        "--real", nargs=2, action="append", metavar=("BASE", "TARGET"), help="also a real checkpoint pair (repeatable)"
    )
    ap.add_argument("--json", metavar="PATH", help="write the rows (one JSON object per row, in a list)")
    args = ap.parse_args(argv)
    methods = ALL_METHODS if args.methods == "all" else tuple(args.methods.split(","))
    if unknown := set(methods) - set(ALL_METHODS):
        ap.error(f"--methods: unknown {sorted(unknown)}")
    t0 = time.perf_counter()
    base = synthetic_model(args.params)
    n = sum(a.size for a in base.arrays.values())
    print(f"synthetic bf16 model: {n / 1e6:.1f}M params, {base.nbytes / 2**20:.1f} MiB, {len(base.arrays)} tensors")
    if zstandard is None:
        print("zstandard not installed: XOR + zstd-1 baseline skipped (pip install zstandard)")
    rows: list[dict] = []
    for d in (float(x) for x in args.densities.split(",")):
        rows += run_case(f"synthetic {100 * d:g}%", d, base, perturb(base, d), args.repeat, methods)
    if args.grpo_lr:
        rows += run_case(
            f"grpo-like lr {args.grpo_lr:g}", None, base, grpo_like(base, args.grpo_lr), args.repeat, methods
        )
    for pair in args.real or []:
        rows += bench_pair(pair[0], pair[1], args.repeat, methods)
    print()
    print_table(rows)
    for m in ("delta v3", "delta v2"):
        for line in targets(rows, m):
            print(line)
    print(f"total {time.perf_counter() - t0:.1f} s, load average at the end {os.getloadavg()[0]:.1f}")
    if args.json:
        meta = {"params": n, "model_mib": base.nbytes / 2**20, "python": platform.python_version(),
                "machine": platform.machine()}  # fmt: skip
        Path(args.json).write_text(json.dumps([{**meta, **r} for r in rows], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
