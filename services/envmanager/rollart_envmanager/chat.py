"""The token history of a trajectory: the first prompt rendered with the model's chat template, then, turn
after turn, the action tokens exactly as generated and the observation's tokens framed as a user message.

The generated tokens are never re-tokenized (RL trains on what the policy sampled). An observation is
appended as the text the chat template would put between the end of an assistant message and the next
generation prompt; that frame is learned once per task from the template itself (through the LLMProxy's
Tokenize, so the envmanager needs no tokenizer):

    closing      = what follows an assistant message's content           e.g. "<|im_end|>\\n"
    user_prefix  = what precedes a user message's content                e.g. "<|im_start|>user\\n"
    user_suffix  = what follows it, up to and including the generation prompt
                                                                         e.g. "<|im_end|>\\n<|im_start|>assistant\\n"

The observation tokens of a turn are the part of ``closing`` the model did not generate itself (a model that
stopped on its end-of-turn token already produced it), then ``user_prefix + observation + user_suffix``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from rollart.v1 import common_pb2

# Placeholders that no template alters; their positions in the rendered text give the frame.
_ACTION = "\ue000rollart-action\ue001"
_USER = "\ue002rollart-user\ue003"

Tokenizer = Callable[[common_pb2.ModelInput], Awaitable[common_pb2.TokenizeResponse]]


class FrameError(ValueError):
    """The chat template does not render the way the frame needs (the placeholders moved or vanished)."""


@dataclass(frozen=True)
class ChatFrame:
    closing: str
    closing_ids: tuple[int, ...]
    user_prefix: str
    user_suffix: str

    def pending_closing(self, action_ids: Sequence[int]) -> list[int]:
        """The closing tokens the action did not already end with (all of them after a truncated action)."""
        closing = self.closing_ids
        for k in range(min(len(closing), len(action_ids)), 0, -1):
            if tuple(action_ids[-k:]) == closing[:k]:
                return list(closing[k:])
        return list(closing)

    def observation_text(self, observation: str) -> str:
        return self.user_prefix + observation + self.user_suffix


def messages(items: Sequence[tuple[str, str]]) -> list[common_pb2.ChatMessage]:
    return [common_pb2.ChatMessage(role=r, content=c) for r, c in items]


async def learn_frame(tokenize: Tokenizer) -> ChatFrame:
    """The frame of the template behind ``tokenize`` (two renderings and one tokenization)."""
    conv = [("user", "u"), ("assistant", _ACTION)]
    a = await tokenize(common_pb2.ModelInput(messages=messages(conv), no_generation_prompt=True))
    b = await tokenize(common_pb2.ModelInput(messages=messages([*conv, ("user", _USER)])))
    ra, rb = a.rendered, b.rendered
    if _ACTION not in ra or _USER not in rb:
        raise FrameError("the tokenizer did not return the rendered chat template (TokenizeResponse.rendered)")
    closing = ra[ra.rindex(_ACTION) + len(_ACTION):]
    if not rb.startswith(ra):
        raise FrameError("the chat template renders earlier messages differently once a user message follows")
    after = rb[len(ra):]
    at = after.index(_USER)
    closing_ids: tuple[int, ...] = ()
    if closing:
        c = await tokenize(common_pb2.ModelInput(text=closing))
        closing_ids = tuple(c.token_ids)
    return ChatFrame(closing, closing_ids, after[:at], after[at + len(_USER):])
