"""Relay fan-out benchmark: trainer egress and time until the last of N actors holds the whole delta.

    .venv/bin/python -m bench fanout         # N = 1, 4, 8; 5 MB delta; WAN 10 MB/s, LAN 50 MB/s
    .venv/bin/python -m bench fanout --n 1,4 --mb 2 --repeat 1

The link rates are modest on purpose: every byte crosses a Python TCP proxy, and on a 2-core machine faster
emulated links would measure the proxies' CPU, not the topology.

Topology: the trainer (this process, a ``DeltaHub`` like the publisher's) is in one region, N actors in
another; the only path between them is an emulated WAN (``libs/rollart/netem/wan.py``, its own process: a shared
uplink capacity, RTT, per-flow caps). Inside the actors' region the relay reaches them over an emulated LAN
(its egress shared by the N actors). Modes:

- cut-through: trainer -> WAN -> a ``rollart-relay`` in the actors' region -> LAN -> N actors; the relay
  forwards every segment the moment it arrives (``forward_mode: cut_through``, the default);
- store-and-forward: the same, but the relay forwards a delta only once it is complete;
- trainer-direct: every actor pulls from the trainer over the WAN (N copies cross the uplink).

An actor "holds the delta" when every segment arrived, each verified (CRC-32, HMAC) and ``h(v)`` checked. The
N actors run in one separate process (``--actor-node``); time is from the trainer's first byte to the last
actor's completion.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "libs"))
sys.path.insert(0, str(ROOT))

from bench.weights.transfer import JOB, KEY, make_delta, voluntary_switches  # noqa: E402
from rollart.weights import transport as tp  # noqa: E402
from rollart.weights.hub import DeltaHub  # noqa: E402

# --------------------------------------------------------------------------------------------- actor node


async def actor_node(endpoint: str, version: int, n: int, streams: int) -> None:
    """N actors pulling one version; prints one JSON line with their completion times (time.time())."""

    async def actor(i: int) -> float:
        sink = tp.TrackerSink(tp.SegmentTracker(JOB, version), on_segment=_nothing)
        session = await tp.open_pull(
            endpoint, job=JOB, key=KEY, version=version, sink=sink, streams=streams, idle_timeout=120
        )
        await session.wait(300)
        assert sink.tracker.verified
        return time.time()

    print("READY", flush=True)
    t0, w0 = os.times(), voluntary_switches("self")
    done = await asyncio.gather(*(actor(i) for i in range(n)))
    t1, w1 = os.times(), voluntary_switches("self")
    print(json.dumps({"done": done, "user": t1.user - t0.user, "sys": t1.system - t0.system, "wakeups": w1 - w0}),
          flush=True)


async def _nothing(seg: object) -> None:
    return None


# ------------------------------------------------------------------------------------------------ helpers


def start_relay(tmp: Path, mode: str, env: dict[str, str] | None = None, tag: str = "") -> tuple[subprocess.Popen, dict]:
    tag = tag or mode
    ready = tmp / f"relay-{tag}.ready"
    env = dict(env) if env is not None else {k: v for k, v in os.environ.items() if not k.startswith("ROLLART_")}
    env.update(
        ROLLART_LISTEN="127.0.0.1:0",
        ROLLART_METRICS_LISTEN="none",
        ROLLART_INSECURE_DISABLE_AUTH="true",
        ROLLART_JOB_ID=JOB,
        ROLLART_JOB_KEY=KEY.decode(),
        ROLLART_READY_FILE=str(ready),
        ROLLART_CACHE_DIR=str(tmp / f"cache-{tag}"),
        ROLLART_FORWARD_MODE=mode,
        ROLLART_PULL_WAIT_SECONDS="60",
        ROLLART_LOG_LEVEL="WARNING",
    )
    exe = Path(sys.executable).parent / "rollart-relay"
    proc = subprocess.Popen(
        [str(exe)], env=env, stdout=subprocess.DEVNULL, stderr=open(tmp / f"relay-{tag}.log", "wb")
    )
    deadline = time.time() + 30
    while not ready.exists():
        if proc.poll() is not None or time.time() > deadline:
            raise SystemExit(f"relay did not start; see {tmp}")
        time.sleep(0.05)
    return proc, json.loads(ready.read_text())


def start_emulator(target: str, a: argparse.Namespace, lan: bool = False) -> tuple[subprocess.Popen, str]:
    rate, link, rtt = (a.lan_mbps, a.lan_mbps, a.lan_rtt_ms) if lan else (a.flow_mbps, a.link_mbps, a.rtt_ms)
    argv = [sys.executable, str(ROOT / "libs" / "rollart" / "netem" / "wan.py"), target, "--rate", str(rate * 1e6)]
    argv += ["--link-rate", str(link * 1e6), "--rtt", str(rtt / 1e3)]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    return proc, proc.stdout.readline().strip()


def start_actors(
    endpoint: str, version: int, n: int, streams: int, env: dict[str, str] | None = None
) -> subprocess.Popen:
    argv = [sys.executable, __file__, "--actor-node", endpoint, "--version", str(version), "--n", str(n)]
    argv += ["--streams", str(streams)]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, env=env)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "READY"
    return proc


def finish_actors(proc: subprocess.Popen) -> list[float]:
    return actor_report(proc)["done"]


def actor_report(proc: subprocess.Popen) -> dict:
    """The actor node's last line: completion times ("done") and its CPU seconds after READY ("cpu")."""
    out, _ = proc.communicate(timeout=600)
    if proc.returncode != 0:
        raise SystemExit(f"actor node failed ({proc.returncode})")
    return json.loads(out.strip().splitlines()[-1])


async def trainer_push(
    hub: DeltaHub, segs: list[bytes], version: int, relay_wan: str, streams: int
) -> tuple[float, int]:
    for raw in segs:
        await hub.ingest(raw, verify=False)
    t0 = time.time()
    stats = await hub.push_version(relay_wan, version, streams=streams, timeout=300)
    return t0, stats.wire_bytes


async def run(a: argparse.Namespace) -> list[tuple]:
    rows = []
    version = 0
    with tempfile.TemporaryDirectory(prefix="bench-fanout-") as d:
        tmp = Path(d)
        hub = DeltaHub(job=JOB, key=KEY, relay_id="trainer", max_versions=4, pull_wait=60)
        await hub.start("127.0.0.1:0")
        trainer_emu, trainer_wan = start_emulator(hub.data_endpoint, a)  # the trainer's uplink
        try:
            for mode in ("cut_through", "store_and_forward"):
                relay, info = start_relay(tmp, mode)
                emu, relay_wan = start_emulator(info["data_endpoint"], a)  # trainer -> relay crosses the WAN
                lan, relay_lan = start_emulator(info["data_endpoint"], a, lan=True)  # relay -> actors: the LAN

                pids = {"relay": relay.pid, "wan proxy": emu.pid, "lan proxy": lan.pid}

                async def via_relay(
                    n: int, relay_lan: str = relay_lan, relay_wan: str = relay_wan, pids: dict[str, int] = pids
                ) -> tuple[int, float, dict]:
                    nonlocal version
                    version += 1
                    segs = make_delta(a.mb, version, segment_kb=a.segment_kb)
                    actors = start_actors(relay_lan, version, n, a.streams)
                    c0 = cpu_now(pids)
                    t0, egress = await trainer_push(hub, segs, version, relay_wan, a.streams)
                    report = await asyncio.to_thread(actor_report, actors)
                    cpu = cpu_since(c0, pids, report)
                    return egress, max(report["done"]) - t0, cpu

                try:
                    await via_relay(1)  # warm-up: processes, connections, page cache
                    for n in a.n:
                        runs = [await via_relay(n) for _ in range(a.repeat)]
                        rows.append((mode, n, runs[0][0], statistics.median(t for _, t, _ in runs), a.mb,
                                     median_cpu([c for _, _, c in runs])))
                finally:
                    emu.terminate()
                    lan.terminate()
                    relay.terminate()
                    relay.wait(10)

            async def direct(n: int) -> tuple[int, float, dict]:
                nonlocal version
                version += 1
                segs = make_delta(a.mb, version, segment_kb=a.segment_kb)
                sent_before = hub.bytes_sent
                actors = start_actors(trainer_wan, version, n, a.streams)  # they wait for the version
                pids = {"wan proxy": trainer_emu.pid}
                c0 = cpu_now(pids)
                t0 = time.time()
                for raw in segs:
                    await hub.ingest(raw, verify=False)
                report = await asyncio.to_thread(actor_report, actors)
                cpu = cpu_since(c0, pids, report)
                await asyncio.sleep(0.2)  # the hub's counters settle when the sessions end
                return hub.bytes_sent - sent_before, max(report["done"]) - t0, cpu

            await direct(1)
            for n in a.n:
                runs = [await direct(n) for _ in range(a.repeat)]
                rows.append(("trainer_direct", n, runs[0][0], statistics.median(t for _, t, _ in runs), a.mb,
                             median_cpu([c for _, _, c in runs])))
        finally:
            trainer_emu.terminate()
            await hub.stop()
    return rows


def cpu_now(pids: dict[str, int]) -> dict[str, float]:
    """CPU seconds so far of this process (the trainer's hub) and of the named helper processes, and their
    wake-ups ("wake NAME": voluntary context switches)."""
    t = os.times()
    cpu = {"trainer": t.user + t.system} | {k: sum(proc_cpu(p)) for k, p in pids.items()}
    wake = {"wake trainer": voluntary_switches("self")} | {f"wake {k}": voluntary_switches(p) for k, p in pids.items()}
    return cpu | wake


def cpu_since(c0: dict[str, float], pids: dict[str, int], actor_report: dict) -> dict[str, float]:
    """CPU seconds (and wake-ups) each part of one fan-out spent, the actors' process from its own report."""
    c1 = cpu_now(pids)
    out = {k: c1[k] - c0[k] for k in c0}
    out["actors"] = actor_report["user"] + actor_report["sys"]
    out["wake actors"] = actor_report.get("wakeups", 0)
    out["total"] = sum(v for k, v in out.items() if not k.startswith("wake"))
    out["wakeups"] = sum(v for k, v in out.items() if k.startswith("wake "))
    return out


def median_cpu(runs: list[dict[str, float]]) -> dict[str, float]:
    return {k: statistics.median(r[k] for r in runs) for k in runs[0]}


# ------------------------------------------------------------------------------------ forward CPU per GB


def proc_cpu(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds of a process so far (/proc; 10 ms resolution)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def one_core_limits(mb: int = 256) -> dict[str, float]:
    """CPU seconds per GB on one core of what a relay must do to every byte: copy it (the kernel's recv and
    send copies are memcpy-like), CRC-32 and HMAC-SHA256 it (segment verification) and SHA-256 it (h(v))."""
    import hashlib
    import hmac
    import zlib

    import numpy as np

    src = np.random.default_rng(0).integers(0, 255, mb << 20, dtype=np.uint8)
    dst = np.empty_like(src)
    np.copyto(dst, src)  # touch the pages first
    chunk = 1 << 20
    views = [memoryview(src)[i : i + chunk] for i in range(0, src.size, chunk)]

    def timed(fn: object) -> float:
        best = float("inf")
        for _ in range(3):
            t0 = time.process_time()
            fn()  # type: ignore[operator]
            best = min(best, time.process_time() - t0)
        return best / (src.size / 1e9)

    return {
        "memcpy": timed(lambda: np.copyto(dst, src)),
        "crc32": timed(lambda: [zlib.crc32(v) for v in views]),
        "hmac_sha256": timed(lambda: [hmac.new(KEY, v, hashlib.sha256).digest() for v in views]),
        "sha256": timed(lambda: [hashlib.sha256(v).digest() for v in views]),
    }


def relay_env_libs(libs: Path | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROLLART_")}
    if libs is not None:  # an older rollart package first on the path: the baseline relay
        env["PYTHONPATH"] = os.pathsep.join([str(libs), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def export_libs(ref: str, dest: Path) -> Path:
    """``libs/rollart`` as of git ``ref`` (for a baseline relay in the same run)."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", ref, "libs/rollart"], check=True, capture_output=True)
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True)
    return dest / "libs"


async def forward_cpu(
    segs: list[bytes], version: int, n: int, streams: int, tmp: Path, libs: Path | None = None
) -> dict[str, float]:
    """Push one delta (no emulated links) to a real relay that N actors follow; CPU seconds of the relay and
    of the actors' process per GB of delta."""
    relay, info = start_relay(tmp, "cut_through", env=relay_env_libs(libs), tag=f"cpu-{version}")
    hub = DeltaHub(job=JOB, key=KEY, relay_id="trainer", max_versions=2, pull_wait=60)
    await hub.start("127.0.0.1:0")
    try:
        actors = start_actors(info["data_endpoint"], version, n, streams, env=relay_env_libs(libs))
        for raw in segs:
            await hub.ingest(raw, verify=False)
        r0 = proc_cpu(relay.pid)
        t0 = time.time()
        await hub.push_version(info["data_endpoint"], version, streams=streams, timeout=600)
        report = await asyncio.to_thread(actor_report, actors)
        r1 = proc_cpu(relay.pid)
        gb = sum(map(len, segs)) / 1e9
        return {
            "gb": gb,
            "n": n,
            "wall_s": max(report["done"]) - t0,
            "relay_cpu_s_per_gb": (r1[0] + r1[1] - r0[0] - r0[1]) / gb,
            "relay_user_s_per_gb": (r1[0] - r0[0]) / gb,
            "relay_sys_s_per_gb": (r1[1] - r0[1]) / gb,
            "actor_cpu_s_per_gb": (report["user"] + report["sys"]) / gb / n,
            "actor_user_s_per_gb": report["user"] / gb / n,
        }
    finally:
        relay.terminate()
        relay.wait(10)
        await hub.stop()


async def cpu_section(a: argparse.Namespace) -> dict:
    """Relay forward CPU per GB (this tree's relay, and the ``--baseline-ref`` one) beside one core's limits."""
    out: dict = {"limits_s_per_gb": one_core_limits(), "rows": []}
    with tempfile.TemporaryDirectory(prefix="bench-fanout-cpu-") as d:
        tmp = Path(d)
        variants: list[tuple[str, Path | None]] = [("this tree", None)]
        if a.baseline_ref:
            variants.insert(0, (a.baseline_ref, export_libs(a.baseline_ref, tmp)))
        version = 0
        for label, libs in variants:
            for n in a.cpu_n:
                version += 1
                vsegs = make_delta(a.cpu_mb, version, segment_kb=a.cpu_segment_kb)
                row = await forward_cpu(vsegs, version, n, a.streams, tmp, libs)
                row["relay"] = label
                out["rows"].append(row)
    return out


def print_cpu(cpu: dict) -> None:
    lim = cpu["limits_s_per_gb"]
    print("one core, CPU s per GB: " + ", ".join(f"{k} {v:.3f}" for k, v in lim.items()))
    verify = lim["crc32"] + lim["hmac_sha256"] + lim["sha256"]
    print(f"{'relay':<14} {'N':>3} {'GB':>6} {'wall s':>7} {'relay CPU s/GB':>15} {'user':>6} {'sys':>6} "
          f"{'x (verify+copies)':>18} {'actor CPU s/GB':>15} {'user':>6} {'x verify':>9}")
    for r in cpu["rows"]:
        floor = verify + (1 + r["n"]) * lim["memcpy"]  # verify once, one kernel copy in, N out
        print(f"{r['relay']:<14} {r['n']:>3} {r['gb']:>6.2f} {r['wall_s']:>7.2f} {r['relay_cpu_s_per_gb']:>15.2f} "
              f"{r['relay_user_s_per_gb']:>6.2f} {r['relay_sys_s_per_gb']:>6.2f} "
              f"{r['relay_cpu_s_per_gb'] / floor:>17.2f}x {r['actor_cpu_s_per_gb']:>15.2f} "
              f"{r['actor_user_s_per_gb']:>6.2f} {r['actor_cpu_s_per_gb'] / (verify + lim['memcpy']):>8.2f}x")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--actor-node", metavar="ENDPOINT", help=argparse.SUPPRESS)
    ap.add_argument("--version", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--n", default="1,4,8", help="actor counts")
    ap.add_argument("--mb", type=float, default=4.0, help="delta size in MB")
    ap.add_argument("--streams", type=int, default=2)
    ap.add_argument("--link-mbps", type=float, default=10.0, help="WAN uplink capacity, MB/s (shared)")
    ap.add_argument("--flow-mbps", type=float, default=10.0, help="per-flow cap, MB/s")
    ap.add_argument("--rtt-ms", type=float, default=40.0)
    ap.add_argument("--lan-mbps", type=float, default=50.0, help="relay -> actors capacity, MB/s (shared)")
    ap.add_argument("--lan-rtt-ms", type=float, default=1.0)
    ap.add_argument("--repeat", type=int, default=3, help="runs per point (median)")
    ap.add_argument("--segment-kb", type=int, default=256, help="maximum segment size, KiB (cut-through unit)")
    ap.add_argument("--skip-links", action="store_true", help="only the forward-CPU section")
    ap.add_argument("--cpu-mb", type=float, default=100.0, help="delta size of the forward-CPU section (0: skip)")
    ap.add_argument("--cpu-n", default="1,8", help="actor counts of the forward-CPU section")
    ap.add_argument("--cpu-segment-kb", type=int, default=1024)
    ap.add_argument("--baseline-ref", default="", help="git ref whose libs/rollart runs a second relay, side by side")
    ap.add_argument("--json", type=Path, help="write the figures here")
    a = ap.parse_args(argv)
    if a.actor_node:
        asyncio.run(actor_node(a.actor_node, a.version, int(a.n), a.streams))
        return 0
    a.n = [int(x) for x in a.n.split(",")]
    a.cpu_n = [int(x) for x in a.cpu_n.split(",")]
    result: dict = {"args": {k: v for k, v in vars(a).items() if k != "json"}, "uptime": os.getloadavg()}
    if not a.skip_links:
        rows = asyncio.run(run(a))
        size = sum(map(len, make_delta(a.mb, 1, segment_kb=a.segment_kb)))
        print(
            f"delta {size / 1e6:.1f} MB in {a.segment_kb} KiB segments; WAN uplink {a.link_mbps:g} MB/s, RTT {a.rtt_ms:g} ms; relay -> actors LAN "
            f"{a.lan_mbps:g} MB/s shared, RTT {a.lan_rtt_ms:g} ms; S={a.streams}"
        )
        # What the links alone allow: the WAN leg, then the LAN carries N copies (cut-through overlaps them).
        # CPU: seconds of every process taking part (trainer, proxies, relay, actors); "CPU bound" = that sum
        # over the machine's cores, the least wall time the work could take if it had the cores to itself;
        # "cores got" = sum / wall, what the run actually got of the shared machine.
        cores = os.cpu_count() or 1
        print(f"{'mode':<18} {'N':>3} {'egress MB':>10} {'x delta':>8} {'last actor s':>13} {'vs direct':>10} "
              f"{'vs N=1':>7} {'links s':>8} {'CPU s':>6} {'CPU bound s':>11} {'cores got':>9} {'wake/MB':>8}  "
              "CPU s by part")
        direct = {n: t for m, n, _, t, _, _ in rows if m == "trainer_direct"}
        one = {m: t for m, n, _, t, _, _ in rows if n == 1}
        result["links"] = []
        for mode, n, egress, t, _, cpu in rows:
            links = max(size / (a.link_mbps * 1e6), n * size / (a.lan_mbps * 1e6))
            if mode == "trainer_direct":
                links = n * size / (a.link_mbps * 1e6)
            parts = ", ".join(f"{k} {v:.2f}" for k, v in cpu.items() if k not in ("total", "wakeups")
                              and not k.startswith("wake"))
            wake_mb = cpu["wakeups"] / (size / 1e6)  # all processes' wake-ups per MB of delta
            print(f"{mode:<18} {n:>3} {egress / 1e6:>10.1f} {egress / size:>8.2f} {t:>13.2f} {direct[n] / t:>9.2f}x "
                  f"{t / one[mode]:>6.2f}x {links:>8.2f} {cpu['total']:>6.2f} {cpu['total'] / cores:>11.2f} "
                  f"{cpu['total'] / t:>9.2f} {wake_mb:>8.0f}  {parts}")
            result["links"].append({"mode": mode, "n": n, "egress_bytes": egress, "seconds": t,
                                    "vs_n1": t / one[mode], "link_bound_s": links, "cpu_s": cpu,
                                    "cpu_bound_s": cpu["total"] / cores, "cores_got": cpu["total"] / t,
                                    "wakeups_per_mb": wake_mb})
        result["loadavg_end"] = os.getloadavg()
    if a.cpu_mb > 0:
        cpu = asyncio.run(cpu_section(a))
        print_cpu(cpu)
        result["forward_cpu"] = cpu
    if a.json:
        a.json.write_text(json.dumps(result, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
