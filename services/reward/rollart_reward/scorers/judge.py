"""LLM-as-a-judge through the LLMProxy: a judge prompt goes out on a judge route, a verdict line comes back.

The judge is asked for its reasoning and then one final line, ``VERDICT: CORRECT`` / ``VERDICT: INCORRECT``
(binary scale) or ``SCORE: <0-10>`` (score scale, reward = score / 10). A reply without such a line, an
unreachable proxy or an aborted generation is a FAILED verdict (retryable), never a zero reward.
"""

from __future__ import annotations

import asyncio
import re
import time
from dataclasses import dataclass

import grpc
from grpc import aio

from rollart.runtime.client import channel
from rollart.runtime.config import TLSConfig
from rollart.runtime.timeutil import timestamp
from rollart.v1 import common_pb2, llmproxy_pb2, llmproxy_pb2_grpc

from .base import FAILED, InvalidRequest, ScorerFailure, Verdict, final_answer

OPTIONS = {
    "judge_route": "LLMProxy task tag the judge requests are routed by (default: the service's judge_route)",
    "rubric": "what a good answer must do (added to the prompt)",
    "scale": "'binary' (VERDICT: CORRECT/INCORRECT, default) or 'score' (SCORE: 0-10, reward = score/10)",
    "answer_field": "metadata key of the reference answer, if any (default 'answer')",
    "question_field": "metadata key of the question (default 'question'; else the first observation)",
    "max_tokens": "judge generation budget in tokens (default: the service's judge_max_tokens)",
}
SYSTEM_PROMPT = (
    "You are a careful, impartial grader. You judge whether a response answers a question correctly. "
    "Think briefly, then end your reply with exactly one final line in the requested format."
)
_VERDICT = re.compile(r"VERDICT\s*[:=]\s*\**\s*(CORRECT|INCORRECT|PASS|FAIL|YES|NO)\b", re.IGNORECASE)
_SCORE = re.compile(r"SCORE\s*[:=]\s*\**\s*(-?\d+(?:\.\d+)?)\s*(?:/\s*(\d+(?:\.\d+)?))?", re.IGNORECASE)
MAX_FIELD_CHARS = 6000


def _clip(text: str, limit: int = MAX_FIELD_CHARS) -> str:
    if len(text) <= limit:
        return text
    half = limit // 2
    return text[:half] + "\n[... clipped ...]\n" + text[-half:]


def build_messages(traj: common_pb2.Trajectory, options: dict[str, str]) -> list[common_pb2.ChatMessage]:
    """The judge's chat: a system prompt and one user message with question, reference, rubric and response."""
    scale = options.get("scale", "binary")
    if scale not in ("binary", "score"):
        raise InvalidRequest(f"option scale must be 'binary' or 'score', got {scale!r}")
    response = final_answer(traj)
    question = traj.metadata.get(options.get("question_field") or "question") or (
        traj.turns[0].observation if traj.turns else ""
    )
    reference = traj.metadata.get(options.get("answer_field") or "answer", "")
    parts = [f"## Question\n{_clip(question.strip()) or '(not given)'}"]
    if reference.strip():
        parts.append(f"## Reference answer\n{_clip(reference.strip())}")
    if options.get("rubric", "").strip():
        parts.append(f"## Rubric\n{_clip(options['rubric'].strip())}")
    if len(traj.turns) > 1:
        history = "\n".join(
            f"[turn {i}] observation: {_clip(t.observation, 800)}\n[turn {i}] action: {_clip(t.action, 800)}"
            for i, t in enumerate(traj.turns[:-1])
        )
        parts.append(f"## Earlier turns\n{_clip(history)}")
    parts.append(f"## Response to grade\n{_clip(response.strip()) or '(empty)'}")
    if scale == "binary":
        parts.append(
            "## Your task\nDecide whether the response is correct"
            + (" (it must agree with the reference answer)" if reference.strip() else "")
            + ". End with one line: `VERDICT: CORRECT` or `VERDICT: INCORRECT`."
        )
    else:
        parts.append("## Your task\nRate the response from 0 (worst) to 10 (best). End with one line: `SCORE: <0-10>`.")
    return [
        common_pb2.ChatMessage(role="system", content=SYSTEM_PROMPT),
        common_pb2.ChatMessage(role="user", content="\n\n".join(parts)),
    ]


def parse_verdict(text: str, scale: str = "binary") -> Verdict:
    """The reward in a judge reply (its last verdict line wins); ScorerFailure when there is none."""
    if scale == "binary":
        found = _VERDICT.findall(text)
        if not found:
            raise ScorerFailure(
                "judge_unparseable", f"judge reply has no VERDICT line: {text[-200:]!r}", retryable=True
            )
        correct = found[-1].upper() in ("CORRECT", "PASS", "YES")
        return Verdict(reward=1.0 if correct else 0.0, components={"correct": float(correct)}, explanation=text[-1500:])
    found = _SCORE.findall(text)
    if not found:
        raise ScorerFailure("judge_unparseable", f"judge reply has no SCORE line: {text[-200:]!r}", retryable=True)
    value, denominator = found[-1]
    top = float(denominator) if denominator else 10.0
    if top <= 0:
        raise ScorerFailure("judge_unparseable", f"judge score has a bad scale: {value}/{denominator}", retryable=True)
    score = min(max(float(value) / top, 0.0), 1.0)
    return Verdict(reward=score, components={"score": float(value)}, explanation=text[-1500:])


@dataclass
class JudgeSettings:
    route: str = "judge"
    max_tokens: int = 512


class JudgeClient:
    """Calls rollart.v1.LLMProxy/Generate on the judge route (one channel, reused)."""

    def __init__(
        self,
        address: str | None,
        *,
        token: str | None,
        tls: TLSConfig | None = None,
        settings: JudgeSettings | None = None,
        resolve=None,
    ) -> None:
        self.address = address
        self.token = token
        self.tls = tls
        self.settings = settings or JudgeSettings()
        # Optional coroutine returning the proxy's address (discovery through the resource manager).
        self._resolve = resolve
        self._channel: aio.Channel | None = None
        self._stub: llmproxy_pb2_grpc.LLMProxyStub | None = None

    @property
    def configured(self) -> bool:
        return bool(self.address) or self._resolve is not None

    async def _get_stub(self) -> llmproxy_pb2_grpc.LLMProxyStub:
        if self._stub is None:
            address = self.address
            if not address and self._resolve is not None:
                address = await self._resolve()
            if not address:
                raise ScorerFailure("judge_unreachable", "no LLMProxy is known for the judge", retryable=True)
            self._channel = channel(address, token=self.token, tls=self.tls, default_timeout=None)
            self._stub = llmproxy_pb2_grpc.LLMProxyStub(self._channel)
        return self._stub

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()
            self._channel = self._stub = None

    def request(
        self, traj: common_pb2.Trajectory, options: dict[str, str], budget: float
    ) -> llmproxy_pb2.TrajectoryGenerateRequest:
        try:
            max_tokens = int(options.get("max_tokens") or self.settings.max_tokens)
        except ValueError:
            raise InvalidRequest(f"option max_tokens must be an integer, got {options['max_tokens']!r}") from None
        if max_tokens <= 0:
            raise InvalidRequest("option max_tokens must be > 0")
        deadline = timestamp(time.time() + budget)
        return llmproxy_pb2.TrajectoryGenerateRequest(
            # The judge's own trajectory id, derived from the judged one (stickiness, aborts and tracing).
            trajectory_id=f"{traj.trajectory_id}/judge",
            task=options.get("judge_route") or self.settings.route,
            input=common_pb2.ModelInput(messages=build_messages(traj, options)),
            sampling=common_pb2.SamplingParams(temperature=0.0, max_tokens=max_tokens, logprobs=False),
            deadline=deadline,
            return_text=True,
        )

    async def judge(self, traj: common_pb2.Trajectory, options: dict[str, str], budget: float) -> Verdict:
        req = self.request(traj, options, budget)
        stub = await self._get_stub()
        text: list[str] = []
        finish = common_pb2.FINISH_REASON_UNSPECIFIED
        try:
            async with asyncio.timeout(budget):
                async for resp in stub.Generate(req, timeout=budget):
                    text.append(resp.chunk.text)
                    if resp.chunk.finish_reason:
                        finish = resp.chunk.finish_reason
        except TimeoutError:
            raise ScorerFailure("judge_timeout", f"judge gave no answer within {budget:.1f}s", timeout=True) from None
        except aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                raise ScorerFailure("judge_timeout", f"judge timed out: {exc.details()}", timeout=True) from None
            cause = "judge_unreachable" if exc.code() == grpc.StatusCode.UNAVAILABLE else "judge_error"
            raise ScorerFailure(
                cause, f"LLMProxy Generate failed: {exc.code().name}: {exc.details()}", retryable=True
            ) from None
        if finish == common_pb2.FINISH_REASON_ABORTED:
            return Verdict(
                status=FAILED, error="the judge generation was aborted", cause="judge_aborted", retryable=True
            )
        verdict = parse_verdict("".join(text), options.get("scale", "binary"))
        if finish == common_pb2.FINISH_REASON_LENGTH:
            verdict.components["truncated"] = 1.0
        return verdict
