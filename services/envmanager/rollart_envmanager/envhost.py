"""The child side of a hosted environment: ``python -m rollart_envmanager.envhost``.

One JSON object per line on stdin (requests) and on the original stdout (responses); anything the
environment prints goes to stderr (the protocol's stdout is a private copy of the original descriptor).

Requests: ``{"op": "make", "factory": "module:callable", "kwargs": {...}, "max_turns": N}``,
``{"op": "reset", "seed": N}``, ``{"op": "step", "action": "..."}``, ``{"op": "close"}``, ``{"op": "ping"}``.
Responses: ``{"ok": true, "result": ...}`` or ``{"ok": false, "type": "ActionError", "message": "...",
"traceback": "..."}``.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from typing import Any


def _send(out: Any, payload: dict[str, Any]) -> None:
    out.write(json.dumps(payload, default=str).encode() + b"\n")
    out.flush()


def main() -> int:
    proto = os.fdopen(os.dup(1), "wb", buffering=0)
    os.dup2(2, 1)  # stray prints of environment code must not corrupt the protocol
    sys.stdout = sys.stderr
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    from .envs.base import Env, jsonable
    from .envs.registry import import_factory

    env: Env | None = None
    for raw in sys.stdin.buffer:
        if not raw.strip():
            continue
        try:
            req = json.loads(raw)
            op = req["op"]
            if op == "make":
                factory = import_factory(req["factory"])
                env = factory(**req.get("kwargs", {}))
                if req.get("max_turns"):
                    env.max_turns = int(req["max_turns"])
                result: Any = {"system_prompt": env.system_prompt, "default_max_turns": env.default_max_turns,
                               "pid": os.getpid()}
            elif op == "ping":
                result = {"pid": os.getpid()}
            elif env is None:
                raise RuntimeError(f"{op!r} before 'make'")
            elif op == "reset":
                obs = env.reset(req.get("seed"))
                result = {"observation": obs, "metadata": env.metadata}
            elif op == "step":
                result = env.step(req["action"]).to_dict()
            elif op == "close":
                result = env.close()
                _send(proto, {"ok": True, "result": jsonable(result)})
                return 0
            else:
                raise ValueError(f"unknown op {op!r}")
            _send(proto, {"ok": True, "result": jsonable(result)})
        except Exception as exc:
            payload = {"ok": False, "type": type(exc).__name__, "message": str(exc),
                       "traceback": traceback.format_exc()[-4000:]}
            cause = getattr(exc, "cause", None)
            if cause is not None and hasattr(cause, "value"):
                payload["cause"] = cause.value
            _send(proto, payload)
    return 0


if __name__ == "__main__":
    sys.exit(main())
