"""Striped transfer benchmark: one delta over S = 1, 2, 4, 8 TCP streams through an emulated WAN path.

    .venv/bin/python -m bench transfer                 # ~40 MB delta, 50 MB/s link, 16 MB/s per flow
    .venv/bin/python -m bench transfer --mb 20 --repeat 1

Path: trainer (this process, ``rollart.weights.transport.send_delta``) -> ``libs/rollart/netem/wan.py`` (its own
process) -> a real ``rollart-relay`` process, which verifies every segment and ``h(v)`` before it answers
DONE; the time is from the first byte sent until that DONE. The emulator gives every TCP connection a rate cap
(what one flow gets on a long lossy path), a shared link capacity, a round-trip delay and random loss-like
stalls per connection (a stalled stripe does not hold the others back: the sender hands the next segment to
the next ready stripe). Reference: AuroraRL reports 4.71 s -> 2.90 s (1.62x) from 4 streams.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "libs"))
sys.path.insert(0, str(ROOT))

from rollart.delta import DeltaWriter  # noqa: E402
from rollart.weights import transport as tp  # noqa: E402

KEY = b"bench-transfer-key-0123456789abcdef"
JOB = "bench"


_CHANGES: dict[tuple[int, int], list[tuple[np.ndarray, np.ndarray]]] = {}  # (tensors, seed) -> positions, values


def make_delta(mb: float, version: int, seed: int = 0, segment_kb: int = 512) -> list[bytes]:
    """A delta of about ``mb`` MB: bf16 tensors of 16M entries with 10 % of their positions changed, in
    segments of at most ``segment_kb`` KiB (the unit of striping and of cut-through forwarding)."""
    rng = np.random.default_rng(seed)
    per_tensor = 16 * 1024 * 1024
    density = 0.10
    bytes_per_tensor = per_tensor * density * 3.1  # ~1.1 index bytes + 2 value bytes per entry
    n_tensors = max(1, round(mb * 1e6 / bytes_per_tensor))
    # format 1 (raw streams): the transfer is sized by the bytes above, which format 2 would compress
    w = DeltaWriter(
        job=JOB,
        version=version,
        base_version=version - 1,
        key=KEY,
        max_segment_bytes=segment_kb * 1024,
        format_version=1,
    )
    out: list[bytes] = []
    key = (n_tensors, seed)
    if key not in _CHANGES:  # drawing the positions is most of the time; each version only re-encodes them
        _CHANGES.clear()
        _CHANGES[key] = []
        for _ in range(n_tensors):
            idx = np.flatnonzero(rng.random(per_tensor) < density)
            _CHANGES[key].append((idx, rng.integers(0, 1 << 16, idx.size, dtype=np.uint16)))
    for t, (idx, vals) in enumerate(_CHANGES[key]):
        out.extend(w.add_tensor(f"model.layers.{t}.mlp.down_proj.weight", "BF16", (per_tensor,), idx, vals))
    out.append(w.trailer())
    return out


def start_relay(tmp: Path, libs: Path | None = None) -> tuple[subprocess.Popen, str]:
    ready = tmp / "relay.ready"
    ready.unlink(missing_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROLLART_")}
    if libs is not None:  # an older rollart package first on the path: the baseline relay
        env["PYTHONPATH"] = os.pathsep.join([str(libs), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.update(
        ROLLART_LISTEN="127.0.0.1:0",
        ROLLART_METRICS_LISTEN="none",
        ROLLART_INSECURE_DISABLE_AUTH="true",
        ROLLART_JOB_ID=JOB,
        ROLLART_JOB_KEY=KEY.decode(),
        ROLLART_READY_FILE=str(ready),
        ROLLART_CACHE_DIR=str(tmp / "cache"),
        ROLLART_CACHE_MAX_VERSIONS="2",
        ROLLART_LOG_LEVEL="WARNING",
    )
    exe = Path(sys.executable).parent / "rollart-relay"
    proc = subprocess.Popen([str(exe)], env=env, stdout=subprocess.DEVNULL, stderr=open(tmp / "relay.log", "wb"))
    deadline = time.time() + 30
    while not ready.exists():
        if proc.poll() is not None or time.time() > deadline:
            raise SystemExit(f"relay did not start; see {tmp / 'relay.log'}")
        time.sleep(0.05)
    import json

    return proc, json.loads(ready.read_text())["data_endpoint"]


def start_emulator(target: str, a: argparse.Namespace, script: Path | None = None) -> tuple[subprocess.Popen, str]:
    """The emulator (this tree's, or ``script``: an older one for a side-by-side run) in its own process."""
    script = script or ROOT / "libs" / "rollart" / "netem" / "wan.py"
    argv = [sys.executable, str(script), target, "--rate", str(a.flow_mbps * 1e6)]
    argv += ["--link-rate", str(a.link_mbps * 1e6), "--rtt", str(a.rtt_ms / 1e3)]
    argv += ["--stall-prob", str(a.stall_prob), "--stall", str(a.stall_ms / 1e3), "--slack", str(a.slack_ms / 1e3)]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    return proc, proc.stdout.readline().strip()


async def one(endpoint: str, segs: list[bytes], version: int, streams: int) -> tp.SendStats:
    return await tp.send_delta(endpoint, segs, job=JOB, key=KEY, version=version, streams=streams, timeout=300)


def wakeup_lateness(n: int = 100, period: float = 0.004) -> dict[str, float]:
    """How late this process's timers fire on this machine now (ms): a 4 ms sleep, as the emulator's token
    bucket does per 64 KiB at 16 MB/s. On a loaded machine this, not the transport, sets the emulator's rates."""

    async def probe() -> list[float]:
        late = []
        for _ in range(n):
            t = time.monotonic()
            await asyncio.sleep(period)
            late.append((time.monotonic() - t - period) * 1e3)
        return sorted(late)

    late = asyncio.run(probe())
    return {"median_ms": late[n // 2], "p90_ms": late[int(n * 0.9)], "max_ms": late[-1]}


def export_emulator(ref: str, dest: Path) -> Path:
    """The WAN emulator as of git ``ref`` (a baseline emulator in the same run): ``libs/rollart/netem/wan.py``,
    or ``bench/wan_emulator.py`` for a ref from before it moved."""
    out = dest / f"wan_emulator_{ref.replace('/', '_').replace('~', '_')}.py"
    for path in ("libs/rollart/netem/wan.py", "bench/wan_emulator.py"):
        shown = subprocess.run(["git", "-C", str(ROOT), "show", f"{ref}:{path}"], capture_output=True, text=True)
        if shown.returncode == 0:
            break
    else:
        raise SystemExit(f"--baseline-ref {ref}: no WAN emulator at that ref ({shown.stderr.strip()})")
    text = shown.stdout
    out.write_text(text)
    return out


def voluntary_switches(pid: int | str) -> int:
    """Voluntary context switches of a process so far (every thread): each one is the process blocking and
    being woken again, so their count per MB is the wake-ups per MB its work needs."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            for line in (task / "status").read_text().splitlines():
                if line.startswith("voluntary_ctxt_switches"):
                    total += int(line.split()[1])
        except OSError:
            pass  # a thread that just ended
    return total


def wakeups_of(relay_pid: int, emulator_pid: int) -> dict[str, int]:
    """Wake-ups so far of the sender (this process), the emulator and the relay."""
    return {"sender": voluntary_switches("self"), "emulator": voluntary_switches(emulator_pid),
            "relay": voluntary_switches(relay_pid)}


def cpu_of(relay_pid: int, emulator_pid: int) -> dict[str, float]:
    """CPU seconds so far of the sender (this process), the emulator and the relay (/proc: 10 ms ticks)."""
    tick = os.sysconf("SC_CLK_TCK")

    def proc(pid: int) -> float:
        f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(f[11]) + int(f[12])) / tick

    t = os.times()
    return {"sender": t.user + t.system, "emulator": proc(emulator_pid), "relay": proc(relay_pid)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mb", type=float, default=40.0, help="delta size in MB")
    ap.add_argument("--streams", default="1,2,4,8")
    ap.add_argument("--link-mbps", type=float, default=50.0, help="link capacity, MB/s (shared)")
    ap.add_argument("--flow-mbps", type=float, default=16.0, help="what one TCP flow gets, MB/s")
    ap.add_argument("--rtt-ms", type=float, default=40.0)
    ap.add_argument("--stall-prob", type=float, default=0.01, help="per 64 KiB chunk and connection")
    ap.add_argument("--stall-ms", type=float, default=100.0)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--slack-ms", type=float, default=50.0,
                    help="emulator: lateness of its own wake-ups that does not cost capacity (0: the old emulator)")
    ap.add_argument("--segment-kb", type=int, default=512, help="maximum segment size, KiB")
    ap.add_argument("--baseline-ref", default="",
                    help="git ref whose libs/rollart (the relay) and libs/rollart/netem/wan.py run first, side by side "
                         "(the sender is this tree's in both)")
    ap.add_argument("--json", type=Path, help="write the figures here")
    a = ap.parse_args(argv)
    streams = [int(s) for s in a.streams.split(",")]
    result: dict = {"args": {k: str(v) for k, v in vars(a).items()}, "loadavg_start": os.getloadavg(), "runs": {}}
    version = 0
    with tempfile.TemporaryDirectory(prefix="bench-transfer-") as d:
        tmp = Path(d)
        variants: list[tuple[str, Path | None, Path | None]] = [("this tree", None, None)]
        if a.baseline_ref:
            from bench.weights.fanout import export_libs

            variants.insert(0, (f"relay + emulator at {a.baseline_ref}", export_libs(a.baseline_ref, tmp),
                                export_emulator(a.baseline_ref, tmp)))
        for label, libs, emulator in variants:
            relay, data = start_relay(tmp, libs)
            emu, endpoint = start_emulator(data, a, emulator)
            try:
                rows = []
                for s in streams:
                    times, cpus, wakes, stats = [], [], [], None
                    for _ in range(a.repeat):
                        version += 1
                        segs = make_delta(a.mb, version, segment_kb=a.segment_kb)
                        c0, w0 = cpu_of(relay.pid, emu.pid), wakeups_of(relay.pid, emu.pid)
                        stats = asyncio.run(one(endpoint, segs, version, s))
                        c1, w1 = cpu_of(relay.pid, emu.pid), wakeups_of(relay.pid, emu.pid)
                        times.append(stats.seconds)
                        cpus.append({k: c1[k] - c0[k] for k in c0})
                        wakes.append({k: w1[k] - w0[k] for k in w0})
                    assert stats is not None
                    cpu = {k: statistics.median(c[k] for c in cpus) for k in cpus[0]}
                    wake = {k: statistics.median(w[k] for w in wakes) for k in wakes[0]}
                    rows.append((s, statistics.median(times), min(times), max(times), stats, cpu, wake))
            finally:
                emu.terminate()
                relay.terminate()
                relay.wait(10)
            result["runs"][label] = print_rows(label, rows, a)
            late = wakeup_lateness()
            result.setdefault("wakeup_lateness", []).append(late)
            print("timer wake-ups late by (ms): " + ", ".join(f"{k[:-3]} {v:.1f}" for k, v in late.items()))
    result["loadavg_end"] = os.getloadavg()
    if a.json:
        import json

        a.json.write_text(json.dumps(result, indent=1))
    return 0


def print_rows(label: str, rows: list, a: argparse.Namespace) -> list[dict]:
    size = rows[0][4].payload_bytes
    base = rows[0][1]
    print(
        f"[{label}] delta {size / 1e6:.1f} MB in {a.segment_kb} KiB segments; link {a.link_mbps:g} MB/s shared, "
        f"{a.flow_mbps:g} MB/s per flow, RTT {a.rtt_ms:g} ms, stalls p={a.stall_prob:g}/64KiB x {a.stall_ms:g} ms; "
        f"median of {a.repeat}"
    )
    # CPU s = sender + emulator + relay during one transfer (median); CPU s/GB = that per GB of delta; cores
    # got = CPU / wall: below ~1 the processes waited for a CPU (the machine is shared) or for wake-ups.
    # wake/MB: voluntary context switches of the three processes per MB (each is one block-and-wake).
    print(f"{'streams':>7} {'time s':>8} {'min..max':>13} {'MB/s':>7} {'of link':>8} {'speedup':>8} {'resent':>7} "
          f"{'hedged':>6} {'CPU s':>6} {'CPU s/GB':>8} {'cores got':>9} {'wake/MB':>8}  CPU s/GB and wake-ups/MB by process")
    out = []
    gb = size / 1e9
    for s, med, lo, hi, st, cpu, wake in rows:
        rate = size / med / 1e6
        total = sum(cpu.values())
        wakes = sum(wake.values())
        print(
            f"{s:>7} {med:>8.2f} {lo:>6.2f}..{hi:<6.2f} {rate:>7.1f} {rate / a.link_mbps:>7.0%} {base / med:>7.2f}x "
            f"{st.resent:>7} {st.hedged:>6} {total:>6.2f} {total / gb:>8.2f} {total / med:>9.2f} {wakes / (gb * 1e3):>8.0f}  "
            + ", ".join(f"{k} {cpu[k] / gb:.2f}/{wake[k] / (gb * 1e3):.0f}" for k in cpu)
        )
        out.append({"streams": s, "seconds": med, "min": lo, "max": hi, "mb_per_s": rate,
                    "of_link": rate / a.link_mbps, "speedup": base / med, "resent": st.resent, "hedged": st.hedged,
                    "bytes": size, "cpu_s": cpu, "cpu_s_per_gb": total / gb, "cores_got": total / med,
                    "wakeups": wake, "wakeups_per_mb": wakes / (gb * 1e3)})
    print("reference (AuroraRL): 4.71 s -> 2.90 s with 4 streams = 1.62x")
    return out


if __name__ == "__main__":
    sys.exit(main())
