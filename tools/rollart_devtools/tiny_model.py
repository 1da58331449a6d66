"""`rollart-devtools tiny-model`: a real, tiny Qwen3 checkpoint with a locally trained tokenizer.

Tests and examples need a model that vLLM serves without any download. This builds one from nothing:
a byte-level BPE tokenizer trained on a corpus generated here (math word problems, arithmetic, chat
turns, the vocabulary of the text games the env manager hosts), wrapped in `PreTrainedTokenizerFast`
with a Qwen-style chat template, and a `Qwen3ForCausalLM` initialised from a seed. An optional short
warm-start pretraining on the same corpus makes it emit sensible-looking tokens.

Same arguments on the same machine and torch build -> byte-identical files.

Only the standard library is imported at module level: `rollart-devtools` and the warm start's cached path
start without paying for torch; torch, transformers and tokenizers are imported when a model is built.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import random
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = (ENDOFTEXT, IM_START, IM_END)

# Qwen-style: every turn is <|im_start|>role\ncontent<|im_end|>\n. Content may be a string or a list of
# OpenAI-style parts ({"type": "text", "text": ...}) so that OpenAI clients work against it.
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' -}}"
    "{%- if message['content'] is string -%}{{- message['content'] -}}"
    "{%- elif message['content'] is not none -%}"
    "{%- for part in message['content'] -%}"
    "{%- if part['type'] == 'text' -%}{{- part['text'] -}}{%- endif -%}"
    "{%- endfor -%}"
    "{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)

# Qwen2's pre-tokenizer split: single digits (arithmetic stays learnable), words with one leading
# non-letter, punctuation runs, newlines; then byte-level mapping without its own regex.
_QWEN_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# The corpus does not depend on the model seed: checkpoints built with different seeds share one
# tokenizer, so their token ids can be compared.
_CORPUS_SEED = 20240611


@dataclass(frozen=True)
class TinyModelSpec:
    layers: int = 4
    hidden: int = 256
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 64
    intermediate: int = 768
    vocab_size: int = 1024
    max_positions: int = 4096
    seed: int = 0
    pretrain_steps: int = 0
    pretrain_seq_len: int = 128
    pretrain_batch: int = 16
    pretrain_lr: float = 3e-3
    tie_embeddings: bool = False


# ----------------------------------------------------------------------------------------------------
# Corpus (deterministic, generated in code)
# ----------------------------------------------------------------------------------------------------

_NAMES = ["Tom", "Anna", "Ben", "Mia", "Leo", "Sara", "Omar", "Lina", "Ivan", "Yuki", "Ada", "Max"]
_ITEMS = ["apples", "books", "coins", "marbles", "pencils", "cookies", "cards", "stickers", "eggs", "cups"]
_SYSTEM_PROMPTS = [
    "You are a helpful assistant.",
    "You are a careful math tutor. Put the final answer in \\boxed{}.",
    "You are playing a text game. Reply with one action inside \\boxed{}.",
]
_GAME_WORDS = [
    "Sokoban",
    "Minesweeper",
    "Mastermind",
    "2048",
    "Sudoku",
    "Hanoi",
    "GuessTheNumber",
    "FrozenLake",
    "TicTacToe",
    "ConnectFour",
    "CliffWalking",
    "Taxi",
    "Wordle",
    "Hangman",
    "board",
    "grid",
    "row",
    "column",
    "cell",
    "wall",
    "box",
    "goal",
    "player",
    "target",
    "mine",
    "flag",
    "reveal",
    "guess",
    "higher",
    "lower",
    "correct",
    "move",
    "disk",
    "peg",
    "tower",
    "left",
    "right",
    "up",
    "down",
    "hole",
    "frozen",
    "start",
    "win",
    "lose",
    "draw",
    "turn",
    "score",
    "reward",
    "action",
    "valid",
    "invalid",
]
# Everyday English so that prose in prompts tokenizes into words, not bytes.
_COMMON_WORDS = """the of and to in is you that it he was for on are as with his they at be this have from
or one had by word but not what all were we when your can said there use an each which she do how their if
will way about many then them write would like so these her long make thing see him two has look more day
could go come did number sound no most people my over know water than call first who may down side been now
find any new work part take get place made live where after back little only round man year came show every
good me give our under name very through just form sentence great think say help low line differ cause much
mean before move right boy old too same tell does set three want air well also play small end put home read
hand port large spell add even land here must big high such follow act why ask men change went light kind off
need house picture try us again animal point mother world near build self earth father head stand own page
should country found answer school grow study still learn plant cover food sun four between state keep eye
never last let thought city tree cross farm hard start might story saw far sea draw left late run while press
close night real life few north open seem together next white children begin got walk example ease paper
group always music those both mark often letter until mile river car feet care second book carry took science
eat room friend began idea fish mountain stop once base hear horse cut sure watch color face wood main enough
plain girl usual young ready above ever red list though feel talk bird soon body dog family direct pose leave
song measure door product black short numeral class wind question happen complete ship area half rock order
fire south problem piece told knew pass since top whole king space heard best hour better true during hundred
five remember step early hold west ground interest reach fast verb sing listen six table travel less morning
ten simple several vowel toward war lay against pattern slow center love person money serve appear road map
rain rule govern pull cold notice voice unit power town fine certain fly fall lead cry dark machine note wait
plan figure star noun field rest correct able pound done beauty drive stood contain front teach week final
gave green oh quick develop ocean warm free minute strong special mind behind clear tail produce fact street
inch multiply nothing course stay wheel full force blue object decide surface deep moon island foot system
busy test record boat common gold possible plane stead dry wonder laugh thousand ago ran check game shape
equate hot miss brought heat snow tire bring yes distant fill east paint language among""".split()
_SENTENCES = [
    "{A} {v} the {n} before the {m}.",
    "Why does the {n} {v} near the {m}?",
    "Every {n} can {v} a {m}.",
    "We {v} {k} {n}s and {j} {m}s.",
    "Please {v} the {n}, then check the {m}.",
    "The {m} is {k} steps away.",
]
_GAME_LINES = [
    "Your move.",
    "Invalid action. Try again.",
    "You won!",
    "Game over.",
    "It is a draw.",
    "The game has started.",
    "Reply with your action inside \\boxed{{}}.",
    "Current board:",
    "Turn {t} of {n}.",
    "Reward: {r}.",
    "You have {n} guesses left.",
]


def _arith(rng: random.Random) -> str:
    a, b = rng.randint(0, 99), rng.randint(0, 99)
    op = rng.choice("+-*/")
    if op == "+":
        return f"{a} + {b} = {a + b}"
    if op == "-":
        a, b = max(a, b), min(a, b)
        return f"{a} - {b} = {a - b}"
    if op == "*":
        a, b = a % 13, b % 13
        return f"{a} * {b} = {a * b}"
    b = b % 12 + 1
    return f"{a * b} / {b} = {a}"


def _word_problem(rng: random.Random) -> tuple[str, str, int]:
    name, other = rng.sample(_NAMES, 2)
    item = rng.choice(_ITEMS)
    a, b = rng.randint(2, 40), rng.randint(1, 30)
    kind = rng.randrange(4)
    if kind == 0:
        q = f"{name} has {a} {item}. {other} gives {name} {b} more. How many {item} does {name} have now?"
        return q, f"{name} starts with {a} and gets {b}. {a} + {b} = {a + b}.", a + b
    if kind == 1:
        a, b = max(a, b) + 1, min(a, b)
        q = f"{name} had {a} {item} and gave {b} to {other}. How many {item} are left?"
        return q, f"{a} - {b} = {a - b}.", a - b
    if kind == 2:
        a, b = a % 9 + 2, b % 9 + 2
        q = f"There are {a} bags with {b} {item} in each bag. How many {item} are there in total?"
        return q, f"{a} * {b} = {a * b}.", a * b
    b = b % 8 + 2
    total = a * b
    q = f"{name} shares {total} {item} equally among {b} friends. How many {item} does each friend get?"
    return q, f"{total} / {b} = {a}.", a


def _game_turn(rng: random.Random) -> tuple[str, str]:
    game = rng.randrange(6)
    if game == 0:  # Sokoban
        rows = ["#######", "#  .  #", "# $@  #", "#     #", "#######"]
        board = "\n".join(rows)
        act = rng.choice(["up", "down", "left", "right"])
        return f"Sokoban. Push the box $ onto the goal.\nCurrent board:\n{board}\nYour move.", act
    if game == 1:  # Minesweeper
        r, c = rng.randint(0, 7), rng.randint(0, 7)
        grid = "\n".join(" ".join(rng.choice(".12F") for _ in range(6)) for _ in range(4))
        return f"Minesweeper. Reveal a cell without a mine.\n{grid}\nYour move.", f"reveal {r} {c}"
    if game == 2:  # GuessTheNumber
        lo, hi = 1, 100
        secret = rng.randint(lo, hi)
        guess = rng.randint(lo, hi)
        hint = "higher" if secret > guess else "lower" if secret < guess else "correct"
        return (
            f"GuessTheNumber between {lo} and {hi}. Your last guess {guess} was {hint}. "
            f"You have {rng.randint(1, 9)} guesses left.",
            str((guess + secret) // 2),
        )
    if game == 3:  # Tower of Hanoi
        d = rng.randint(1, 4)
        src, dst = rng.sample("ABC", 2)
        return (
            f"Hanoi with {d + 1} disks on pegs A, B, C. Move the tower to peg C.",
            f"move disk {d} from {src} to {dst}",
        )
    if game == 4:  # FrozenLake
        lake = ["SFFF", "FHFH", "FFFH", "HFFG"]
        return "FrozenLake. Reach G without falling into a hole H.\n" + "\n".join(lake), rng.choice(
            ["left", "down", "right", "up"]
        )
    cells = [rng.choice("XO.") for _ in range(9)]  # TicTacToe
    grid = "\n".join(" ".join(cells[i : i + 3]) for i in range(0, 9, 3))
    return f"TicTacToe. You play X.\n{grid}\nTurn {rng.randint(1, 9)} of 9.", str(rng.randint(0, 8))


def render_chat(messages: list[dict[str, str]]) -> str:
    # Same text as CHAT_TEMPLATE renders (checked by the unit tests).
    return "".join(f"{IM_START}{m['role']}\n{m['content']}{IM_END}\n" for m in messages)


def build_corpus(num_docs: int = 3000) -> list[str]:
    """Deterministic training text for the tokenizer and the warm start."""
    rng = random.Random(_CORPUS_SEED)
    docs: list[str] = [
        " ".join(str(i) for i in range(100)),
        "0 1 2 3 4 5 6 7 8 9",
        " ".join(_GAME_WORDS),
        " ".join(_NAMES + _ITEMS),
        " ".join(_COMMON_WORDS),
        " ".join(w.capitalize() for w in _COMMON_WORDS),
        "system user assistant tool",
    ]
    for i in range(num_docs):
        kind = i % 5
        if kind == 0:
            docs.append("\n".join(_arith(rng) for _ in range(8)))
        elif kind in (1, 2):
            q, work, ans = _word_problem(rng)
            if kind == 1:
                docs.append(f"Question: {q}\nAnswer: {work} The answer is {ans}.\n#### {ans}")
            else:
                msgs = [
                    {"role": "system", "content": _SYSTEM_PROMPTS[1]},
                    {"role": "user", "content": q},
                    {"role": "assistant", "content": f"Let's think step by step. {work} \\boxed{{{ans}}}"},
                ]
                docs.append(render_chat(msgs))
        elif kind == 3:
            obs, act = _game_turn(rng)
            msgs = [
                {"role": "system", "content": _SYSTEM_PROMPTS[2]},
                {"role": "user", "content": obs},
                {"role": "assistant", "content": f"\\boxed{{{act}}}"},
            ]
            line = rng.choice(_GAME_LINES).format(
                t=rng.randint(1, 9), n=rng.randint(1, 9), r=rng.randint(0, 1)
            )
            msgs.append({"role": "user", "content": line})
            docs.append(render_chat(msgs))
        else:
            words = rng.sample(_GAME_WORDS, 4)
            prose = " ".join(
                rng.choice(_SENTENCES).format(
                    A=rng.choice(_NAMES),
                    v=rng.choice(_COMMON_WORDS),
                    n=rng.choice(_COMMON_WORDS),
                    m=rng.choice(_COMMON_WORDS + _GAME_WORDS),
                    k=rng.randint(2, 99),
                    j=rng.randint(2, 9),
                )
                for _ in range(4)
            )
            docs.append(f"The {words[0]} is {words[1]}. {words[2]}, then {words[3]}. {prose}")
    return docs


# ----------------------------------------------------------------------------------------------------
# Tokenizer
# ----------------------------------------------------------------------------------------------------


def train_tokenizer(corpus: Sequence[str], vocab_size: int) -> Any:
    """Byte-level BPE with Qwen's pre-tokenizer, wrapped for transformers (returns the fast tokenizer)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_QWEN_SPLIT), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(list(corpus), trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=IM_END,
        pad_token=ENDOFTEXT,
        unk_token=None,
        bos_token=None,
        additional_special_tokens=[IM_START, IM_END],
        chat_template=CHAT_TEMPLATE,
        model_max_length=4096,
        clean_up_tokenization_spaces=False,
    )


# ----------------------------------------------------------------------------------------------------
# Model
# ----------------------------------------------------------------------------------------------------


def _qwen3_config(spec: TinyModelSpec, tokenizer: Any) -> Any:
    from transformers import Qwen3Config

    eos = tokenizer.convert_tokens_to_ids(IM_END)
    pad = tokenizer.convert_tokens_to_ids(ENDOFTEXT)
    return Qwen3Config(
        vocab_size=spec.vocab_size,
        hidden_size=spec.hidden,
        intermediate_size=spec.intermediate,
        num_hidden_layers=spec.layers,
        num_attention_heads=spec.heads,
        num_key_value_heads=spec.kv_heads,
        head_dim=spec.head_dim,
        max_position_embeddings=spec.max_positions,
        rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        # Untied by default: lm_head is then a tensor of its own in deltas. Tied is what small Qwen3
        # checkpoints use; the weight-update extension supports both.
        tie_word_embeddings=spec.tie_embeddings,
        bos_token_id=pad,
        eos_token_id=eos,
        pad_token_id=pad,
        dtype="bfloat16",
        architectures=["Qwen3ForCausalLM"],
    )


def _pretrain(model: Any, tokenizer: Any, corpus: Sequence[str], spec: TinyModelSpec) -> list[float]:
    """Short next-token warm start on the corpus; returns the loss curve (every step)."""
    import torch

    eos = tokenizer.convert_tokens_to_ids(ENDOFTEXT)
    ids: list[int] = []
    for ids_doc in tokenizer(list(corpus), add_special_tokens=False)["input_ids"]:
        ids.extend(ids_doc)
        ids.append(eos)
    data = torch.tensor(ids, dtype=torch.long)
    seq = spec.pretrain_seq_len
    n_blocks = (len(data) - 1) // seq
    gen = torch.Generator().manual_seed(spec.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=spec.pretrain_lr, betas=(0.9, 0.95), weight_decay=0.01)
    warmup = max(1, spec.pretrain_steps // 10)

    def lr_at(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return 0.1 + 0.9 * 0.5 * (
            1 + math.cos(math.pi * (step - warmup) / max(1, spec.pretrain_steps - warmup))
        )

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
    losses: list[float] = []
    model.train()
    offsets = torch.arange(seq + 1)
    for _ in range(spec.pretrain_steps):
        starts = torch.randint(0, n_blocks, (spec.pretrain_batch,), generator=gen) * seq
        batch = data[starts[:, None] + offsets[None, :]]
        logits = model(input_ids=batch[:, :-1], use_cache=False).logits.float()
        loss = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1)
        )
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(float(loss.detach()))
    model.eval()
    return losses


def _write_portable_tokenizer_config(out: Path, tokenizer: Any) -> None:
    # transformers 5 writes tokenizer_class "TokenizersBackend" and a list-valued extra_special_tokens,
    # which transformers 4.x (still used by some vLLM builds) cannot read. This form loads in both.
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": IM_END,
        "pad_token": ENDOFTEXT,
        "unk_token": None,
        "additional_special_tokens": [IM_START, IM_END],
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": tokenizer.model_max_length,
        "chat_template": CHAT_TEMPLATE,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def build_tiny_model(
    out_dir: str | os.PathLike[str],
    *,
    layers: int = 4,
    hidden: int = 256,
    heads: int | None = None,
    kv_heads: int | None = None,
    vocab_size: int = 1024,
    seed: int = 0,
    corpus: Sequence[str] | None = None,
    pretrain_steps: int = 0,
    intermediate: int | None = None,
    tie_embeddings: bool = False,
) -> dict[str, Any]:
    """Write a tiny Qwen3 checkpoint (config, generation config, bf16 safetensors, tokenizer) to out_dir.

    heads defaults to hidden // 64 (head_dim 64), kv_heads to half of that (GQA like Qwen3).
    pretrain_steps=0 (the default here, for tests) leaves the seeded random weights: vLLM serves them, the
    output is gibberish but deterministic. The CLI defaults to DEFAULT_PRETRAIN_STEPS, enough for the
    model to follow the chat format and answer in \\boxed{}.
    Returns a summary (paths, parameter count, sha256 of model.safetensors, timings).
    """
    import torch

    t0 = time.perf_counter()
    heads = heads or max(1, hidden // 64)
    if hidden % heads:
        raise ValueError(f"hidden ({hidden}) must be divisible by heads ({heads})")
    kv_heads = kv_heads or max(1, heads // 2)
    if heads % kv_heads:
        raise ValueError(f"heads ({heads}) must be divisible by kv_heads ({kv_heads})")
    if vocab_size < 300:
        raise ValueError("vocab_size must be at least 300 (256 bytes + special tokens + merges)")
    spec = TinyModelSpec(
        layers=layers,
        hidden=hidden,
        heads=heads,
        kv_heads=kv_heads,
        head_dim=hidden // heads,
        intermediate=intermediate or 3 * hidden,
        vocab_size=vocab_size,
        seed=seed,
        pretrain_steps=pretrain_steps,
        tie_embeddings=tie_embeddings,
    )
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    corpus = list(corpus) if corpus is not None else build_corpus()

    tokenizer = train_tokenizer(corpus, vocab_size)
    if len(tokenizer) > vocab_size:
        raise AssertionError(f"tokenizer has {len(tokenizer)} tokens, more than vocab_size {vocab_size}")
    t_tok = time.perf_counter()

    from transformers import GenerationConfig, Qwen3ForCausalLM

    config = _qwen3_config(spec, tokenizer)
    # Fixed thread count while initialising and training: float reductions then happen in the same
    # order on every machine with this torch build, which keeps the bf16 bytes reproducible.
    prev_threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        torch.manual_seed(seed)
        with torch.device("cpu"):
            model = Qwen3ForCausalLM(config).to(torch.float32)
        losses: list[float] = []
        if pretrain_steps > 0:
            losses = _pretrain(model, tokenizer, corpus, spec)
    finally:
        torch.set_num_threads(prev_threads)
    t_model = time.perf_counter()

    model = model.to(torch.bfloat16)
    model.config.dtype = "bfloat16"
    model.generation_config = GenerationConfig(
        bos_token_id=config.bos_token_id,
        eos_token_id=[config.eos_token_id, config.pad_token_id],
        pad_token_id=config.pad_token_id,
    )
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    _write_portable_tokenizer_config(out, tokenizer)
    weights = out / "model.safetensors"
    summary = {
        "out_dir": str(out),
        "spec": asdict(spec),
        "tokenizer_vocab": len(tokenizer),
        "parameters": sum(p.numel() for p in model.parameters()),
        "model_sha256": hashlib.sha256(weights.read_bytes()).hexdigest(),
        "final_loss": losses[-1] if losses else None,
        "first_loss": losses[0] if losses else None,
        "seconds": {
            "tokenizer": round(t_tok - t0, 3),
            "model": round(t_model - t_tok, 3),
            "total": round(time.perf_counter() - t0, 3),
        },
    }
    (out / "rollart_tiny.json").write_text(
        json.dumps({k: v for k, v in summary.items() if k != "seconds"}, indent=2, sort_keys=True) + "\n"
    )
    return summary


# ----------------------------------------------------------------------------------------------------
# CLI
# ----------------------------------------------------------------------------------------------------

# Short: a pretraining the warm start can build on, cheap enough for a first `make run` on a CPU.
DEFAULT_PRETRAIN_STEPS = 80


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``rollart-devtools tiny-model`` arguments."""
    parser.add_argument("--out", required=True, help="output directory (created if missing)")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--heads", type=int, default=None, help="attention heads (default hidden/64)")
    parser.add_argument("--kv-heads", type=int, default=None, help="KV heads (default heads/2)")
    parser.add_argument("--vocab", type=int, default=1024, help="vocabulary size (tokenizer and model)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--pretrain-steps",
        type=int,
        default=DEFAULT_PRETRAIN_STEPS,
        help="warm-start steps on the built-in corpus (~0.4 s each on CPU at the default size; 0: random)",
    )
    parser.add_argument("--tie-embeddings", action="store_true", help="share embed_tokens and lm_head")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    summary = build_tiny_model(
        args.out,
        layers=args.layers,
        hidden=args.hidden,
        heads=args.heads,
        kv_heads=args.kv_heads,
        vocab_size=args.vocab,
        seed=args.seed,
        pretrain_steps=args.pretrain_steps,
        tie_embeddings=args.tie_embeddings,
    )
    print(json.dumps(summary, indent=2, sort_keys=True))
    return 0
