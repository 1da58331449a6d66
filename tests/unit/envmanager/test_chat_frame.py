"""The chat frame: what the envmanager appends between turns, learned from a chat template."""

import asyncio

import pytest

from rollart.v1 import common_pb2 as c
from rollart_envmanager.chat import ChatFrame, FrameError, learn_frame


def tokenizer(template):
    """A tokenize() over a character-level vocabulary (id = code point) rendering ``template(messages, gen)``."""

    async def tokenize(inp: c.ModelInput) -> c.TokenizeResponse:
        if inp.messages:
            text = template([(m.role, m.content) for m in inp.messages], not inp.no_generation_prompt)
        else:
            text = inp.text
        return c.TokenizeResponse(token_ids=[ord(ch) for ch in text], rendered=text)

    return tokenize


def qwen(msgs, gen):
    return "".join(f"<s>{r}\n{t}</s>\n" for r, t in msgs) + ("<s>assistant\n" if gen else "")


def test_frame_of_a_qwen_like_template_reproduces_the_rendering():
    frame = asyncio.run(learn_frame(tokenizer(qwen)))
    assert frame.closing == "</s>\n" and frame.user_prefix == "<s>user\n"
    assert frame.user_suffix == "</s>\n<s>assistant\n"
    # prompt + action (as generated, ending on its end-of-turn) + observation == the template's rendering
    prompt = qwen([("user", "q")], True)
    for action in ("a1</s>", "a1</", "a1"):  # stopped on the end token, cut inside it, truncated before it
        ids = [ord(ch) for ch in action]
        obs_ids = frame.pending_closing(ids) + [ord(ch) for ch in frame.observation_text("o2")]
        text = prompt + "".join(map(chr, ids + obs_ids))
        assert text == qwen([("user", "q"), ("assistant", "a1"), ("user", "o2")], True), action


def test_pending_closing_edge_cases():
    frame = ChatFrame("</s>\n", tuple(ord(ch) for ch in "</s>\n"), "", "")
    assert frame.pending_closing([]) == list(frame.closing_ids)
    assert frame.pending_closing([ord(ch) for ch in "x</s>\n"]) == []
    assert ChatFrame("", (), "", "").pending_closing([1, 2]) == []


def test_templates_that_rewrite_history_are_refused():
    def rewriting(msgs, gen):  # drops earlier assistant turns once a user message follows (like thinking strips)
        last = len(msgs) - 1
        return "".join(f"[{r}]{t}" for i, (r, t) in enumerate(msgs) if r != "assistant" or i == last) + \
            ("[assistant]" if gen else "")

    with pytest.raises(FrameError):
        asyncio.run(learn_frame(tokenizer(rewriting)))

    async def no_rendering(inp):
        return c.TokenizeResponse(token_ids=[1])

    with pytest.raises(FrameError):
        asyncio.run(learn_frame(no_rendering))
