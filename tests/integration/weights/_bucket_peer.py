"""A second Mooncake client process for the bucket tests: JSON commands on stdin, one JSON answer per line.

python -m tests.integration.weights._bucket_peer     (from the repository root)
"""

from __future__ import annotations

import json
import os
import sys
import time

from rollart.delta import load_safetensors
from rollart.weights.buckets import BucketPublisher, BucketReader, MooncakeConfig
from tests.integration.weights.bucket_testlib import JOB, digest, synthetic_model


def source(cmd: dict):
    if "file" in cmd:
        return load_safetensors(cmd["file"])
    return synthetic_model(int(cmd["synthetic"]))


def main() -> None:
    pub: BucketPublisher | None = None
    reader: BucketReader | None = None
    prepared: dict[int, object] = {}
    out = sys.stdout
    for line in sys.stdin:
        cmd = json.loads(line)
        op = cmd.pop("op")
        t0 = time.monotonic()
        try:
            if op == "connect":
                cfg = MooncakeConfig(cmd["master"], rpc_timeout_ms=int(cmd.get("rpc_timeout_ms", 5000)))
                if cmd["role"] == "publisher":
                    pub = BucketPublisher(
                        cfg, JOB, bucket_bytes=int(cmd["bucket_bytes"]), keep_versions=cmd.get("keep", 1)
                    )
                else:
                    reader = BucketReader(cfg, JOB)
                    reader.client.connect()
                answer: dict = {}
            elif op == "publish":
                m = pub.publish(int(cmd["version"]), source(cmd))
                answer = {"buckets": len(m.buckets), "total_bytes": m.total_bytes}
            elif op == "prepare":
                p = pub.prepare(int(cmd["version"]), source(cmd))
                prepared[p.manifest.version] = p
                answer = {"buckets": len(p.manifest.buckets)}
            elif op == "commit":
                answer = {"buckets": len(pub.commit(prepared.pop(int(cmd["version"]))).buckets)}
            elif op == "ensure":
                answer = {"republished": pub.ensure_published()}
            elif op == "pull":
                got = reader.pull(cmd.get("version"))
                answer = {"version": got.weights.version, "digest": digest(got.weights)}
            elif op == "exit":
                break
            else:
                raise ValueError(f"unknown op {op}")
            answer["ok"] = True
        except Exception as e:  # reported to the test, which asserts on the type
            answer = {"ok": False, "error": type(e).__name__, "message": str(e)}
        answer["elapsed"] = time.monotonic() - t0
        out.write(json.dumps(answer) + "\n")
        out.flush()
    # Exit without closing the clients: a clean close waits for the library's threads (~1 s each), and
    # the master drops a vanished client's segment on its own (client_ttl).
    os._exit(0)


if __name__ == "__main__":
    main()
