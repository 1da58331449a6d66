"""A task-specific warm start for the tiny model: ``rollart-devtools warmstart --task frozenlake --out DIR``.

GRPO learns nothing from groups whose rewards are all equal, so the tiny Qwen3 gets a tokenizer trained on, and a
supervised warm start (loss on the assistant's tokens) on, dialogs of the real environments framed exactly as the
envmanager frames them, played by a *noisy* expert (the right move or answer with probability ``p_expert``): the
result succeeds sometimes, far from always. ``--mix`` warm-starts one model on several tasks (FrozenLake,
``reasoning_gym:<dataset>``). The output is a checkpoint directory plus ``warmstart.json`` (the recipe); the same
recipe again is skipped (``--force`` rebuilds). torch is imported only when a model is built.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import random
import time
from collections import deque
from pathlib import Path
from typing import Any

import gymnasium as gym

from .tiny_model import build_tiny_model, render_chat

ACTIONS = ("left", "down", "right", "up")
_MOVES = {0: (0, -1), 1: (1, 0), 2: (0, 1), 3: (-1, 0)}


def _distances(desc: list[list[str]]) -> dict[tuple[int, int], int]:
    """Shortest number of moves to a goal from every safe cell (BFS from the goals, holes excluded)."""
    rows, cols = len(desc), len(desc[0])
    q = deque((r, c) for r in range(rows) for c in range(cols) if desc[r][c] == "G")
    dist = dict.fromkeys(q, 0)
    while q:
        r, c = q.popleft()
        for dr, dc in _MOVES.values():
            rr, cc = r + dr, c + dc
            if 0 <= rr < rows and 0 <= cc < cols and desc[rr][cc] != "H" and (rr, cc) not in dist:
                dist[(rr, cc)] = dist[(r, c)] + 1
                q.append((rr, cc))
    return dist


def expert_moves(desc: list[list[str]], row: int, col: int) -> list[int]:
    """The moves that bring the agent one step closer to a goal (empty when it cannot get there)."""
    dist = _distances(desc)
    here = dist.get((row, col))
    if here is None:
        return []
    out = []
    for a, (dr, dc) in _MOVES.items():
        rr = min(max(row + dr, 0), len(desc) - 1)
        cc = min(max(col + dc, 0), len(desc[0]) - 1)
        if dist.get((rr, cc), 1 << 30) < here:
            out.append(a)
    return out


# The envmanager's text wrapper of FrozenLake (``gymnasium:FrozenLake-v1``), word for word: the dialogs the
# policy is warm-started on must be the ones it later sees. tests/unit/devtools/test_warmstart.py plays both
# side by side and fails when they differ.
SYSTEM_PROMPT = "You are walking on a frozen lake. Answer with one move: left, down, right or up."
_TRUE = {"1", "true", "yes", "on"}


class FrozenLakeText:
    """gymnasium's FrozenLake with the grid as text in and a move (an index into ``ACTIONS``) out."""

    system_prompt = SYSTEM_PROMPT

    def __init__(self, **options: str) -> None:
        kwargs: dict[str, Any] = {"is_slippery": str(options.get("is_slippery", False)).strip().lower() in _TRUE}
        desc = options.get("desc")
        if desc:
            kwargs["desc"] = [r.strip() for r in str(desc).split(",") if r.strip()]
        else:
            kwargs["map_name"] = str(options.get("map_name", "4x4"))
        self.env = gym.make("FrozenLake-v1", **kwargs)
        # gymnasium types ``unwrapped`` as a plain Env; FrozenLake-v1's is a FrozenLakeEnv, which has ``desc``.
        self.desc = [[c.decode() for c in row] for row in self.env.unwrapped.desc]  # type: ignore[attr-defined]
        self.ncol = len(self.desc[0])
        self.state = 0

    def grid(self) -> str:
        row, col = divmod(self.state, self.ncol)
        lines = []
        for r, cells in enumerate(self.desc):
            lines.append(" ".join("P" if (r, c) == (row, col) else cell for c, cell in enumerate(cells)))
        return "\n".join(lines)

    def reset(self, seed: int) -> str:
        state, _ = self.env.reset(seed=seed)
        self.state = int(state)
        return (
            "Frozen lake: S start, F frozen (safe), H hole (you fall in and lose), G goal, P you.\n"
            f"{self.grid()}\n"
            "Reach G without stepping into a hole. Answer with one move: left, down, right or up."
        )

    def step(self, move: int) -> tuple[str, float, bool]:
        """(observation, reward, done) after ``move``."""
        state, reward, terminated, truncated, _ = self.env.step(move)
        self.state = int(state)
        row, col = divmod(self.state, self.ncol)
        cell = self.desc[row][col]
        if cell == "G":
            text = f"You moved {ACTIONS[move]} and reached the goal!"
        elif cell == "H":
            text = f"You moved {ACTIONS[move]} and fell into a hole."
        else:
            text = f"You moved {ACTIONS[move]}.\n{self.grid()}"
        return text, float(reward), bool(terminated or truncated)


def frozenlake_dialogs(
    episodes: int, *, p_expert: float, max_turns: int, options: dict[str, str], seed: int
) -> tuple[list[list[dict[str, str]]], float]:
    """Multi-turn dialogs (chat messages) of the noisy expert and its success rate."""
    rng = random.Random(seed)
    env = FrozenLakeText(**options)
    wins = 0
    docs = []
    for ep in range(episodes):
        obs = env.reset(seed=seed + ep)
        msgs = [{"role": "system", "content": env.system_prompt}, {"role": "user", "content": obs}]
        for _ in range(max_turns):
            row, col = divmod(env.state, env.ncol)
            best = expert_moves(env.desc, row, col)
            move = rng.choice(best) if best and rng.random() < p_expert else rng.randrange(4)
            msgs.append({"role": "assistant", "content": ACTIONS[move]})
            observation, reward, done = env.step(move)
            if done:
                wins += reward > 0
                break
            msgs.append({"role": "user", "content": observation})
        docs.append(msgs)
    return docs, wins / max(episodes, 1)


# The envmanager's reasoning-gym environments (``reasoning_gym:<dataset>``), word for word (checked by
# tests/unit/devtools/test_warmstart.py against rollart_envmanager.envs.reasoning_gym_env).
RG_PREFIX = "reasoning_gym:"
RG_SYSTEM_PROMPT = (
    "You are a careful problem solver. Think step by step, then give only the final answer inside "
    "<answer></answer> tags."
)
RG_INSTRUCTION = "Give your final answer inside <answer></answer> tags."


def rg_question(dataset: str, index: int, options: dict[str, str], _whole: Any = None) -> tuple[str, str]:
    """(first user message, right answer) of entry ``index``, as the envmanager's environment shows it (from a
    dataset of ``index + 1`` entries; ``_whole``, a larger dataset of the same generator, when its entries are
    the same)."""
    import reasoning_gym

    config = json.loads(options.get("config", "{}"))
    seed = int(options.get("seed", 0))
    ds = _whole if _whole is not None else reasoning_gym.create_dataset(dataset, seed=seed, size=index + 1, **config)
    entry = ds[index]
    return f"{entry['question']}\n\n{RG_INSTRUCTION}", str(entry["answer"])


def _rg_whole(dataset: str, size: int, options: dict[str, str]) -> Any:
    """One dataset of ``size`` entries when its entries match the envmanager's per-index construction (checked
    on a few indices), else None (then every entry is built as the envmanager builds it: slower)."""
    import reasoning_gym

    config = json.loads(options.get("config", "{}"))
    whole = reasoning_gym.create_dataset(dataset, seed=int(options.get("seed", 0)), size=size, **config)
    probes = sorted({0, size // 2, size - 1})
    same = all(rg_question(dataset, i, options) == rg_question(dataset, i, options, whole) for i in probes)
    return whole if same else None


def _wrong_answer(right: str, rng: random.Random) -> str:
    """A plausible wrong answer: another integer near an integer answer, else the answer's letters shuffled."""
    try:
        value = int(right)
    except ValueError:
        letters = list(right)
        rng.shuffle(letters)
        wrong = "".join(letters)
        return wrong if wrong != right else right[::-1] + "x"
    return str(value + rng.choice([d for d in range(-9, 10) if d]))


def rg_dialogs(
    dataset: str, episodes: int, *, p_expert: float, options: dict[str, str], seed: int, size: int = 10_000
) -> tuple[list[list[dict[str, str]]], float]:
    """Single-turn dialogs of a noisy expert on a reasoning-gym generator, and its success rate. Entries are
    drawn as the job's prompts draw them (``index = seed mod size``)."""
    rng = random.Random(seed)
    docs, right_n = [], 0
    indices = [(seed + ep) % size for ep in range(episodes)]
    whole = _rg_whole(dataset, max(indices) + 1, options)
    for index in indices:
        question, answer = rg_question(dataset, index, options, whole)
        right = rng.random() < p_expert
        right_n += right
        said = answer if right else _wrong_answer(answer, rng)
        docs.append(
            [
                {"role": "system", "content": RG_SYSTEM_PROMPT},
                {"role": "user", "content": question},
                {"role": "assistant", "content": f"<answer>{said}</answer>"},
            ]
        )
    return docs, right_n / max(episodes, 1)


def task_dialogs(entry: dict[str, Any], seed: int) -> tuple[list[list[dict[str, str]]], float]:
    """The dialogs of one task of a warm-start recipe (``task``, ``episodes``, ``p_expert``, ``max_turns``,
    ``options``)."""
    task = str(entry.get("task", "frozenlake"))
    episodes = int(entry.get("episodes", 3000))
    p = float(entry.get("p_expert", 0.35))
    options = {str(k): str(v) for k, v in (entry.get("options") or {}).items()}
    if task == "frozenlake":
        return frozenlake_dialogs(
            episodes, p_expert=p, max_turns=int(entry.get("max_turns", 8)), options=options, seed=seed
        )
    if task.startswith(RG_PREFIX):
        size = int(options.get("size", 10_000))  # the environment's option: entry = seed mod size
        return rg_dialogs(task[len(RG_PREFIX) :], episodes, p_expert=p, options=options, seed=seed, size=size)
    raise ValueError(f"unknown warm-start task {task!r} (frozenlake, reasoning_gym:<dataset>)")


def _encode(tokenizer: Any, msgs: list[dict[str, str]]) -> tuple[list[int], list[bool]]:
    """Token ids of a dialog as the chat template renders it, and which tokens the assistant wrote (its
    content and the end-of-turn token that stops it): the envmanager's token history of an episode."""
    ids: list[int] = []
    mask: list[bool] = []
    for m in msgs:
        head = tokenizer(f"<|im_start|>{m['role']}\n", add_special_tokens=False)["input_ids"]
        body = tokenizer(m["content"] + "<|im_end|>", add_special_tokens=False)["input_ids"]
        tail = tokenizer("\n", add_special_tokens=False)["input_ids"]
        ids += head + body + tail
        mask += [False] * len(head) + [m["role"] == "assistant"] * len(body) + [False] * len(tail)
    assert tokenizer.decode(ids) == render_chat(msgs)
    return ids, mask


def imitate(
    model_dir: Path,
    dialogs: list[list[dict[str, str]]],
    *,
    steps: int,
    batch: int = 16,
    lr: float = 3e-3,
    seed: int = 0,
) -> list[float]:
    """Supervised warm start on the assistant's tokens only (the observations are the environment's, not
    the policy's), one torch thread; rewrites the checkpoint's weights (bf16). Returns the loss curve."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    encoded = [_encode(tok, d) for d in dialogs]
    prev = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matrices: one thread beats several spin-waiting ones on a busy host
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    losses: list[float] = []
    model.train()
    try:
        for step in range(steps):
            for g in opt.param_groups:  # linear warm-up, then cosine to 10%
                warm = max(1, steps // 10)
                frac = (
                    (step + 1) / warm
                    if step < warm
                    else 0.1 + 0.45 * (1 + math.cos(math.pi * (step - warm) / max(1, steps - warm)))
                )
                g["lr"] = lr * frac
            pick = torch.randint(0, len(encoded), (batch,), generator=gen).tolist()
            width = max(len(encoded[i][0]) for i in pick)
            ids = torch.full((batch, width), pad, dtype=torch.long)
            labels = torch.full((batch, width), -100, dtype=torch.long)
            for row, i in enumerate(pick):
                x, mk = encoded[i]
                ids[row, : len(x)] = torch.tensor(x)
                labels[row, : len(x)] = torch.where(torch.tensor(mk), torch.tensor(x), torch.tensor(-100))
            logits = model(input_ids=ids, use_cache=False).logits[:, :-1].float()
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            losses.append(float(loss.detach()))
    finally:
        torch.set_num_threads(prev)
    model.eval()
    model.to(torch.bfloat16).save_pretrained(model_dir, safe_serialization=True)
    return losses


def build(
    out: Path,
    *,
    task: str = "frozenlake",
    episodes: int = 3000,
    p_expert: float = 0.35,
    max_turns: int = 8,
    options: dict[str, str] | None = None,
    layers: int = 2,
    hidden: int = 128,
    vocab: int = 512,
    pretrain_steps: int = 200,
    seed: int = 0,
    force: bool = False,
    mix: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Build the warm-started model into ``out`` (skipped when the same recipe is there already). ``mix``: one
    recipe per task (multi-task jobs; ``task``, ``episodes`` and ``p_expert`` of the arguments are then unused)."""
    if not mix and task != "frozenlake":
        raise ValueError(f"unknown warm-start task {task!r} (frozenlake; reasoning-gym tasks go in a mix)")
    recipe: dict[str, Any] = {
        "task": task,
        "episodes": episodes,
        "p_expert": p_expert,
        "max_turns": max_turns,
        "options": dict(sorted((options or {}).items())),
        "layers": layers,
        "hidden": hidden,
        "vocab": vocab,
        "pretrain_steps": pretrain_steps,
        "seed": seed,
        "format": 2,
    }
    if mix:
        recipe = {k: v for k, v in recipe.items() if k not in ("task", "episodes", "p_expert", "max_turns", "options")}
        recipe["mix"] = [dict(sorted(e.items())) for e in mix]
    digest = hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()
    marker = out / "warmstart.json"
    if not force and marker.is_file() and (out / "config.json").is_file():
        with_recipe = json.loads(marker.read_text())
        if with_recipe.get("recipe_sha256") == digest:
            return with_recipe | {"cached": True}
    t0 = time.perf_counter()
    per_task: dict[str, float] = {}
    if mix:
        dialogs = []
        for entry in mix:
            docs, rate = task_dialogs(entry, seed)
            dialogs += docs
            per_task[str(entry.get("task"))] = round(rate, 4)
        random.Random(seed).shuffle(dialogs)
        success = sum(per_task.values()) / len(per_task)
    else:
        dialogs, success = frozenlake_dialogs(
            episodes, p_expert=p_expert, max_turns=max_turns, options=options or {}, seed=seed
        )
    # The tokenizer is trained on the task's own text (short sequences); the weights start from the seed.
    summary = build_tiny_model(
        out,
        layers=layers,
        hidden=hidden,
        vocab_size=vocab,
        seed=seed,
        corpus=[render_chat(d) for d in dialogs],
        pretrain_steps=0,
        intermediate=3 * hidden,
    )
    t1 = time.perf_counter()
    losses = imitate(out, dialogs, steps=pretrain_steps, seed=seed) if pretrain_steps else []
    doc = {
        "recipe": recipe,
        "recipe_sha256": digest,
        "expert_success_rate": round(success, 4),
        **({"expert_success_by_task": per_task} if per_task else {}),
        "first_loss": losses[0] if losses else None,
        "final_loss": sum(losses[-20:]) / len(losses[-20:]) if losses else None,
        "parameters": summary.get("parameters"),
        "seconds": round(time.perf_counter() - t0, 1),
        "imitation_seconds": round(time.perf_counter() - t1, 1),
    }
    marker.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    return doc


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The ``rollart-devtools warmstart`` arguments."""
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--task", default="frozenlake")
    p.add_argument("--episodes", type=int, default=3000)
    p.add_argument("--p-expert", type=float, default=0.35)
    p.add_argument("--max-turns", type=int, default=8)
    p.add_argument("--option", action="append", default=[], help="environment option KEY=VALUE")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--vocab", type=int, default=512)
    p.add_argument("--pretrain-steps", type=int, default=200)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--force", action="store_true")
    p.add_argument(
        "--mix",
        help="JSON list of per-task recipes (task, episodes, p_expert, max_turns, options): one model for several "
        "tasks, e.g. '[{\"task\": \"frozenlake\"}, {\"task\": \"reasoning_gym:basic_arithmetic\"}]'",
    )
    p.set_defaults(func=run)


def run(a: argparse.Namespace) -> int:
    options = dict(kv.split("=", 1) for kv in a.option)
    doc = build(
        a.out,
        task=a.task,
        episodes=a.episodes,
        p_expert=a.p_expert,
        max_turns=a.max_turns,
        options=options,
        layers=a.layers,
        hidden=a.hidden,
        vocab=a.vocab,
        pretrain_steps=a.pretrain_steps,
        seed=a.seed,
        force=a.force,
        mix=json.loads(a.mix) if a.mix else None,
    )
    print(json.dumps(doc, indent=2, sort_keys=True))
    return 0
