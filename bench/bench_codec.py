"""Codec benchmark: rollart sparse delta vs int32-index+value pairs vs XOR + zstd-1 vs memcpy.

    python bench/bench_codec.py                      # synthetic ~100M-param bf16 model, 1/3/10 % density
    python bench/bench_codec.py --params 20e6        # smaller
    python bench/bench_codec.py --real A.safetensors B.safetensors   # plus a real pair (e.g. tiny Qwen3
                                                                     # before/after a few optimizer steps)

Sizes: total bytes and bytes per changed entry. Speeds: GB/s of *dense* model bytes (the model size
divided by the time), so every method is measured against the same yardstick as a plain memcpy.
- rollart encode = compare + extract + LEB128 + segment + CRC-32 + HMAC + h(v);
  decode = parse + verify every check + apply into a copy of the base.
- int32 pairs: encode = compare + positions as int32 + gather values; decode = scatter. No integrity checks.
- XOR + zstd-1 (what slime / NeMo-RL send): encode = XOR of every tensor + zstd level 1;
  decode = decompress + XOR into the base. No integrity checks.
Synthetic updates change a uniformly random fraction of bf16 entries by 1-3 ulps (small optimizer
steps), which favours XOR + zstd (its XOR words are mostly zero with few low bits set).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "libs"))

from rollart.delta import WeightSet, apply_delta, decode_delta, encode_delta, load_safetensors  # noqa: E402
from rollart.delta.dtypes import BY_NAME  # noqa: E402

try:
    import zstandard
except ImportError:  # the baseline is skipped, not faked
    zstandard = None

KEY = b"bench-job-key-0123456789abcdef!!"


def synthetic_model(params: float, seed: int = 0) -> WeightSet:
    """A Qwen3-shaped bf16 checkpoint of about ``params`` parameters (HF names)."""
    hidden, inter, vocab = 1024, 3072, 32000
    per_layer = hidden * hidden * 2 + 2 * (hidden // 2) * hidden + 3 * hidden * inter
    layers = max(1, int((params - vocab * hidden) // per_layer))
    rng = np.random.default_rng(seed)
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (vocab, hidden)}
    for i in range(layers):
        p = f"model.layers.{i}."
        shapes |= {
            p + "self_attn.q_proj.weight": (hidden, hidden),
            p + "self_attn.k_proj.weight": (hidden // 2, hidden),
            p + "self_attn.v_proj.weight": (hidden // 2, hidden),
            p + "self_attn.o_proj.weight": (hidden, hidden),
            p + "mlp.gate_proj.weight": (inter, hidden),
            p + "mlp.up_proj.weight": (inter, hidden),
            p + "mlp.down_proj.weight": (hidden, inter),
            p + "input_layernorm.weight": (hidden,),
        }
    arrays = {}
    for name, shape in shapes.items():
        f = rng.standard_normal(shape, dtype=np.float32) * np.float32(0.02)
        arrays[name] = (f.view(np.uint32) >> 16).astype(np.uint16)  # bf16 bit patterns
    return WeightSet(arrays, {n: "BF16" for n in arrays}, version=0)


def perturb(ws: WeightSet, density: float, seed: int = 1) -> WeightSet:
    rng = np.random.default_rng(seed)
    out = {}
    for name, a in ws.arrays.items():
        b = a.copy()
        flat = b.reshape(-1)
        pos = np.flatnonzero(rng.random(flat.size) < density)
        step = rng.integers(1, 4, pos.size).astype(np.uint16)
        flat[pos] = np.where(rng.random(pos.size) < 0.5, flat[pos] + step, flat[pos] - step)
        out[name] = b
    return WeightSet(out, dict(ws.dtypes), version=1)


def best(fn: Callable[[], object], repeat: int, setup: Callable[[], object] | None = None) -> tuple[float, object]:
    times, result = [], None
    for _ in range(repeat):
        arg = setup() if setup else None
        t = time.perf_counter()
        result = fn(arg) if setup else fn()  # type: ignore[call-arg]
        times.append(time.perf_counter() - t)
    return min(times), result


def copy_arrays(ws: WeightSet) -> dict[str, np.ndarray]:
    return {n: a.copy() for n, a in ws.arrays.items()}


def raw(ws: WeightSet, name: str) -> np.ndarray:
    return ws.arrays[name].reshape(-1).view(BY_NAME[ws.dtypes[name]].raw)


def run_case(label: str, base: WeightSet, target: WeightSet, repeat: int) -> list[dict[str, object]]:
    dense = base.nbytes
    names = list(base.arrays)
    rows: list[dict[str, object]] = []

    # rollart delta
    t_enc, segs = best(lambda: list(encode_delta(base, target, job="bench", version=1, key=KEY)), repeat)
    size = sum(len(s) for s in segs)  # type: ignore[union-attr]

    def ours_decode(w: WeightSet) -> WeightSet:
        apply_delta(decode_delta(segs, KEY), w)  # type: ignore[arg-type]
        return w

    t_dec, out = best(ours_decode, repeat, setup=lambda: WeightSet(copy_arrays(base), base.dtypes, version=0))
    entries = decode_delta(segs, KEY).total_entries  # type: ignore[arg-type]
    assert all(np.array_equal(raw(out, n), raw(target, n)) for n in names), "rollart delta is not exact"  # type: ignore[arg-type]
    rows.append(dict(case=label, method="rollart delta", bytes=size, t_enc=t_enc, t_dec=t_dec))

    # int32 index + value pairs
    def pairs_encode() -> list[tuple[str, np.ndarray, np.ndarray]]:
        out = []
        for n in names:
            a, b = raw(base, n), raw(target, n)
            idx = np.flatnonzero(a != b).astype(np.int32)
            out.append((n, idx, b[idx]))
        return out

    t_enc, pairs = best(pairs_encode, repeat)

    def pairs_decode(arrs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        for n, idx, vals in pairs:  # type: ignore[union-attr]
            arrs[n].reshape(-1)[idx] = vals
        return arrs

    t_dec, _ = best(pairs_decode, repeat, setup=lambda: copy_arrays(base))
    size = sum(idx.nbytes + vals.nbytes for _, idx, vals in pairs)  # type: ignore[union-attr]
    rows.append(dict(case=label, method="int32 idx + value", bytes=size, t_enc=t_enc, t_dec=t_dec))

    # XOR + zstd level 1
    if zstandard is not None:
        cctx, dctx = zstandard.ZstdCompressor(level=1), zstandard.ZstdDecompressor()

        def xz_encode() -> list[tuple[str, bytes]]:
            return [(n, cctx.compress(np.bitwise_xor(raw(base, n), raw(target, n)).tobytes())) for n in names]

        t_enc, blobs = best(xz_encode, repeat)

        def xz_decode(arrs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
            for n, blob in blobs:  # type: ignore[union-attr]
                flat = arrs[n].reshape(-1)
                x = np.frombuffer(dctx.decompress(blob, max_output_size=flat.nbytes), dtype=flat.dtype)
                np.bitwise_xor(flat, x, out=flat)
            return arrs

        t_dec, got = best(xz_decode, repeat, setup=lambda: copy_arrays(base))
        assert all(np.array_equal(got[n], target.arrays[n]) for n in names)  # type: ignore[index]
        size = sum(len(b) for _, b in blobs)  # type: ignore[union-attr]
        rows.append(dict(case=label, method="XOR + zstd-1", bytes=size, t_enc=t_enc, t_dec=t_dec))

    # memcpy of the dense tensors (a full-weight transfer's local cost)
    dst = copy_arrays(base)

    def memcpy() -> None:
        for n in names:
            np.copyto(dst[n], target.arrays[n])

    t_cp, _ = best(memcpy, repeat)
    rows.append(dict(case=label, method="memcpy (dense)", bytes=dense, t_enc=t_cp, t_dec=t_cp))
    for r in rows:
        r["entries"] = entries
        r["dense"] = dense
    return rows


def print_table(rows: list[dict[str, object]]) -> None:
    head = (
        f"{'case':<24} {'method':<18} {'size MB':>9} {'B/entry':>8} {'vs int32':>8} "
        f"{'enc GB/s':>9} {'dec GB/s':>9} {'dec vs memcpy':>13}"
    )
    print(head)
    print("-" * len(head))
    by_case: dict[object, dict[object, dict[str, object]]] = {}
    for r in rows:
        by_case.setdefault(r["case"], {})[r["method"]] = r
    for case, methods in by_case.items():
        ref = methods.get("int32 idx + value")
        cp = methods["memcpy (dense)"]
        for m, r in methods.items():
            dense, entries = int(r["dense"]), int(r["entries"])  # type: ignore[call-overload]
            size = int(r["bytes"])  # type: ignore[call-overload]
            per = f"{size / entries:8.2f}" if entries and m != "memcpy (dense)" else f"{'-':>8}"
            dense_row = m == "memcpy (dense)"
            vs = f"{size / int(ref['bytes']):8.2f}" if ref and int(ref["bytes"]) and not dense_row else f"{'-':>8}"  # type: ignore[call-overload]
            enc = dense / float(r["t_enc"]) / 1e9  # type: ignore[arg-type]
            dec = dense / float(r["t_dec"]) / 1e9  # type: ignore[arg-type]
            rel = float(cp["t_dec"]) / float(r["t_dec"])  # type: ignore[arg-type]
            print(f"{case!s:<24} {m:<18} {size / 1e6:9.2f} {per} {vs} {enc:9.2f} {dec:9.2f} {rel:12.2f}x")
        print()


def bench_pair(base_path: str, target_path: str, repeat: int = 2) -> list[dict[str, object]]:
    """The codec on a real pair of checkpoints (e.g. a tiny Qwen3 before and after a few optimizer steps)."""
    base, target = load_safetensors(base_path), load_safetensors(target_path)
    base.version, target.version = 0, 1
    changed = sum(int(np.count_nonzero(raw(base, n) != raw(target, n))) for n in base.arrays)
    total = sum(a.size for a in base.arrays.values())
    return run_case(f"real {100 * changed / total:.2f}%", base, target, repeat)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--params", type=float, default=100e6, help="synthetic model size (parameters)")
    ap.add_argument("--densities", default="0.01,0.03,0.10", help="comma-separated changed fractions")
    ap.add_argument("--repeat", type=int, default=3, help="timing repeats (best is reported)")
    ap.add_argument("--real", nargs=2, metavar=("BASE", "TARGET"), help="also a real checkpoint pair")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    base = synthetic_model(args.params)
    n = sum(a.size for a in base.arrays.values())
    print(f"synthetic bf16 model: {n / 1e6:.1f}M params, {base.nbytes / 1e6:.0f} MB, {len(base.arrays)} tensors")
    if zstandard is None:
        print("zstandard not installed: XOR + zstd-1 baseline skipped (pip install zstandard)")
    rows: list[dict[str, object]] = []
    for d in (float(x) for x in args.densities.split(",")):
        rows += run_case(f"synthetic {100 * d:g}%", base, perturb(base, d), args.repeat)
    if args.real:
        rows += bench_pair(*args.real, repeat=args.repeat)
    print()
    print_table(rows)
    print(f"total {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
