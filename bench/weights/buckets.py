"""Weight buckets through Mooncake vs a safetensors file on local disk (the baseline).

    python -m bench buckets                          # tiny Qwen3 (built here) + a 1 GiB synthetic bf16 model
    python -m bench buckets --tiny DIR --gib 0.25    # reuse a tiny model dir; a smaller synthetic model

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

Hidden pull (``--rollout-s``, default 3 s): an actor process runs the actor's own ``WeightManager`` (its
background bucket watcher) while a stand-in for generation keeps its event loop and a core busy; this
process publishes version v, the actor keeps "generating" for ``rollout-s`` and then asks
``PullBuckets(v, apply)`` as the trainer's next step would. Per update: accumulated pull (start to verified
weights, wherever it ran), exposed pull (what PullBuckets waited for), swap (the apply: payload written
and loaded by a stand-in engine). The same run without the watcher gives the all-exposed baseline.
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

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "libs"))

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


def actor_worker(master: str, model_dir: str, background: bool) -> None:
    """The actor side of the hidden-pull rows: JSON {"version", "rollout_s"} per line on stdin."""
    import asyncio

    from rollart_actor.weights import HostWeights, WeightManager

    class SwapEngine:
        version = 0

        async def update_weights(self, payload, to_version, *, mode="keep", wait_timeout=60.0, after_load=None):  # type: ignore[no-untyped-def]
            from types import SimpleNamespace

            t0 = time.perf_counter()
            ws = load_safetensors(payload)
            _ = sum(int(np.asarray(a).reshape(-1)[:1].sum()) for a in ws.arrays.values())
            if after_load is not None:
                after_load()
            self.version = to_version
            dt = time.perf_counter() - t0
            return SimpleNamespace(requests_recomputed=0, recomputed_tokens=0, prefix_cache_reset=False,
                                   pause_window_s=dt, load_s=dt, aborted=0, rpc={"tensors": len(ws.arrays)},
                                   completed_at=time.time())

    async def generate(seconds: float) -> int:
        """Stand-in for decoding: ~5 ms of matrix work per step on the event loop, as an engine's steps."""
        a = np.random.default_rng(0).standard_normal((192, 192)).astype(np.float32)
        steps, end = 0, time.monotonic() + seconds
        while time.monotonic() < end:
            a = np.tanh(a @ a)
            steps += 1
            await asyncio.sleep(0)
        return steps

    async def run() -> None:
        with tempfile.TemporaryDirectory(prefix="bench-actor-") as work:
            host = HostWeights.load(model_dir, 0)
            manager = WeightManager(host, SwapEngine(), Path(work), key=None, job=JOB)
            manager.background_pulls = background
            if background:
                manager.watch_buckets(master, interval=0.1)
            loop = asyncio.get_running_loop()
            print("READY", flush=True)
            while True:
                line = await loop.run_in_executor(None, sys.stdin.readline)
                if not line or json.loads(line).get("op") == "exit":
                    break
                cmd = json.loads(line)
                steps = await generate(cmd["rollout_s"])
                await manager.pull_buckets(master, cmd["version"], apply=True)
                acc = manager.pull_accounts[-1]
                print(json.dumps({"accumulated": acc.accumulated_s, "exposed": acc.exposed_s, "swap": acc.swap_s,
                                  "background": acc.background, "steps": steps}), flush=True)
            await manager.stop_buckets()

    asyncio.run(run())
    os._exit(0)


def hidden_rows(ws: WeightSet, master: str, work: Path, bucket_bytes: int, repeat: int, rollout_s: float) -> dict:
    """Per mode (background watcher / none): accumulated, exposed and swap seconds per update (medians)."""
    model_dir = work / "hidden-model"
    model_dir.mkdir(exist_ok=True)
    save_safetensors(model_dir / "model.safetensors", ws)
    pub = BucketPublisher(MooncakeConfig(master), JOB, bucket_bytes=bucket_bytes, keep_versions=2)
    out: dict = {}
    version = 100
    try:
        for background in (True, False):
            argv = [sys.executable, __file__, "--actor-worker", master, "--model-dir", str(model_dir)]
            proc = subprocess.Popen(argv + (["--background"] if background else []), stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
            assert proc.stdout is not None and proc.stdin is not None
            assert proc.stdout.readline().strip() == "READY"
            rows = []
            for _ in range(repeat + 1):
                version += 1
                pub.publish(version, perturbed(ws, version))  # the trainer publishes; the actor keeps generating
                proc.stdin.write(json.dumps({"version": version, "rollout_s": rollout_s}) + "\n")
                proc.stdin.flush()
                rows.append(json.loads(proc.stdout.readline()))
            proc.stdin.write(json.dumps({"op": "exit"}) + "\n")
            proc.stdin.flush()
            proc.wait(60)
            steady = rows[1:]  # the first update also connects the actor's Mooncake client
            acc = statistics.median(r["accumulated"] for r in steady)
            exp = statistics.median(r["exposed"] for r in steady)
            out["background" if background else "on demand"] = {
                "accumulated_s": acc,
                "exposed_s": exp,
                "swap_s": statistics.median(r["swap"] for r in steady),
                "hidden": 1 - sum(r["exposed"] for r in steady) / sum(r["accumulated"] for r in steady),
                "updates": rows,
            }
    finally:
        pub.close()
    return out


def hidden_table(label: str, rows: dict, rollout_s: float) -> list[str]:
    lines = [f"#### {label}: pull hidden behind {rollout_s:g} s of rollout", "",
             "| actor | accumulated pull s | exposed pull s | hidden | swap s | exposed vs on demand |",
             "|---|---:|---:|---:|---:|---:|"]
    base = rows["on demand"]["exposed_s"]
    for mode, r in rows.items():
        lines.append(f"| {mode} | {r['accumulated_s']:.3f} | {r['exposed_s']:.3f} | {r['hidden']:.0%} | "
                     f"{r['swap_s']:.3f} | {r['exposed_s'] / base:.2f}x |")
    return lines + [""]


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
    ap.add_argument("--actor-worker", metavar="MASTER", help=argparse.SUPPRESS)
    ap.add_argument("--model-dir", help=argparse.SUPPRESS)
    ap.add_argument("--background", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--rollout-s", type=float, default=3.0, help="rollout between publish and update (0: skip)")
    ap.add_argument("--skip-disk", action="store_true", help="only the hidden-pull rows")
    ap.add_argument("--json", type=Path, help="write the figures here")
    ap.add_argument("--tiny", type=Path, help="a tiny Qwen3 directory (default: build one with --pretrain-steps 0)")
    ap.add_argument("--gib", type=float, default=1.0, help="synthetic model size in GiB (0 to skip)")
    ap.add_argument("--bucket-mib", type=int, default=1024, help="bucket size in MiB")
    ap.add_argument("--repeat", type=int, default=3, help="steady-state repeats (median reported)")
    args = ap.parse_args(argv)
    if args.worker:
        worker(args.worker)
        return 0
    if args.actor_worker:
        actor_worker(args.actor_worker, args.model_dir, args.background)
        return 0
    result: dict = {"args": {k: str(v) for k, v in vars(args).items()}, "loadavg": os.getloadavg(), "models": {}}
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
                entry: dict = {"bytes": ws.nbytes}
                if not args.skip_disk:
                    disk = disk_rows(ws, work, args.repeat)
                    mc, buckets = mooncake_rows(ws, master.address, args.bucket_mib << 20, args.repeat)
                    lines = table(label, ws.nbytes, disk, mc, buckets)
                    print("\n".join(lines), flush=True)
                    out += lines
                    entry |= {"disk": disk, "mooncake": mc, "buckets": buckets}
                if args.rollout_s > 0:
                    hidden = hidden_rows(ws, master.address, work, args.bucket_mib << 20, args.repeat, args.rollout_s)
                    lines = hidden_table(label, hidden, args.rollout_s)
                    print("\n".join(lines), flush=True)
                    entry["hidden_pull"] = hidden
                result["models"][label] = entry
        finally:
            master.stop()
    print(f"bucket size {args.bucket_mib} MiB; total {time.perf_counter() - t0:.1f} s")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
