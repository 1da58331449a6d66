"""Weight-plane costs by model size: delta codec, relay forward CPU and catch-up, tiny to Qwen3-1.7B shapes.

    python -m bench weights-scale --json bench/out/weights-scale.json          # tiny, 0.6B, 1.7B shapes
    python -m bench weights-scale --sizes tiny,0.6b --density 0.01 --json out.json

Models are randomly initialised bf16 checkpoints with the layer shapes of a tiny Qwen3
(~4M parameters: hidden 256, 4 layers, vocab 4096), Qwen3-0.6B (hidden 1024, 28 layers, intermediate 3072, 16/8 heads of 128,
vocab 151936, tied embeddings) and Qwen3-1.7B (hidden 2048, 28 layers, intermediate 6144). One version
changes a uniformly random ``--density`` of the bf16 entries by 1-3 ulps (bench_codec's synthetic update).

Memory: the 24 GiB here are shared, so a model is never held whole: it is generated, perturbed, encoded and
applied in chunks of ``--chunk-layers`` layers (the embedding alone), and the per-chunk figures are summed
(every cost here is per tensor, so the sums are the whole model's). The largest chunk of the 1.7B shape is
its 311M-entry embedding: ~3 GB at peak with base, target and copies.

Per size, one table row and one point of each curve (PNG next to the JSON):

- delta v2 and XOR + zstd-1 (bench_codec's code, same inputs): bytes, bytes per changed entry, encode and
  decode + apply CPU seconds (CPU time: the machine is shared and wall time is noisy);
- relay forward CPU: a real ``rollart-relay`` forwards one version of that size (a delta of the v2 size) to
  one actor; CPU seconds of the relay process (bench_fanout.forward_cpu);
- catch-up after K versions, derived from the measured figures: K x (bytes at 1 Gb/s + decode + apply CPU)
  against a full checkpoint (bytes at 1 Gb/s + SHA-256 at this core's measured speed).

Not here: the actor's in-place update pause in vLLM by size (see bench/RESULTS.md for why) and real GRPO
deltas on the 0.6B shape (``--grpo`` is not implemented; RESULTS.md says what was measured instead).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import hashlib
import json
import os
import platform
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "libs"))
sys.path.insert(0, str(ROOT))

from bench import bench_codec  # noqa: E402
from bench.bench_fanout import forward_cpu  # noqa: E402
from bench.bench_transfer import make_delta  # noqa: E402
from rollart.delta import WeightSet  # noqa: E402

#: name -> (hidden, layers, intermediate, q heads, kv heads, head dim, vocab)
SHAPES: dict[str, tuple[int, int, int, int, int, int, int]] = {
    "tiny": (256, 4, 768, 4, 2, 64, 4096),
    "0.6b": (1024, 28, 3072, 16, 8, 128, 151936),
    "1.7b": (2048, 28, 6144, 16, 8, 128, 151936),
}
METHODS = ("delta v2", bench_codec.XOR)


def chunks(size: str, chunk_layers: int) -> Iterator[dict[str, tuple[int, ...]]]:
    """The model's tensors (HF names, tied embeddings) in groups: the embedding and final norm, then layers."""
    hidden, layers, inter, q, kv, head, vocab = SHAPES[size]
    yield {"model.embed_tokens.weight": (vocab, hidden), "model.norm.weight": (hidden,)}
    for start in range(0, layers, chunk_layers):
        group: dict[str, tuple[int, ...]] = {}
        for i in range(start, min(layers, start + chunk_layers)):
            group |= bench_codec.layer_shapes(hidden, inter, q, kv, head, i)
        yield group


def params_of(size: str) -> int:
    return sum(int(np.prod(s)) for c in chunks(size, 1000) for s in c.values())


def random_bf16(shapes: dict[str, tuple[int, ...]], seed: int) -> WeightSet:
    rng = np.random.default_rng(seed)
    arrays = {}
    for name, shape in shapes.items():
        if len(shape) == 1:
            f = 1.0 + rng.standard_normal(shape, dtype=np.float32) * np.float32(0.05)
        else:
            f = rng.standard_normal(shape, dtype=np.float32) * np.float32(0.02)
        arrays[name] = (f.view(np.uint32) >> 16).astype(np.uint16)
    return WeightSet(arrays, dict.fromkeys(arrays, "BF16"), version=0, applied_hash=bench_codec.BASE_HASH)


def codec_rows(size: str, density: float, chunk_layers: int) -> dict[str, dict[str, float]]:
    """Summed over chunks: bytes, changed entries, encode and decode + apply CPU seconds per method."""
    total: dict[str, dict[str, float]] = {}
    for k, shapes in enumerate(chunks(size, chunk_layers)):
        base = random_bf16(shapes, seed=k)
        target = bench_codec.perturb(base, density, seed=1000 + k)
        for r in bench_codec.run_case(size, density, base, target, repeat=1):
            if r["method"] not in METHODS:
                continue
            t = total.setdefault(r["method"], {"bytes": 0, "entries": 0, "encode_cpu_s": 0.0, "decode_cpu_s": 0.0,
                                               "encode_s": 0.0, "decode_s": 0.0, "dense_bytes": 0})
            for key in t:
                t[key] += r[key]
        del base, target
        gc.collect()
    for t in total.values():
        t["bytes_per_entry"] = t["bytes"] / t["entries"] if t["entries"] else 0.0
    return total


def sha256_s_per_gb(mb: int = 256) -> float:
    buf = np.random.default_rng(0).integers(0, 255, mb << 20, dtype=np.uint8)
    t0 = time.process_time()
    hashlib.sha256(memoryview(buf)).digest()
    return (time.process_time() - t0) / (buf.nbytes / 1e9)


def catch_up(model_bytes: int, v2: dict[str, float], sha_s_per_gb: float, ks: list[int]) -> dict[str, float]:
    link = 1e9 / 8  # 1 Gb/s in bytes per second
    out = {f"deltas K={k}": k * (v2["bytes"] / link + v2["decode_cpu_s"]) for k in ks}
    out["checkpoint"] = model_bytes / link + model_bytes / 1e9 * sha_s_per_gb
    return out


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["sizes"]
    x = [r["params"] / 1e9 for r in rows]
    fig, ax = plt.subplots(2, 2, figsize=(11, 8))
    for m in METHODS:
        ax[0, 0].plot(x, [r["codec"][m]["encode_cpu_s"] for r in rows], "o-", label=f"{m} encode")
        ax[0, 0].plot(x, [r["codec"][m]["decode_cpu_s"] for r in rows], "s--", label=f"{m} decode+apply")
        ax[0, 1].plot(x, [r["codec"][m]["bytes_per_entry"] for r in rows], "o-", label=m)
    ax[0, 0].set(xlabel="parameters (B)", ylabel="CPU s per version", title="codec")
    ax[0, 1].set(xlabel="parameters (B)", ylabel="bytes per changed entry", title="delta size")
    ax[1, 0].plot(x, [r["forward"]["relay_cpu_s"] for r in rows], "o-", label="relay (1 actor)")
    ax[1, 0].plot(x, [r["forward"]["actor_cpu_s"] for r in rows], "s--", label="actor receive + verify")
    ax[1, 0].set(xlabel="parameters (B)", ylabel="CPU s per version", title="forwarding one version")
    for r in rows:
        ks = [k for k in result["args"]["k"]]
        ax[1, 1].plot(ks, [r["catch_up_s"][f"deltas K={k}"] for k in ks], "o-", label=f"{r['size']} deltas")
        ax[1, 1].axhline(r["catch_up_s"]["checkpoint"], ls=":", color=ax[1, 1].lines[-1].get_color(),
                         label=f"{r['size']} checkpoint")
    ax[1, 1].set(xlabel="versions missed K", ylabel="seconds at 1 Gb/s", title="catch-up", yscale="log")
    for a in ax.flat:
        a.legend(fontsize=7)
        a.grid(alpha=0.3)
    fig.suptitle(f"weight plane by model size (density {result['args']['density']:.0%})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="tiny,0.6b,1.7b")
    ap.add_argument("--density", type=float, default=0.01, help="fraction of bf16 entries changed per version")
    ap.add_argument("--chunk-layers", type=int, default=4)
    ap.add_argument("--k", default="1,3,10,30", help="versions missed, for catch-up")
    ap.add_argument("--no-forward", action="store_true", help="skip the relay forward CPU (no relay process)")
    ap.add_argument("--json", type=Path, help="write the figures here (and the curves to the same name .png)")
    a = ap.parse_args(argv)
    ks = [int(k) for k in a.k.split(",")]
    result: dict = {
        "args": {"sizes": a.sizes, "density": a.density, "chunk_layers": a.chunk_layers, "k": ks},
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "loadavg_start": os.getloadavg()},
        "sizes": [],
    }
    sha = sha256_s_per_gb()
    result["sha256_s_per_gb"] = sha
    version = 0
    for size in a.sizes.split(","):
        t0 = time.perf_counter()
        params = params_of(size)
        codec = codec_rows(size, a.density, a.chunk_layers)
        v2 = codec["delta v2"]
        row: dict = {"size": size, "params": params, "model_bytes": 2 * params, "codec": codec}
        if not a.no_forward:
            version += 1
            segs = make_delta(v2["bytes"] / 1e6, version, segment_kb=1024)
            with tempfile.TemporaryDirectory(prefix="bench-scale-") as d:
                f = asyncio.run(forward_cpu(segs, version, 1, 2, Path(d)))
            del segs
            row["forward"] = {
                "bytes": f["gb"] * 1e9,
                "relay_cpu_s": f["relay_cpu_s_per_gb"] * f["gb"],
                "actor_cpu_s": f["actor_cpu_s_per_gb"] * f["gb"],
                "relay_cpu_s_per_gb": f["relay_cpu_s_per_gb"],
            }
        else:
            row["forward"] = {"bytes": 0, "relay_cpu_s": float("nan"), "actor_cpu_s": float("nan")}
        row["catch_up_s"] = catch_up(2 * params, v2, sha, ks)
        row["seconds"] = time.perf_counter() - t0
        result["sizes"].append(row)
        gc.collect()
        print(f"{size}: done in {row['seconds']:.0f} s", flush=True)
        if a.json:  # after every size: a long run that is stopped keeps what it measured
            a.json.parent.mkdir(parents=True, exist_ok=True)
            a.json.write_text(json.dumps(result, indent=1, default=str))
    result["machine"]["loadavg_end"] = os.getloadavg()

    print(f"density {a.density:.1%}; CPU seconds per version (the machine is shared: CPU time, not wall)")
    print(f"{'size':<6} {'params':>8} {'method':<14} {'MB':>8} {'B/entry':>8} {'enc CPU s':>10} {'dec+apply s':>11} "
          f"{'vs XOR size':>11} {'enc speed vs XOR':>16}")
    for r in result["sizes"]:
        xor = r["codec"][bench_codec.XOR]
        for m in METHODS:
            c = r["codec"][m]
            print(f"{r['size']:<6} {r['params'] / 1e9:>7.3f}B {m:<14} {c['bytes'] / 1e6:>8.2f} "
                  f"{c['bytes_per_entry']:>8.2f} {c['encode_cpu_s']:>10.2f} {c['decode_cpu_s']:>11.2f} "
                  f"{c['bytes'] / xor['bytes']:>10.2f}x {xor['encode_cpu_s'] / c['encode_cpu_s']:>15.2f}x")
    print(f"\n{'size':<6} {'relay fwd CPU s':>15} {'s/GB':>6} {'actor CPU s':>11} " +
          " ".join(f"{k:>14}" for k in result["sizes"][0]["catch_up_s"]))
    for r in result["sizes"]:
        fw = r["forward"]
        print(f"{r['size']:<6} {fw['relay_cpu_s']:>15.3f} {fw.get('relay_cpu_s_per_gb', float('nan')):>6.2f} "
              f"{fw['actor_cpu_s']:>11.3f} " + " ".join(f"{v:>14.2f}" for v in r["catch_up_s"].values()))
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps(result, indent=1, default=str))
        plot(result, a.json.with_suffix(".png"))
        print(f"wrote {a.json} and {a.json.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
