"""A pool worker process: reads scoring jobs from stdin, answers on its original stdout, one job at a time.

Started by the pool as ``python -m rollart_reward.worker`` with its settings as JSON in the environment
(``ROLLART_REWARD_WORKER``). It dies with the service (PR_SET_PDEATHSIG) and exits when stdin closes. Scorers
run in this process's main thread, where math-verify's ``signal.alarm`` works.
"""

from __future__ import annotations

import base64
import ctypes
import json
import logging
import os
import signal
import sys
import time
import traceback

from rollart.v1 import common_pb2

from .protocol import read_frame_sync, write_frame_sync
from .sandbox import SandboxLimits, sweep_stale
from .scorers import registry
from .scorers.base import FAILED, INVALID, InvalidRequest, ScorerFailure, Verdict

ENV_KEY = "ROLLART_REWARD_WORKER"
PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: stdin EOF still ends the worker
        pass
    if os.getppid() == 1:  # the parent died before prctl
        os._exit(0)


def score_job(msg: dict, ctx: registry.WorkerContext) -> dict:
    start = time.perf_counter()
    try:
        traj = common_pb2.Trajectory.FromString(base64.b64decode(msg["trajectory"]))
        verdict = registry.run(
            msg["kind"], msg.get("name", ""), dict(msg.get("options") or {}), traj, float(msg["budget"]), ctx
        )
    except InvalidRequest as exc:
        verdict = Verdict(status=INVALID, error=str(exc), cause="invalid")
    except ScorerFailure as exc:
        verdict = exc.verdict()
    except MemoryError:
        verdict = Verdict(status=FAILED, error="the scorer ran out of memory", cause="scorer_error", retryable=True)
    except Exception as exc:  # noqa: BLE001 - a scorer bug is a failure of this request, not of the worker
        logging.getLogger("rollart_reward.worker").error("scorer raised\n%s", traceback.format_exc())
        verdict = Verdict(status=FAILED, error=f"scorer raised {type(exc).__name__}: {exc}", cause="scorer_error")
    out = verdict.to_dict()
    out["job_id"] = msg.get("job_id")
    out["scoring_seconds"] = time.perf_counter() - start
    return out


def main() -> None:
    proto_out = os.fdopen(os.dup(1), "wb", buffering=0)
    os.dup2(2, 1)  # stray prints go to stderr, not into the frame stream
    sys.stdout = sys.stderr
    _die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C reaches the service, which stops its workers
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    settings = json.loads(os.environ.get(ENV_KEY) or "{}")
    ctx = registry.WorkerContext(
        sandbox=SandboxLimits(**settings.get("sandbox", {})), custom_scorers=dict(settings.get("custom_scorers", {}))
    )
    sweep_stale(ctx.sandbox.workdir)
    registry.preload(list(settings.get("preload", [])))
    write_frame_sync(proto_out, {"op": "ready", "pid": os.getpid()})
    stdin = sys.stdin.buffer
    while True:
        msg = read_frame_sync(stdin)
        if msg is None or msg.get("op") == "stop":
            return
        if msg.get("op") == "score":
            write_frame_sync(proto_out, score_job(msg, ctx))


if __name__ == "__main__":
    main()
