"""The proxy's local tokenizer renders and tokenizes exactly as transformers does for the tiny model."""

from __future__ import annotations

import pytest

from rollart.v1 import common_pb2
from rollart_llmproxy.tokenizer import LocalTokenizer

tiny = pytest.importorskip("rollart_devtools.tiny_model")
pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("tok")
    tok = tiny.train_tokenizer(tiny.build_corpus(400), 512)
    tok.save_pretrained(out)
    tiny._write_portable_tokenizer_config(out, tok)
    return out, tok


def test_messages_and_text_match_transformers(model_dir):
    path, hf = model_dir
    local = LocalTokenizer(path)
    msgs = [
        {"role": "system", "content": "You solve arithmetic."},
        {"role": "user", "content": "What is 12 + 30? Answer in \\boxed{}."},
        {"role": "assistant", "content": "\\boxed{42}"},
        {"role": "user", "content": "And 7 * 6?"},
    ]
    inp = common_pb2.ModelInput(messages=[common_pb2.ChatMessage(**m) for m in msgs])
    ids, rendered = local.tokenize(inp)
    assert rendered == hf.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    expected = hf.apply_chat_template(msgs, tokenize=True, add_generation_prompt=True)
    expected = expected["input_ids"] if isinstance(expected, dict) or hasattr(expected, "keys") else expected
    assert ids == list(expected)
    inp.no_generation_prompt = True
    assert local.tokenize(inp)[1] == hf.apply_chat_template(msgs, tokenize=False, add_generation_prompt=False)
    text = common_pb2.ModelInput(text="Once upon a time, 3 + 4 = 7.")
    assert local.tokenize(text)[0] == hf.encode(text.text, add_special_tokens=False)
    assert local.decode(local.tokenize(text)[0]) == text.text
    assert local.tokenize(common_pb2.ModelInput(token_ids=[1, 2]))[0] == [1, 2]
    assert local.model_max_length == 4096


async def test_proxy_tokenizes_locally_when_configured(model_dir):
    from rollart_llmproxy.config import LLMProxyConfig
    from rollart_llmproxy.core import Proxy, TurnError

    path, hf = model_dir
    proxy = Proxy(
        LLMProxyConfig(insecure_disable_auth=True, http_listen=None, tokenizer_dir=path, served_model_name="t")
    )
    try:
        req = common_pb2.TokenizeRequest(
            input=common_pb2.ModelInput(messages=[common_pb2.ChatMessage(role="user", content="hi")])
        )
        resp = await proxy.tokenize("", req, 5.0)  # no actor at all: the local tokenizer answers
        assert resp.model == "t" and resp.max_model_len == 4096
        assert resp.rendered == hf.apply_chat_template(
            [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
        )
        with pytest.raises(TurnError):
            await proxy.tokenize("", common_pb2.TokenizeRequest(), 5.0)
    finally:
        await proxy.stop()
