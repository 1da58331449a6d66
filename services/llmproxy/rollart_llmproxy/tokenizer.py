"""A local tokenizer from a model directory: ``tokenizer.json`` (Hugging Face `tokenizers`) plus the chat
template of ``tokenizer_config.json`` rendered with a sandboxed Jinja2, as transformers would render it.

Used when ``tokenizer_dir`` is configured, so that counting and tokenizing messages needs no actor round trip.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer

from rollart.v1 import common_pb2


class TokenizerError(ValueError):
    pass


class LocalTokenizer:
    def __init__(self, model_dir: Path) -> None:
        self.model_dir = Path(model_dir)
        self.tokenizer = Tokenizer.from_file(str(self.model_dir / "tokenizer.json"))
        cfg_path = self.model_dir / "tokenizer_config.json"
        cfg: dict[str, Any] = json.loads(cfg_path.read_text()) if cfg_path.is_file() else {}
        self.bos_token = _token_text(cfg.get("bos_token"))
        self.eos_token = _token_text(cfg.get("eos_token"))
        template = cfg.get("chat_template")
        if isinstance(template, list):  # [{"name": "default", "template": ...}, ...]
            named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
            template = named.get("default") or next(iter(named.values()), None)
        jinja_file = self.model_dir / "chat_template.jinja"  # where transformers >= 4.43 saves it
        if jinja_file.is_file():
            template = jinja_file.read_text()
        # The environment transformers renders chat templates in.
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise
        self.template = env.from_string(template) if template else None
        try:
            self.model_max_length = int(cfg.get("model_max_length") or 0)
        except (TypeError, ValueError):
            self.model_max_length = 0

    def render(self, messages: list[dict[str, Any]], add_generation_prompt: bool, **kwargs: Any) -> str:
        if self.template is None:
            raise TokenizerError(f"{self.model_dir} has no chat template")
        return self.template.render(
            messages=messages,
            add_generation_prompt=add_generation_prompt,
            bos_token=self.bos_token,
            eos_token=self.eos_token,
            **kwargs,
        )

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def tokenize(self, inp: common_pb2.ModelInput, add_special_tokens: bool = False) -> tuple[list[int], str]:
        """Token ids and rendered text of a ModelInput, as the engine would see them."""
        if inp.token_ids:
            return list(inp.token_ids), ""
        if inp.messages:
            kwargs = {k: _kwarg(v) for k, v in inp.chat_template_kwargs.items()}
            msgs = [{"role": m.role, "content": m.content} for m in inp.messages]
            text = self.render(msgs, not inp.no_generation_prompt, **kwargs)
            return self.encode(text, add_special_tokens=False), text
        return self.encode(inp.text, add_special_tokens=add_special_tokens), inp.text


def _token_text(value: Any) -> str:
    if isinstance(value, dict):
        return str(value.get("content") or "")
    return str(value or "")


def _kwarg(value: str) -> Any:
    low = value.strip().lower()
    if low in ("true", "false"):
        return low == "true"
    return value


def _tojson(
    value: Any, ensure_ascii: bool = False, indent: int | None = None, separators=None, sort_keys: bool = False
) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _raise(message: str) -> None:
    raise TokenizerError(message)
