"""`rollart-devtools tiny-model`: tokenizer, chat template, checkpoint layout, determinism, CLI wiring."""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from rollart_devtools import cli, tiny_model  # noqa: E402
from rollart_devtools.tiny_model import (  # noqa: E402
    CHAT_TEMPLATE,
    ENDOFTEXT,
    IM_END,
    IM_START,
    build_corpus,
    build_tiny_model,
    train_tokenizer,
)

SMALL = {"layers": 2, "hidden": 128, "vocab_size": 512}


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer(build_corpus(), 1024)


@pytest.fixture(scope="module")
def small_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tiny") / "m"
    build_tiny_model(out, seed=0, pretrain_steps=2, **SMALL)
    return out


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_corpus_is_deterministic_and_covers_the_domains() -> None:
    a, b = build_corpus(), build_corpus()
    assert a == b
    text = "\n".join(a)
    for needle in (
        "\\boxed{",
        " + ",
        " = ",
        "Sokoban",
        "Minesweeper",
        "GuessTheNumber",
        "Hanoi",
        "FrozenLake",
        "TicTacToe",
        f"{IM_START}assistant\n",
        f"{IM_START}user\n",
        IM_END,
        "How many",
        "#### ",
    ):
        assert needle in text, needle


def test_tokenizer_vocab_and_special_tokens(tokenizer) -> None:
    assert len(tokenizer) == 1024
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in (ENDOFTEXT, IM_START, IM_END)}
    assert sorted(ids.values()) == [0, 1, 2]
    assert tokenizer.eos_token == IM_END and tokenizer.pad_token == ENDOFTEXT
    # A special token in text is one id, never split into bytes.
    assert tokenizer.encode(f"{IM_START}user", add_special_tokens=False)[0] == ids[IM_START]
    # Digits are single tokens (Qwen-style split), so numbers tokenize digit by digit.
    digits = tokenizer.encode("12345", add_special_tokens=False)
    assert len(digits) == 5
    # Byte-level: any text round-trips, including characters never seen in training.
    for text in ("Tom has 3 apples. \\boxed{8}", "héllo 世界 ✓", "  spaces\n\nand\ttabs"):
        assert tokenizer.decode(tokenizer.encode(text, add_special_tokens=False)) == text
    # Common words became tokens (the merges learned something).
    assert len(tokenizer.encode(" the answer is", add_special_tokens=False)) <= 3


def test_chat_template_matches_qwen_format(tokenizer) -> None:
    msgs = [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "What is 2 + 3?"},
        {"role": "assistant", "content": "\\boxed{5}"},
    ]
    rendered = tokenizer.apply_chat_template(msgs, tokenize=False)
    assert rendered == (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n"
        "<|im_start|>assistant\n\\boxed{5}<|im_end|>\n"
    )
    assert rendered == tiny_model.render_chat(msgs)  # the corpus uses the same format
    prompt = tokenizer.apply_chat_template(msgs[:2], tokenize=False, add_generation_prompt=True)
    assert prompt.endswith("<|im_end|>\n<|im_start|>assistant\n")
    # OpenAI-style content parts render like plain strings.
    parts = [
        {"role": "user", "content": [{"type": "text", "text": "What is "}, {"type": "text", "text": "2?"}]}
    ]
    assert tokenizer.apply_chat_template(parts, tokenize=False) == "<|im_start|>user\nWhat is 2?<|im_end|>\n"


def test_checkpoint_layout_loads_back(small_model: Path) -> None:
    import torch
    from safetensors import safe_open
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    for name in (
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ):
        assert (small_model / name).is_file(), name
    config = AutoConfig.from_pretrained(small_model)
    assert config.model_type == "qwen3" and config.architectures == ["Qwen3ForCausalLM"]
    assert (config.num_hidden_layers, config.hidden_size, config.vocab_size) == (2, 128, 512)
    assert config.num_attention_heads == 2 and config.num_key_value_heads == 1 and config.head_dim == 64
    tok = AutoTokenizer.from_pretrained(small_model)
    assert len(tok) <= config.vocab_size
    assert config.eos_token_id == tok.convert_tokens_to_ids(IM_END)
    gen = json.loads((small_model / "generation_config.json").read_text())
    assert tok.convert_tokens_to_ids(IM_END) in gen["eos_token_id"]
    tok_cfg = json.loads((small_model / "tokenizer_config.json").read_text())
    assert (
        tok_cfg["tokenizer_class"] == "PreTrainedTokenizerFast" and tok_cfg["chat_template"] == CHAT_TEMPLATE
    )
    with safe_open(str(small_model / "model.safetensors"), "pt") as f:
        names = set(f.keys())
        assert all(f.get_tensor(n).dtype == torch.bfloat16 for n in names)
    # HF names, unfused: what vLLM's loader and the weight-update extension expect.
    assert "model.layers.0.self_attn.q_proj.weight" in names and "lm_head.weight" in names
    assert (
        "model.layers.1.mlp.gate_proj.weight" in names and "model.layers.0.self_attn.q_norm.weight" in names
    )
    model = AutoModelForCausalLM.from_pretrained(small_model, dtype=torch.float32)
    ids = tok.apply_chat_template(
        [{"role": "user", "content": "1 + 1"}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )
    with torch.no_grad():
        logits = model(**ids).logits
    assert logits.shape[-1] == config.vocab_size and torch.isfinite(logits).all()


def test_same_seed_is_byte_identical_other_seed_differs(small_model: Path, tmp_path: Path) -> None:
    again = tmp_path / "again"
    build_tiny_model(again, seed=0, pretrain_steps=2, **SMALL)
    for name in ("model.safetensors", "tokenizer.json", "tokenizer_config.json", "config.json"):
        assert _sha(again / name) == _sha(small_model / name), name
    other = tmp_path / "other"
    build_tiny_model(other, seed=1, pretrain_steps=2, **SMALL)
    assert _sha(other / "model.safetensors") != _sha(small_model / "model.safetensors")
    # The tokenizer depends on the corpus only, so checkpoints of different seeds share token ids.
    assert _sha(other / "tokenizer.json") == _sha(small_model / "tokenizer.json")


def test_pretraining_lowers_the_loss(tmp_path: Path) -> None:
    summary = build_tiny_model(tmp_path / "m", seed=0, pretrain_steps=12, layers=1, hidden=64, vocab_size=512)
    assert summary["first_loss"] > 5.5  # ~ln(512): random init
    assert summary["final_loss"] < summary["first_loss"] - 1.0


def test_bad_dimensions_are_rejected(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="divisible"):
        build_tiny_model(tmp_path / "a", hidden=100, heads=3)
    with pytest.raises(ValueError, match="kv_heads"):
        build_tiny_model(tmp_path / "b", hidden=128, heads=4, kv_heads=3)
    with pytest.raises(ValueError, match="vocab_size"):
        build_tiny_model(tmp_path / "c", vocab_size=100)


def test_cli_subcommand_registration(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main(["tiny-model", "--help"])
    assert "--pretrain-steps" in capsys.readouterr().out
    parser = argparse.ArgumentParser(prog="rollart-devtools")
    tiny_model.add_arguments(parser)
    args = parser.parse_args("--out /x --layers 2 --hidden 128 --vocab 512 --seed 3 --pretrain-steps 0".split())
    assert (args.out, args.layers, args.hidden, args.vocab, args.seed, args.pretrain_steps) == (
        "/x",
        2,
        128,
        512,
        3,
        0,
    )
    assert args.func is tiny_model.run
    defaults = parser.parse_args(["--out", "/y"])
    assert defaults.pretrain_steps == tiny_model.DEFAULT_PRETRAIN_STEPS and defaults.vocab == 1024


def test_console_script_and_lazy_imports(tmp_path: Path) -> None:
    # Importing the tooling's command line must not import torch (a cached warm start answers at once).
    probe = "import sys, rollart_devtools.cli; print('torch' in sys.modules, 'transformers' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]
    script = Path(sys.executable).parent / "rollart-devtools"
    res = subprocess.run(
        [str(script), "tiny-model", "--out", str(tmp_path / "cli")]
        + "--layers 1 --hidden 64 --vocab 512 --pretrain-steps 0".split(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    summary = json.loads(res.stdout[res.stdout.index("{") :])
    assert summary["model_sha256"] == _sha(tmp_path / "cli" / "model.safetensors")
    assert summary["spec"]["layers"] == 1
