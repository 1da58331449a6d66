"""Weight buckets through Mooncake vs a safetensors file on local disk (the baseline).

    python bench/bench_buckets.py                          # tiny Qwen3 (built here) + a 1 GiB synthetic bf16 model
    python bench/bench_buckets.py --tiny DIR --gib 0.25    # reuse a tiny model dir; a smaller synthetic model

A real ``mooncake_master`` on loopback; the publisher is this process (it lends the store its segment),
the puller is a second process (the transfer engine's TCP path, as between a trainer and an actor).

Rows, per model:
- mooncake publish: ``BucketPublisher.publish`` = pack into the registered staging buffer + SHA-256 of
  every bucket (overlapped) + ``batch_upsert_from`` (hard-pinned) + manifest + latest pointer. First
  publish (buffers and segment pages are new) and steady state (median of later versions).
- mooncake pull (other process): ``BucketReader.pull`` = manifest + ``batch_get_into`` into one registered
  buffer + SHA-256 of every bucket. Into a new buffer each time, and into a reused one (``out=``).
- disk write: ``save_safetensors`` (write + fsync + rename). disk read: the whole file into a new buffer,
  warm (page cache) and cold (pages dropped with posix_fadvise DONTNEED first); the same + SHA-256 as the
  checkpoint store does on open.
GB/s = model bytes / seconds. "vs disk" = disk time / this time for the same direction (higher is better;
publish is compared with the disk write, pulls with the cold read + SHA-256, the read a joiner does).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "libs"))

from rollart.delta import WeightSet, load_safetensors, save_safetensors  # noqa: E402
from rollart.local.mooncake import start_mooncake_master  # noqa: E402
from rollart.weights.buckets import BucketPublisher, BucketReader, MooncakeConfig  # noqa: E402

JOB = "bench-buckets"


def synthetic_model(gib: float, seed: int = 0) -> WeightSet:
    """Qwen-shaped bf16 tensors (random bit patterns) totalling about ``gib`` GiB."""
    hidden, inter, vocab = 2048, 6144, 32768
    per_layer = {
        "self_attn.q_proj.weight": (hidden, hidden),
        "self_attn.k_proj.weight": (hidden // 4, hidden),
        "self_attn.v_proj.weight": (hidden // 4, hidden),
        "self_attn.o_proj.weight": (hidden, hidden),
        "mlp.gate_proj.weight": (inter, hidden),
        "mlp.up_proj.weight": (inter, hidden),
        "mlp.down_proj.weight": (hidden, inter),
        "input_layernorm.weight": (hidden,),
        "post_attention_layernorm.weight": (hidden,),
    }
    layer_bytes = 2 * sum(int(np.prod(s)) for s in per_layer.values())
    target = int(gib * (1 << 30))
    layers = max(1, (target - 2 * vocab * hidden) // layer_bytes)
    shapes = {"model.embed_tokens.weight": (vocab, hidden), "model.norm.weight": (hidden,)}
    for i in range(layers):
        shapes |= {f"model.layers.{i}.{k}": s for k, s in per_layer.items()}
    rng = np.random.default_rng(seed)
    arrays = {n: rng.integers(0, 1 << 16, s, dtype=np.uint16) for n, s in shapes.items()}
    return WeightSet(arrays, {n: "BF16" for n in arrays})


def perturbed(ws: WeightSet, version: int) -> WeightSet:
    """The next "version": a few bytes changed in every tensor (content differs, sizes do not)."""
    arrays = {}
    for n, a in ws.arrays.items():
        b = a.copy() if a.size < (1 << 20) else a  # big tensors shared: publish packs a copy anyway
        if b is not a:
            b.reshape(-1)[:1] ^= np.uint16(version)
        arrays[n] = b
    return WeightSet(arrays, dict(ws.dtypes), version=version)


# ---------------------------------------------------------------------------------------------------------
# the puller process


def worker(master: str) -> None:
    reader = BucketReader(MooncakeConfig(master), JOB)
    reader.client.connect()
    reuse: np.ndarray | None = None
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["op"] == "exit":
            break
        out = None
        if cmd.get("reuse"):
            m = reader.manifest(cmd["version"])
            if reuse is None or reuse.nbytes < m.total_bytes:
                reuse = np.empty(m.total_bytes, np.uint8)
                reuse[:] = 0  # fault the pages in once, as a long-lived actor buffer would be
            out = reuse
        t0 = time.perf_counter()
        got = reader.pull(cmd["version"], verify=cmd.get("verify", True), out=out)
        total = time.perf_counter() - t0
        print(
            json.dumps(
                {
                    "total": total,
                    "transfer": got.transfer_s,
                    "verify": got.verify_s,
                    "bytes": got.nbytes,
                    "buckets": len(got.manifest.buckets),
                }
            ),
            flush=True,
        )
        del got
    os._exit(0)


class Puller:
    def __init__(self, master: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--worker", master],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def pull(self, version: int, **kw: object) -> dict:
        self.proc.stdin.write(json.dumps({"op": "pull", "version": version, **kw}) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("puller process died")
        return json.loads(line)

    def close(self) -> None:
        self.proc.stdin.write(json.dumps({"op": "exit"}) + "\n")
        self.proc.stdin.flush()
        self.proc.wait(30)


# ---------------------------------------------------------------------------------------------------------
# measurements


def drop_cache(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def read_file(path: Path, hash_it: bool) -> float:
    t0 = time.perf_counter()
    size = path.stat().st_size
    buf = np.empty(size, np.uint8)
    with open(path, "rb", buffering=0) as f:
        view = memoryview(buf)
        pos = 0
        while pos < size:
            n = f.readinto(view[pos : pos + (64 << 20)])
            if not n:
                break
            pos += n
    if hash_it:
        hashlib.sha256(buf).hexdigest()
    return time.perf_counter() - t0


def disk_rows(ws: WeightSet, workdir: Path, repeat: int) -> dict[str, float]:
    path = workdir / "model.safetensors"
    writes, warm, cold, cold_hash = [], [], [], []
    for _ in range(repeat):
        t0 = time.perf_counter()
        save_safetensors(path, ws)
        writes.append(time.perf_counter() - t0)
        warm.append(read_file(path, hash_it=False))
        drop_cache(path)
        cold.append(read_file(path, hash_it=False))
        drop_cache(path)
        cold_hash.append(read_file(path, hash_it=True))
    path.unlink()
    return {
        "write": statistics.median(writes),
        "read warm": statistics.median(warm),
        "read cold": statistics.median(cold),
        "read cold + sha256": statistics.median(cold_hash),
    }


def mooncake_rows(ws: WeightSet, master: str, bucket_bytes: int, repeat: int) -> tuple[dict[str, float], int]:
    pub = BucketPublisher(MooncakeConfig(master), JOB, bucket_bytes=bucket_bytes, keep_versions=1)
    puller = Puller(master)
    try:
        publishes = []
        parts: dict[str, list[float]] = {"pack": [], "put + hash": [], "commit": []}
        pulls: dict[str, list[float]] = {"new buffer": [], "reused buffer": [], "reused, no verify": []}
        transfer = []
        buckets = 0
        for v in range(1, repeat + 2):
            w = ws if v == 1 else perturbed(ws, v)
            t0 = time.perf_counter()
            prepared = pub.prepare(v, w)
            t1 = time.perf_counter()
            m = pub.commit(prepared)
            publishes.append(time.perf_counter() - t0)
            parts["pack"].append(prepared.pack_s)
            parts["put + hash"].append(prepared.put_s)
            parts["commit"].append(time.perf_counter() - t1)
            buckets = len(m.buckets)
            r = puller.pull(v)
            pulls["new buffer"].append(r["total"])
            transfer.append(r["transfer"])
            pulls["reused buffer"].append(puller.pull(v, reuse=True)["total"])
            pulls["reused, no verify"].append(puller.pull(v, reuse=True, verify=False)["total"])
        rows = {"publish (first)": publishes[0], "publish (steady)": statistics.median(publishes[1:])}
        rows |= {f"  of which {k}": statistics.median(x[1:]) for k, x in parts.items()}
        rows |= {f"pull, {k}": statistics.median(x[1:]) for k, x in pulls.items()}
        rows["  of which transfer (new buffer)"] = statistics.median(transfer[1:])
        return rows, buckets
    finally:
        puller.close()
        pub.close()


def table(label: str, nbytes: int, disk: dict[str, float], mc: dict[str, float], buckets: int) -> list[str]:
    lines = [
        f"### {label}: {nbytes / 1e9:.3f} GB, {buckets} bucket(s)",
        "",
        "| path | operation | seconds | GB/s | vs disk |",
        "|---|---|---:|---:|---:|",
    ]
    for op, s in disk.items():
        lines.append(f"| disk (safetensors) | {op} | {s:.3f} | {nbytes / s / 1e9:.2f} | |")
    for op, s in mc.items():
        ref = disk["write"] if op.startswith("publish") else disk["read cold + sha256"]
        vs = "" if op.startswith("  ") else f"{ref / s:.2f}x"
        lines.append(f"| mooncake | {op} | {s:.3f} | {nbytes / s / 1e9:.2f} | {vs} |")
    return lines + [""]


def build_tiny(out: Path) -> Path:
    subprocess.run(
        [str(Path(sys.executable).parent / "rollart-devtools"), "tiny-model", "--out", str(out), "--pretrain-steps", "0"],
        check=True,
        capture_output=True,
    )
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worker", metavar="MASTER", help=argparse.SUPPRESS)
    ap.add_argument("--tiny", type=Path, help="a tiny Qwen3 directory (default: build one with --pretrain-steps 0)")
    ap.add_argument("--gib", type=float, default=1.0, help="synthetic model size in GiB (0 to skip)")
    ap.add_argument("--bucket-mib", type=int, default=1024, help="bucket size in MiB")
    ap.add_argument("--repeat", type=int, default=3, help="steady-state repeats (median reported)")
    args = ap.parse_args(argv)
    if args.worker:
        worker(args.worker)
        return 0
    t0 = time.perf_counter()
    os.environ.setdefault("MC_LOG_LEVEL", "WARNING")
    with tempfile.TemporaryDirectory(prefix="bench-buckets-") as tmp:
        work = Path(tmp)
        master = start_mooncake_master(work / "mooncake")
        out: list[str] = []
        try:
            models: list[tuple[str, WeightSet]] = []
            tiny = args.tiny or build_tiny(work / "tiny")
            mapped = load_safetensors(tiny / "model.safetensors")  # copied into memory, like the synthetic one
            models.append(("tiny Qwen3", WeightSet({n: np.array(a) for n, a in mapped.arrays.items()}, mapped.dtypes)))
            if args.gib > 0:
                models.append((f"synthetic bf16 {args.gib:g} GiB", synthetic_model(args.gib)))
            for label, ws in models:
                disk = disk_rows(ws, work, args.repeat)
                mc, buckets = mooncake_rows(ws, master.address, args.bucket_mib << 20, args.repeat)
                lines = table(label, ws.nbytes, disk, mc, buckets)
                print("\n".join(lines), flush=True)
                out += lines
        finally:
            master.stop()
    print(f"bucket size {args.bucket_mib} MiB; total {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
