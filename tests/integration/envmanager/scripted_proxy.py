"""A scripted generation server implementing rollart.v1.LLMProxy's Generate, Tokenize and Abort: a test double
for the proxy in the envmanager's tests only (the real proxy + actor run in the end-to-end tests).

- Tokens: bytes (id = byte + 10) plus three special tokens with a Qwen-like chat template; every context the
  envmanager sends is decoded and parsed back into chat messages, so a test can check that the envmanager's
  token history is exactly the template's rendering (`contexts`, `malformed`).
- Actions come from scripted players (``policies``: task tag -> function of the chat messages), each token
  with logprob -0.1 and the server's current version (``version``; ``version_after`` switches mid-stream).
- Faults per task: ``fail[task] = ["unavailable", ...]`` ends the next calls with the proxy's retryable
  UNAVAILABLE, ``"hang"`` streams nothing until the trajectory is aborted; ``token_delay`` slows generation.
- Weight hashes per task: ``hashes[task] = {version: h}`` is what the last chunk's ``version_hashes`` reports
  for the versions the turn used (as an actor vouching for its weights; none by default).
"""

from __future__ import annotations

import re
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from concurrent import futures

import grpc

from rollart.v1 import common_pb2 as c
from rollart.v1 import llmproxy_pb2 as pp
from rollart.v1 import llmproxy_pb2_grpc as pg

IM_START, IM_END, EOT = "<|im_start|>", "<|im_end|>", "<|endoftext|>"
SPECIAL = {IM_START: 1, IM_END: 2, EOT: 3}
SPECIAL_IDS = {v: k for k, v in SPECIAL.items()}
_SPLIT = re.compile("(" + "|".join(re.escape(s) for s in SPECIAL) + ")")
_TURN = re.compile(re.escape(IM_START) + r"(\w+)\n(.*?)" + re.escape(IM_END) + r"\n", re.DOTALL)

Policy = Callable[[list[tuple[str, str]]], str]


def encode(text: str) -> list[int]:
    out: list[int] = []
    for part in _SPLIT.split(text):
        if part in SPECIAL:
            out.append(SPECIAL[part])
        elif part:
            out.extend(b + 10 for b in part.encode())
    return out


def decode(ids) -> str:
    out, buf = [], bytearray()
    for i in ids:
        if i in SPECIAL_IDS:
            out.append(buf.decode(errors="replace"))
            buf = bytearray()
            out.append(SPECIAL_IDS[i])
        else:
            buf.append(i - 10)
    out.append(buf.decode(errors="replace"))
    return "".join(out)


def render(messages, generation_prompt: bool = True) -> str:
    text = "".join(f"{IM_START}{m.role}\n{m.content}{IM_END}\n" for m in messages)
    return text + (f"{IM_START}assistant\n" if generation_prompt else "")


def parse_chat(text: str) -> list[tuple[str, str]] | None:
    """The messages of a rendered context ending in a generation prompt, or None when it is not one."""
    suffix = f"{IM_START}assistant\n"
    if not text.endswith(suffix):
        return None
    body = text[: -len(suffix)]
    msgs, pos = [], 0
    for m in _TURN.finditer(body):
        if m.start() != pos:
            return None
        msgs.append((m.group(1), m.group(2)))
        pos = m.end()
    return msgs if pos == len(body) else None


class ScriptedProxy(pg.LLMProxyServicer):
    def __init__(self, policies: dict[str, Policy] | None = None, token: str | None = None,
                 actor_id: str = "scripted-actor-0") -> None:
        self.policies = dict(policies or {})
        self.token = token
        self.actor_id = actor_id
        self.version = 0
        self.version_after: tuple[int, int] | None = None  # (token index, new version) within every turn
        self.token_delay = 0.0
        self.task_delay: dict[str, float] = {}
        self.fail: dict[str, list[str]] = defaultdict(list)
        self.hashes: dict[str, dict[int, bytes]] = {}
        self.lock = threading.Lock()
        self.aborted: set[str] = set()
        self.abort_calls: list[tuple[float, list[str]]] = []
        self.contexts: list[tuple[str, str, int]] = []  # (trajectory, task, context length)
        # (wall-clock arrival, trajectory, turn, first user message) of every Generate call
        self.arrivals: list[tuple[float, str, int, str]] = []
        self.malformed: list[str] = []
        self.calls: dict[str, int] = defaultdict(int)
        self.baggage: dict[str, str] = {}  # trajectory id -> the baggage header of its last Generate call
        self.server: grpc.Server | None = None
        self.address = ""

    # -- server ------------------------------------------------------------------------------------------------
    def start(self) -> ScriptedProxy:
        self.server = grpc.server(futures.ThreadPoolExecutor(64))
        pg.add_LLMProxyServicer_to_server(self, self.server)
        port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()
        self.address = f"127.0.0.1:{port}"
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop(0)

    def _auth(self, context) -> None:
        if self.token and dict(context.invocation_metadata()).get("authorization") != f"Bearer {self.token}":
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or invalid bearer job token")

    # -- RPCs ------------------------------------------------------------------------------------------------
    def Tokenize(self, request: pp.ProxyTokenizeRequest, context) -> c.TokenizeResponse:
        self._auth(context)
        inp = request.request.input
        if inp.token_ids:
            return c.TokenizeResponse(token_ids=inp.token_ids, model="scripted")
        if inp.messages:
            text = render(inp.messages, not inp.no_generation_prompt)
            return c.TokenizeResponse(token_ids=encode(text), rendered=text, model="scripted", max_model_len=1 << 20)
        return c.TokenizeResponse(token_ids=encode(inp.text), rendered=inp.text, model="scripted")

    def Abort(self, request: pp.ProxyAbortRequest, context) -> pp.ProxyAbortResponse:
        self._auth(context)
        with self.lock:
            self.aborted.update(request.trajectory_ids)
            self.abort_calls.append((time.monotonic(), list(request.trajectory_ids)))
        return pp.ProxyAbortResponse(aborted_trajectory_ids=list(request.trajectory_ids))

    def Generate(self, request: pp.TrajectoryGenerateRequest, context):
        self._auth(context)
        arrived = time.time()
        tid, task = request.trajectory_id, request.task
        if not tid or not request.input.token_ids:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "trajectory_id and input.token_ids are required")
        with self.lock:
            self.calls[task] += 1
            self.baggage[tid] = dict(context.invocation_metadata()).get("baggage", "")
            plan = self.fail.get(task)
            fault = plan.pop(0) if plan else ""
        text = decode(request.input.token_ids)
        msgs = parse_chat(text)
        with self.lock:
            self.contexts.append((tid, task, len(request.input.token_ids)))
            first_user = next((m for r, m in msgs or [] if r == "user"), "")
            self.arrivals.append((arrived, tid, request.turn, first_user))
            if msgs is None:
                self.malformed.append(text[-400:])
        if fault == "unavailable":
            context.set_trailing_metadata([("rollart-retryable", "true"), ("rollart-failed-actor", self.actor_id),
                                           ("rollart-tokens-streamed", "0")])
            context.abort(grpc.StatusCode.UNAVAILABLE, f"actor {self.actor_id} died")
        yield pp.TrajectoryGenerateResponse(
            route=pp.RouteInfo(actor_id=self.actor_id, actor_endpoint=self.address, pool="scripted",
                               reason=pp.ROUTE_REASON_LEAST_LOADED, actor_version=self.version),
            chunk=c.GenerationChunk(request_id=request.request_id, trajectory_id=tid, actor_id=self.actor_id))
        if fault == "hang":
            while tid not in self.aborted and context.is_active():
                time.sleep(0.01)
            yield self._last(request, 0, c.FINISH_REASON_ABORTED)
            return
        policy = self.policies.get(task) or self.policies.get("*")
        action = policy(msgs or []) if policy is not None else "..."
        ids = encode(action)[: max(request.sampling.max_tokens - 1, 0)] + [SPECIAL[IM_END]]
        finish = c.FINISH_REASON_STOP if len(ids) <= request.sampling.max_tokens else c.FINISH_REASON_LENGTH
        ids = ids[: request.sampling.max_tokens]
        delay = self.task_delay.get(task, self.token_delay)
        offset = 0
        used: set[int] = set()
        while offset < len(ids):
            if tid in self.aborted:
                yield self._last(request, offset, c.FINISH_REASON_ABORTED)
                return
            if not context.is_active():
                return
            part = ids[offset: offset + 8]
            if delay:
                time.sleep(delay * len(part))
            versions = []
            for i in range(offset, offset + len(part)):
                v = self.version
                if self.version_after is not None and i >= self.version_after[0]:
                    v = self.version_after[1]
                versions.append(v)
            used.update(versions)
            yield pp.TrajectoryGenerateResponse(chunk=c.GenerationChunk(
                request_id=request.request_id, trajectory_id=tid, actor_id=self.actor_id, offset=offset,
                token_ids=part, logprobs=[-0.1] * len(part), versions=versions,
                text=decode([t for t in part if t not in SPECIAL_IDS])))
            offset += len(part)
        reported = self.hashes.get(task, {})
        yield self._last(request, offset, finish, {v: reported[v] for v in used if v in reported})

    def _last(self, request, offset: int, finish: int,
              hashes: dict[int, bytes] | None = None) -> pp.TrajectoryGenerateResponse:
        return pp.TrajectoryGenerateResponse(chunk=c.GenerationChunk(
            request_id=request.request_id, trajectory_id=request.trajectory_id, actor_id=self.actor_id, offset=offset,
            finish_reason=finish, usage=c.GenerationUsage(completion_tokens=offset), version_hashes=hashes or {}))

