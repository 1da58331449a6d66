"""gymnasium's FrozenLake behind a text wrapper: the grid as text in, a direction as text out.

Actions: one of ``left``, ``down``, ``right``, ``up`` (or gymnasium's 0-3), written plainly, in brackets
(``[left]``) or in ``\\boxed{left}``; the last one in the text counts. Text without a direction is an invalid
action: the agent is told so, it costs a turn, the lake does not change (reward 0).
gymnasium keeps its RNG per environment (``np_random``), so this runs in-process safely.
"""

from __future__ import annotations

import re
from typing import Any

from .base import Env, EnvConfigError, StepResult
from .options import opt_bool, opt_str

ACTIONS = ("left", "down", "right", "up")
_WORD = re.compile(r"\b(left|down|right|up)\b|(?<![\w.])([0-3])(?![\w.])", re.IGNORECASE)
SYSTEM_PROMPT = "You are walking on a frozen lake. Answer with one move: left, down, right or up."
OPTIONS = {
    "map_name": "4x4 or 8x8 (default 4x4)",
    "is_slippery": "'true' for gymnasium's slippery ice (default false: moves are deterministic)",
    "desc": "custom map rows separated by commas, e.g. SFFF,FHFH,FFFH,HFFG",
}


def parse_action(text: str) -> int | None:
    boxed = re.findall(r"\\boxed\{([^}]*)\}", text)
    candidates = boxed if boxed else [text]
    for chunk in reversed(candidates):
        found = _WORD.findall(chunk)
        if found:
            word, digit = found[-1]
            return ACTIONS.index(word.lower()) if word else int(digit)
    return None


class FrozenLakeTextEnv(Env):
    system_prompt = SYSTEM_PROMPT
    default_max_turns = 30

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        import gymnasium as gym

        kwargs: dict[str, Any] = {"is_slippery": opt_bool(options, "is_slippery", False)}
        desc = options.get("desc")
        if desc:
            rows = [r.strip() for r in str(desc).split(",") if r.strip()]
            if not rows or any(len(r) != len(rows[0]) or set(r) - set("SFHG") for r in rows):
                raise EnvConfigError("desc must be equal-length rows of S, F, H, G separated by commas")
            if sum(r.count("S") for r in rows) != 1 or sum(r.count("G") for r in rows) < 1:
                raise EnvConfigError("desc needs exactly one S and at least one G")
            kwargs["desc"] = rows
        else:
            kwargs["map_name"] = opt_str(options, "map_name", "4x4")
            if kwargs["map_name"] not in ("4x4", "8x8"):
                raise EnvConfigError("map_name must be 4x4 or 8x8")
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

    def _reset(self, seed: int | None) -> str:
        state, _ = self.env.reset(seed=seed)
        self.state = int(state)
        self.metadata = {"game": "FrozenLake-v1", "seed": "" if seed is None else str(seed), "source": "gymnasium",
                         "map": ",".join("".join(r) for r in self.desc)}
        return (
            "Frozen lake: S start, F frozen (safe), H hole (you fall in and lose), G goal, P you.\n"
            f"{self.grid()}\n"
            "Reach G without stepping into a hole. Answer with one move: left, down, right or up."
        )

    def _step(self, action: str) -> StepResult:
        move = parse_action(action)
        if move is None:
            return StepResult(
                f"Invalid action: answer with left, down, right or up.\n{self.grid()}",
                0.0,
                False,
                {"invalid_action": True},
            )
        state, reward, terminated, truncated, _ = self.env.step(move)
        self.state = int(state)
        row, col = divmod(self.state, self.ncol)
        cell = self.desc[row][col]
        done = bool(terminated or truncated)
        if cell == "G":
            text = f"You moved {ACTIONS[move]} and reached the goal!"
        elif cell == "H":
            text = f"You moved {ACTIONS[move]} and fell into a hole."
        else:
            text = f"You moved {ACTIONS[move]}.\n{self.grid()}"
        info = {"invalid_action": False, "position": [row, col], "terminated": bool(terminated),
                "truncated": bool(truncated)}
        return StepResult(text, float(reward), done, info)
