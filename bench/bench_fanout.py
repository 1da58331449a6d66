"""Relay fan-out benchmark: trainer egress and time until the last of N actors holds the whole delta.

    .venv/bin/python bench/bench_fanout.py         # N = 1, 4, 8; 5 MB delta; WAN 10 MB/s, LAN 50 MB/s
    .venv/bin/python bench/bench_fanout.py --n 1,4 --mb 2 --repeat 1

The link rates are modest on purpose: every byte crosses a Python TCP proxy, and on a 2-core machine faster
emulated links would measure the proxies' CPU, not the topology.

Topology: the trainer (this process, a ``DeltaHub`` like the publisher's) is in one region, N actors in
another; the only path between them is an emulated WAN (``bench/wan_emulator.py``, its own process: a shared
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "libs"))
sys.path.insert(0, str(ROOT))

from bench.bench_transfer import JOB, KEY, make_delta  # noqa: E402
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
    done = await asyncio.gather(*(actor(i) for i in range(n)))
    print(json.dumps({"done": done}), flush=True)


async def _nothing(seg: object) -> None:
    return None


# ------------------------------------------------------------------------------------------------ helpers


def start_relay(tmp: Path, mode: str) -> tuple[subprocess.Popen, dict]:
    ready = tmp / f"relay-{mode}.ready"
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROLLART_")}
    env.update(
        ROLLART_LISTEN="127.0.0.1:0",
        ROLLART_METRICS_LISTEN="none",
        ROLLART_INSECURE_DISABLE_AUTH="true",
        ROLLART_JOB_ID=JOB,
        ROLLART_JOB_KEY=KEY.decode(),
        ROLLART_READY_FILE=str(ready),
        ROLLART_CACHE_DIR=str(tmp / f"cache-{mode}"),
        ROLLART_FORWARD_MODE=mode,
        ROLLART_PULL_WAIT_SECONDS="60",
        ROLLART_LOG_LEVEL="WARNING",
    )
    exe = Path(sys.executable).parent / "rollart-relay"
    proc = subprocess.Popen(
        [str(exe)], env=env, stdout=subprocess.DEVNULL, stderr=open(tmp / f"relay-{mode}.log", "wb")
    )
    deadline = time.time() + 30
    while not ready.exists():
        if proc.poll() is not None or time.time() > deadline:
            raise SystemExit(f"relay did not start; see {tmp}")
        time.sleep(0.05)
    return proc, json.loads(ready.read_text())


def start_emulator(target: str, a: argparse.Namespace, lan: bool = False) -> tuple[subprocess.Popen, str]:
    rate, link, rtt = (a.lan_mbps, a.lan_mbps, a.lan_rtt_ms) if lan else (a.flow_mbps, a.link_mbps, a.rtt_ms)
    argv = [sys.executable, str(ROOT / "bench" / "wan_emulator.py"), target, "--rate", str(rate * 1e6)]
    argv += ["--link-rate", str(link * 1e6), "--rtt", str(rtt / 1e3)]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    return proc, proc.stdout.readline().strip()


def start_actors(endpoint: str, version: int, n: int, streams: int) -> subprocess.Popen:
    argv = [sys.executable, __file__, "--actor-node", endpoint, "--version", str(version), "--n", str(n)]
    argv += ["--streams", str(streams)]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "READY"
    return proc


def finish_actors(proc: subprocess.Popen) -> list[float]:
    out, _ = proc.communicate(timeout=300)
    if proc.returncode != 0:
        raise SystemExit(f"actor node failed ({proc.returncode})")
    return json.loads(out.strip().splitlines()[-1])["done"]


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

                async def via_relay(
                    n: int, relay_lan: str = relay_lan, relay_wan: str = relay_wan
                ) -> tuple[int, float]:
                    nonlocal version
                    version += 1
                    segs = make_delta(a.mb, version, segment_kb=a.segment_kb)
                    actors = start_actors(relay_lan, version, n, a.streams)
                    t0, egress = await trainer_push(hub, segs, version, relay_wan, a.streams)
                    return egress, max(await asyncio.to_thread(finish_actors, actors)) - t0

                try:
                    await via_relay(1)  # warm-up: processes, connections, page cache
                    for n in a.n:
                        runs = [await via_relay(n) for _ in range(a.repeat)]
                        rows.append((mode, n, runs[0][0], statistics.median(t for _, t in runs), a.mb))
                finally:
                    emu.terminate()
                    lan.terminate()
                    relay.terminate()
                    relay.wait(10)

            async def direct(n: int) -> tuple[int, float]:
                nonlocal version
                version += 1
                segs = make_delta(a.mb, version, segment_kb=a.segment_kb)
                sent_before = hub.bytes_sent
                actors = start_actors(trainer_wan, version, n, a.streams)  # they wait for the version
                t0 = time.time()
                for raw in segs:
                    await hub.ingest(raw, verify=False)
                done = await asyncio.to_thread(finish_actors, actors)
                await asyncio.sleep(0.2)  # the hub's counters settle when the sessions end
                return hub.bytes_sent - sent_before, max(done) - t0

            await direct(1)
            for n in a.n:
                runs = [await direct(n) for _ in range(a.repeat)]
                rows.append(("trainer_direct", n, runs[0][0], statistics.median(t for _, t in runs), a.mb))
        finally:
            trainer_emu.terminate()
            await hub.stop()
    return rows


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
    a = ap.parse_args(argv)
    if a.actor_node:
        asyncio.run(actor_node(a.actor_node, a.version, int(a.n), a.streams))
        return 0
    a.n = [int(x) for x in a.n.split(",")]
    rows = asyncio.run(run(a))
    size = sum(map(len, make_delta(a.mb, 1, segment_kb=a.segment_kb)))
    print(
        f"delta {size / 1e6:.1f} MB in {a.segment_kb} KiB segments; WAN uplink {a.link_mbps:g} MB/s, RTT {a.rtt_ms:g} ms; relay -> actors LAN "
        f"{a.lan_mbps:g} MB/s shared, RTT {a.lan_rtt_ms:g} ms; S={a.streams}"
    )
    print(f"{'mode':<18} {'N':>3} {'egress MB':>10} {'x delta':>8} {'last actor s':>13} {'vs direct':>10}")
    direct = {n: t for m, n, _, t, _ in rows if m == "trainer_direct"}
    for mode, n, egress, t, _ in rows:
        print(f"{mode:<18} {n:>3} {egress / 1e6:>10.1f} {egress / size:>8.2f} {t:>13.2f} {direct[n] / t:>9.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
