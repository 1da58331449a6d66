"""A process hosting N weight subscribers (actors without an engine), for the integration tests.

    python -m tests.integration.weights.subscriber_node --ids a0,a1 --sources R1,R2,T --weights v0.safetensors \
        --until 3 --out DIR

Writes its ready file (ROLLART_READY_FILE) once every subscriber follows its first source, then
``DIR/<id>.json`` per subscriber once all reached version ``--until`` (or on timeout), and exits.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path

from rollart.delta import load_safetensors
from rollart.weights.subscriber import WeightSubscriber
from tests.unit.weights.weights_testlib import JOB, KEY, digest


async def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ids", required=True)
    ap.add_argument("--sources", required=True)
    ap.add_argument("--weights", required=True)
    ap.add_argument("--until", type=int, required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--streams", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=60)
    a = ap.parse_args()
    token = os.environ["ROLLART_JOB_TOKEN"]
    subs = []
    for sid in a.ids.split(","):
        w = load_safetensors(a.weights, writable=True)
        s = WeightSubscriber(
            subscriber_id=sid, job=JOB, key=KEY, token=token, sources=a.sources.split(","), weights=w, streams=a.streams
        )
        await s.start()
        subs.append(s)
    await asyncio.gather(*(asyncio.wait_for(s.follower.connected_event.wait(), 20) for s in subs))
    ready = os.environ.get("ROLLART_READY_FILE")
    if ready:
        tmp = Path(ready + ".tmp")
        tmp.write_text(json.dumps({"address": "", "pid": os.getpid()}))
        tmp.replace(ready)
    ok = True
    try:
        await asyncio.gather(*(s.wait_version(a.until, a.timeout) for s in subs))
    except TimeoutError:
        ok = False
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    for s in subs:
        (out / f"{s.subscriber_id}.json").write_text(
            json.dumps(
                {
                    "version": s.active_version,
                    "hash": (s.active_hash or b"").hex(),
                    "digest": digest(s.weights),
                    "segments_received": s.segments_received,
                    "duplicates": s.duplicates,
                    "bytes_received": s.bytes_received,
                    "errors": s.errors,
                    "failovers": s.follower.failovers,
                    "active_endpoint": s.follower.active_endpoint,
                    "applied": [[v, h.hex()] for v, h in s.applied],
                }
            )
        )
    for s in subs:
        await s.stop()
    return 0 if ok else 3


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
