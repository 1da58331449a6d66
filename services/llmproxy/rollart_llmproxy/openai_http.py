"""An OpenAI-compatible HTTP API over the proxy: /v1/models, /v1/completions, /v1/chat/completions (JSON or
server-sent events), so that any agent framework produces trajectories through RollArt.

- Authentication: ``Authorization: Bearer <job token>`` (the OpenAI client's api_key).
- ``X-Rollart-Trajectory-Id`` names the trajectory (stickiness, Abort); without it every request is its own
  trajectory. Optional: ``X-Rollart-Task`` (affinity), ``X-Rollart-Turn``, ``X-Rollart-Lease-Id``,
  ``X-Rollart-Min-Version``, ``X-Rollart-Preferred-Actor``, ``X-Rollart-Timeout`` (seconds).
- Every response (and stream chunk) carries a ``rollart`` object with what RL needs and OpenAI lacks: token
  ids, the behaviour logprob and policy version of every token, the prompt token ids and the actor.
- A failed turn answers with the HTTP status of its gRPC code (503 + ``Retry-After`` and
  ``X-Rollart-Retryable: true`` for the retryable UNAVAILABLE); inside a stream it is an ``error`` event.
"""

from __future__ import annotations

import hmac
import json
import logging
import time
from contextlib import aclosing
from typing import Annotated, Any, Literal, cast

import grpc
from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from rollart.runtime import ids
from rollart.v1 import common_pb2
from rollart.v1 import llmproxy_pb2 as pp

from . import metrics
from .core import Proxy, TurnError

log = logging.getLogger(__name__)

FINISH = {
    common_pb2.FINISH_REASON_STOP: "stop",
    common_pb2.FINISH_REASON_LENGTH: "length",
    common_pb2.FINISH_REASON_ABORTED: "abort",
}
HTTP_OF = {
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.FAILED_PRECONDITION: 400,
    grpc.StatusCode.OUT_OF_RANGE: 400,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 400,  # the prompt exceeds the context
    grpc.StatusCode.UNAUTHENTICATED: 401,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.ALREADY_EXISTS: 409,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
}
MAX_BODY = 64 * 1024 * 1024
# Bounds of the numbers a client sends (they end in int32/int64/float protobuf fields): out of range is the
# client's fault, 400, never a ValueError from protobuf (500).
INT32_MAX = 2**31 - 1
INT64 = (-(2**63), 2**63 - 1)
MAX_TOKENS = 1 << 20
MAX_TIMEOUT_S = 24 * 3600.0
# Label values of the HTTP metrics: the routes; any other path counts as "other" (a bounded label set).
ROUTES = ("/health", "/v1/models", "/v1/completions", "/v1/chat/completions")
TokenId = Annotated[int, Field(ge=0, le=INT32_MAX)]


class _Body(BaseModel):
    # Unknown fields are ignored, as OpenAI clients send many optional ones.
    model_config = ConfigDict(extra="ignore")

    model: str = Field("", max_length=256)
    max_tokens: int | None = Field(None, ge=1, le=MAX_TOKENS)
    temperature: float | None = Field(None, ge=0, le=100, allow_inf_nan=False)
    top_p: float | None = Field(None, ge=0, le=1, allow_inf_nan=False)
    top_k: int | None = Field(None, ge=-1, le=INT32_MAX)
    n: int = Field(1, ge=1, le=INT32_MAX)
    stop: str | list[str] | None = Field(None, max_length=64)
    stop_token_ids: list[TokenId] | None = Field(None, max_length=1024)
    seed: int | None = Field(None, ge=INT64[0], le=INT64[1])
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    presence_penalty: float = Field(0.0, allow_inf_nan=False)
    frequency_penalty: float = Field(0.0, allow_inf_nan=False)
    repetition_penalty: float | None = Field(None, ge=0, le=100, allow_inf_nan=False)
    ignore_eos: bool = False
    user: str | None = None


class CompletionBody(_Body):
    prompt: str | list[TokenId] | list[str] | list[list[TokenId]]
    echo: bool = False
    logprobs: int | None = Field(None, ge=0, le=INT32_MAX)
    suffix: str | None = None
    best_of: int | None = None


class _Part(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: str
    text: str = ""


class _Message(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | list[_Part] | None = None


class ChatBody(_Body):
    messages: list[_Message] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1, le=MAX_TOKENS)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=INT32_MAX)
    tools: list[Any] | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, Any] | None = None


class HttpError(Exception):
    def __init__(self, status: int, message: str, code: str = "invalid_request", headers: dict | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.headers = headers or {}


def error_response(status: int, message: str, code: str, headers: dict | None = None) -> web.Response:
    kind = {401: "authentication_error", 404: "not_found_error", 503: "service_unavailable", 504: "timeout_error"}.get(
        status, "invalid_request_error" if status < 500 else "server_error"
    )
    body = {"error": {"message": message, "type": kind, "param": None, "code": code}}
    return web.json_response(body, status=status, headers=headers)


def _turn_error(exc: TurnError) -> HttpError:
    status = HTTP_OF.get(exc.code, 500)
    headers = {"X-" + k.title(): v for k, v in exc.trailing}  # rollart-retryable -> X-Rollart-Retryable
    if status == 503:
        headers["Retry-After"] = "1"
    return HttpError(status, exc.message, exc.code.name.lower(), headers)


class OpenAIServer:
    def __init__(self, proxy: Proxy) -> None:
        self.proxy = proxy
        self.cfg = proxy.cfg
        token = self.cfg.token()
        self._expected = None if self.cfg.insecure_disable_auth or token is None else f"Bearer {token}".encode()
        self.app = web.Application(middlewares=[self._middleware], client_max_size=MAX_BODY)
        self.app.router.add_get("/health", self.health)
        self.app.router.add_get("/v1/models", self.models)
        self.app.router.add_post("/v1/completions", self.completions)
        self.app.router.add_post("/v1/chat/completions", self.chat)
        self.runner: web.AppRunner | None = None
        self.address = ""

    async def start(self, listen: str) -> str:
        host, _, port = listen.rpartition(":")
        # Client disconnects cancel the handler, which cancels the actor call.
        self.runner = web.AppRunner(self.app, handler_cancellation=True, access_log=None, shutdown_timeout=2.0)
        await self.runner.setup()
        site = web.TCPSite(self.runner, host, int(port))
        await site.start()
        bound = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.address = f"{host}:{bound}"
        return self.address

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()

    # --------------------------------------------------------------------------------------------- plumbing

    @web.middleware
    async def _middleware(self, request: web.Request, handler) -> web.StreamResponse:
        path = request.path
        try:
            if path != "/health" and self._expected is not None:
                presented = request.headers.get("Authorization", "").encode()
                if not presented:
                    raise HttpError(401, "missing bearer token (Authorization: Bearer <job token>)", "invalid_api_key")
                if not hmac.compare_digest(presented, self._expected):
                    raise HttpError(401, "invalid bearer token", "invalid_api_key")
            resp = await handler(request)
        except HttpError as exc:
            resp = error_response(exc.status, exc.message, exc.code, exc.headers)
        except web.HTTPException as exc:
            resp = error_response(exc.status, exc.reason or "error", "http_error")
        metrics.HTTP_REQUESTS.labels(path if path in ROUTES else "other", str(resp.status)).inc()
        return resp

    @staticmethod
    async def _json(request: web.Request, model: type[BaseModel]) -> Any:
        raw = await request.read()
        try:
            data = json.loads(raw)
        except RecursionError:  # e.g. 50,000 nested arrays: the client's fault, not a server error
            raise HttpError(400, "request body is nested too deeply") from None
        except (ValueError, UnicodeDecodeError) as exc:
            raise HttpError(400, f"request body is not valid JSON: {str(exc)[:200]}") from None
        if not isinstance(data, dict):
            raise HttpError(400, "request body must be a JSON object")
        try:
            return model.model_validate(data)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "body"
            raise HttpError(400, f"{where}: {first['msg']} ({exc.error_count()} problem(s))") from None

    def _turn_request(
        self, request: web.Request, body: _Body, inp: common_pb2.ModelInput, max_tokens: int
    ) -> pp.TrajectoryGenerateRequest:
        if body.n != 1:
            raise HttpError(400, "n > 1 is not supported: send one request per sample (each its own trajectory)")
        if body.presence_penalty or body.frequency_penalty:
            raise HttpError(400, "presence_penalty and frequency_penalty are not supported (use repetition_penalty)")
        h = request.headers
        stop = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
        sampling = common_pb2.SamplingParams(
            temperature=1.0 if body.temperature is None else body.temperature,
            top_p=1.0 if body.top_p is None else body.top_p,
            top_k=body.top_k or 0,
            max_tokens=max_tokens,
            stop=stop,
            stop_token_ids=body.stop_token_ids or [],
            seed=body.seed or 0,
            logprobs=True,  # RL needs the behaviour logprobs; they travel in the `rollart` extension
            repetition_penalty=body.repetition_penalty or 1.0,
            ignore_eos=body.ignore_eos,
        )
        try:
            turn = int(h.get("X-Rollart-Turn", "0"))
            min_version = int(h.get("X-Rollart-Min-Version", "0"))
            timeout = float(h["X-Rollart-Timeout"]) if "X-Rollart-Timeout" in h else None
        except ValueError as exc:
            raise HttpError(400, f"bad X-Rollart-* header: {str(exc)[:200]}") from None
        if not 0 <= turn <= INT32_MAX:
            raise HttpError(400, f"X-Rollart-Turn must be within [0, {INT32_MAX}]")
        if not INT64[0] <= min_version <= INT64[1]:
            raise HttpError(400, "X-Rollart-Min-Version must be a 64-bit integer")
        if timeout is not None and not (0 < timeout <= MAX_TIMEOUT_S):  # also refuses NaN
            raise HttpError(400, f"X-Rollart-Timeout must be within (0, {MAX_TIMEOUT_S:g}] seconds")
        req = pp.TrajectoryGenerateRequest(
            trajectory_id=h.get("X-Rollart-Trajectory-Id") or ids.new_id("oai", nbytes=16),
            turn=turn,
            task=h.get("X-Rollart-Task", self.cfg.openai_task),
            input=inp,
            sampling=sampling,
            preferred_actor_id=h.get("X-Rollart-Preferred-Actor", ""),
            min_version=min_version,
            lease_id=h.get("X-Rollart-Lease-Id", ""),
            return_text=True,
        )
        if timeout is not None:
            req.deadline.FromNanoseconds(int((time.time() + timeout) * 1e9))
        return req

    def _model(self, body: _Body) -> str:
        if body.model:
            return body.model
        models = self.proxy.models()
        return models[0] if models else "rollart"

    # --------------------------------------------------------------------------------------------- routes

    async def health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def models(self, request: web.Request) -> web.Response:
        now = int(time.time())
        data = [{"id": m, "object": "model", "created": now, "owned_by": "rollart"} for m in self.proxy.models()]
        return web.json_response({"object": "list", "data": data})

    async def completions(self, request: web.Request) -> web.StreamResponse:
        body: CompletionBody = await self._json(request, CompletionBody)
        if body.echo or body.suffix or (body.best_of or 1) > 1:
            raise HttpError(400, "echo, suffix and best_of are not supported")
        p = body.prompt
        if isinstance(p, list) and p and isinstance(p[0], (str, list)):
            if len(p) != 1:
                raise HttpError(400, "one prompt per request (a batch of prompts is not supported)")
            p = p[0]
        if isinstance(p, str):
            inp = common_pb2.ModelInput(text=p)
        else:
            ids = cast(list[int], p)  # token ids: a batch of one prompt was unwrapped above
            if not ids or min(ids) < 0:
                raise HttpError(400, "prompt token ids must be a non-empty list of ids >= 0")
            inp = common_pb2.ModelInput(token_ids=ids)
        if not (inp.text or inp.token_ids):
            raise HttpError(400, "prompt must not be empty")
        req = self._turn_request(request, body, inp, body.max_tokens or 16)
        return await self._serve(request, req, body, chat=False, show_logprobs=body.logprobs is not None)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body: ChatBody = await self._json(request, ChatBody)
        if body.tools:
            raise HttpError(400, "tools are not supported")
        if body.top_logprobs:
            raise HttpError(400, "top_logprobs > 0 is not supported (the sampled token's logprob is returned)")
        messages = []
        for i, m in enumerate(body.messages):
            if isinstance(m.content, list):
                if any(part.type != "text" for part in m.content):
                    raise HttpError(400, f"messages[{i}]: only text content parts are supported")
                content = "".join(part.text for part in m.content)
            else:
                content = m.content or ""
            messages.append(common_pb2.ChatMessage(role=m.role, content=content))
        kwargs = {k: v if isinstance(v, str) else json.dumps(v) for k, v in (body.chat_template_kwargs or {}).items()}
        inp = common_pb2.ModelInput(
            messages=messages,
            no_generation_prompt=body.continue_final_message or not body.add_generation_prompt,
            chat_template_kwargs=kwargs,
        )
        max_tokens = body.max_completion_tokens or body.max_tokens or self.cfg.openai_default_max_tokens
        req = self._turn_request(request, body, inp, max_tokens)
        return await self._serve(request, req, body, chat=True, show_logprobs=body.logprobs)

    # ------------------------------------------------------------------------------------------- responses

    async def _serve(
        self, request: web.Request, req: pp.TrajectoryGenerateRequest, body: _Body, *, chat: bool, show_logprobs: bool
    ) -> web.StreamResponse:
        state = _Accumulator(req, self._model(body), chat, show_logprobs)
        headers = {"X-Rollart-Trajectory-Id": req.trajectory_id}
        gen = self.proxy.generate(req)
        async with aclosing(gen):
            try:
                first = await anext(gen, None)
            except TurnError as exc:
                err = _turn_error(exc)
                err.headers.update(headers)
                raise err from None
            if not body.stream:
                try:
                    if first is not None:
                        state.add(first)
                        async for resp in gen:
                            state.add(resp)
                except TurnError as exc:
                    err = _turn_error(exc)
                    err.headers.update(headers)
                    raise err from None
                return web.json_response(state.final(), headers=headers)
            include_usage = bool((body.stream_options or {}).get("include_usage"))
            stream = web.StreamResponse(
                headers={**headers, "Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
            )
            await stream.prepare(request)
            if chat:
                await _sse(stream, state.chunk({"role": "assistant", "content": ""}, None))
            try:
                if first is not None:
                    await self._emit(stream, state, first)
                    async for resp in gen:
                        await self._emit(stream, state, resp)
            except TurnError as exc:
                err = _turn_error(exc)
                await _sse(
                    stream,
                    {
                        "error": {
                            "message": err.message,
                            "type": "server_error",
                            "code": err.code,
                            "retryable": exc.retryable,
                        }
                    },
                )
                await stream.write(b"data: [DONE]\n\n")
                return stream
            if include_usage:
                await _sse(stream, state.usage_chunk())
            await stream.write(b"data: [DONE]\n\n")
            await stream.write_eof()
            return stream

    @staticmethod
    async def _emit(stream: web.StreamResponse, state: "_Accumulator", resp: pp.TrajectoryGenerateResponse) -> None:
        delta = state.add(resp)
        c = resp.chunk
        finish = FINISH.get(c.finish_reason)
        if not delta and finish is None and not c.token_ids:
            return
        await _sse(stream, state.stream_chunk(resp, delta, finish))


async def _sse(stream: web.StreamResponse, payload: dict) -> None:
    await stream.write(b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n")


class _Accumulator:
    """Builds OpenAI response objects from the proxy's chunks."""

    def __init__(self, req: pp.TrajectoryGenerateRequest, model: str, chat: bool, show_logprobs: bool) -> None:
        self.req = req
        self.model = model
        self.chat = chat
        self.show_logprobs = show_logprobs
        self.id = ids.new_id("chatcmpl" if chat else "cmpl", nbytes=16)
        self.created = int(time.time())
        self.text: list[str] = []
        self.token_ids: list[int] = []
        self.logprobs: list[float] = []
        self.versions: list[int] = []
        self.token_texts: list[str] = []
        self.prompt_token_ids: list[int] = []
        self.finish: str | None = None
        self.stop_reason: str | None = None
        self.usage: common_pb2.GenerationUsage | None = None
        self.route: pp.RouteInfo | None = None
        self.request_id = ""

    def add(self, resp: pp.TrajectoryGenerateResponse) -> str:
        if resp.HasField("route"):
            self.route = resp.route
        c = resp.chunk
        self.request_id = c.request_id or self.request_id
        if c.prompt_token_ids:
            self.prompt_token_ids = list(c.prompt_token_ids)
        self.token_ids.extend(c.token_ids)
        self.logprobs.extend(c.logprobs)
        self.versions.extend(c.versions)
        n = len(c.token_ids)
        if n:
            # Per-token strings are exact when chunks hold one token (the proxy's default chunking).
            self.token_texts.extend([c.text] if n == 1 else [f"token_id:{t}" for t in c.token_ids])
        if c.text:
            self.text.append(c.text)
        if c.finish_reason:
            self.finish = FINISH.get(c.finish_reason)
            self.stop_reason = c.stop_reason or None
        if c.HasField("usage"):
            self.usage = c.usage
        return c.text

    def _rollart(self, token_ids, logprobs, versions) -> dict:
        out = {
            "trajectory_id": self.req.trajectory_id,
            "request_id": self.request_id,
            "token_ids": list(token_ids),
            "logprobs": [round(x, 6) for x in logprobs],
            "versions": list(versions),
        }
        if self.route is not None:
            out["actor_id"] = self.route.actor_id
            out["route_reason"] = pp.RouteReason.Name(self.route.reason).removeprefix("ROUTE_REASON_").lower()
            if self.route.prefill_actor_id:
                out["prefill_actor_id"] = self.route.prefill_actor_id
        if self.prompt_token_ids:
            out["prompt_token_ids"] = self.prompt_token_ids
        return out

    def _usage(self) -> dict:
        prompt = self.usage.prompt_tokens if self.usage is not None else len(self.prompt_token_ids)
        completion = self.usage.completion_tokens if self.usage is not None else len(self.token_ids)
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}

    def _logprobs(self, texts: list[str], logprobs: list[float]) -> dict | None:
        if not self.show_logprobs or not logprobs:
            return None
        if self.chat:
            return {
                "content": [
                    {"token": t, "logprob": lp_, "bytes": list(t.encode()), "top_logprobs": []}
                    for t, lp_ in zip(texts, logprobs)
                ]
            }
        return {"tokens": texts, "token_logprobs": logprobs, "top_logprobs": None, "text_offset": None}

    def final(self) -> dict:
        text = "".join(self.text)
        lps = self._logprobs(self.token_texts, self.logprobs)
        if self.chat:
            choice = {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "logprobs": lps,
                "finish_reason": self.finish,
                "stop_reason": self.stop_reason,
            }
        else:
            choice = {
                "index": 0,
                "text": text,
                "logprobs": lps,
                "finish_reason": self.finish,
                "stop_reason": self.stop_reason,
            }
        return {
            "id": self.id,
            "object": "chat.completion" if self.chat else "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": [choice],
            "usage": self._usage(),
            "rollart": self._rollart(self.token_ids, self.logprobs, self.versions),
        }

    def chunk(
        self, delta: dict | str, finish: str | None, extra: dict | None = None, logprobs: dict | None = None
    ) -> dict:
        if self.chat:
            choice = {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
        else:
            choice = {"index": 0, "text": delta, "logprobs": logprobs, "finish_reason": finish}
        out: dict[str, Any] = {
            "id": self.id,
            "object": "chat.completion.chunk" if self.chat else "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": [choice],
        }
        if extra is not None:
            out["rollart"] = extra
        return out

    def stream_chunk(self, resp: pp.TrajectoryGenerateResponse, delta: str, finish: str | None) -> dict:
        c = resp.chunk
        n = len(c.token_ids)
        texts = self.token_texts[len(self.token_texts) - n :] if n else []
        extra = self._rollart(c.token_ids, c.logprobs, c.versions)
        out = self.chunk(
            {"content": delta} if self.chat else delta, finish, extra, self._logprobs(texts, list(c.logprobs))
        )
        if finish is not None:
            out["choices"][0]["stop_reason"] = self.stop_reason
        return out

    def usage_chunk(self) -> dict:
        return {
            "id": self.id,
            "object": "chat.completion.chunk" if self.chat else "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": [],
            "usage": self._usage(),
        }
