"""GEM games (``gem.make(id)``), multi-turn; actions go inside ``\\boxed{}``.

GEM seeds the process-global ``random`` and numpy RNGs in ``reset(seed)``: run one environment per process
(process or bwrap backend), never in-process next to others. Word games (Wordle, Hangman, WordSearch) need an
NLTK "words" corpus; it is built offline from the ``english-words`` package (see ``words.py``).
"""

from __future__ import annotations

import re
from typing import Any

from .base import Env, EnvUnavailable, StepResult
from .words import prepare_offline_words

SYSTEM_PROMPT = "You are playing a text game. Think, then give your move inside \\boxed{}."

# Games of gem-llm 0.1.0 that work offline here, and those that do not (with why).
GAMES = (
    "GuessTheNumber-v0-easy", "GuessTheNumber-v0-hard", "GuessTheNumber-v0-random",
    "Mastermind-v0-easy", "Mastermind-v0-hard", "Mastermind-v0-random",
    "Minesweeper-v0-easy", "Minesweeper-v0-hard", "Minesweeper-v0-random",
    "FifteenPuzzle-v0-easy", "FifteenPuzzle-v0-hard",
    "Sudoku-v0-easy", "Sudoku-v0-hard", "Sudoku-v0-random",
    "TowerofHanoi-v0-easy", "TowerofHanoi-v0-hard", "TowerofHanoi-v0-random",
    "Game2048-v0-easy", "Game2048-v0-hard", "Game2048-v0-extreme-hard", "Game2048-v0-random",
    "Sokoban-v0-easy", "Sokoban-v0-hard", "Sokoban-v0-random",
    "Wordle-v0-easy", "Wordle-v0-hard", "Wordle-v0-random",
    "Hangman-v0-easy", "Hangman-v0-hard", "Hangman-v0-random",
    "WordSearch-v0-easy", "WordSearch-v0-hard", "WordSearch-v0-random",
)
BROKEN = {
    "FifteenPuzzle-v0-random": "gem-llm 0.1.0 bug: reset() fails with a None board size",
    "Crosswords-v0-easy": "needs pandas and a hub dataset",
    "Crosswords-v0-hard": "needs pandas and a hub dataset",
    "Crosswords-v0-random": "needs pandas and a hub dataset",
}
WORD_GAMES = ("Wordle", "Hangman", "WordSearch")
_INVALID = re.compile(r"not valid|invalid|did not provide|outside the range|already (been )?guessed", re.I)
OPTIONS = {"max_turns": "override the game's own turn limit (GEM constructor argument)"}


class GemEnv(Env):
    system_prompt = SYSTEM_PROMPT
    default_max_turns = 50

    def __init__(self, game: str, **options: Any) -> None:
        super().__init__(**options)
        import gem

        if any(game.startswith(f"game:{w}") for w in WORD_GAMES):
            prepare_offline_words()
        kwargs: dict[str, Any] = {}
        if "max_turns" in options:
            kwargs["max_turns"] = int(options["max_turns"])
        try:
            self.env = gem.make(game, **kwargs)
        except (ImportError, LookupError, OSError) as exc:
            raise EnvUnavailable(f"GEM game {game!r} cannot run offline here: {exc}") from exc
        self.game = game
        self.suffix = ""

    def _reset(self, seed: int | None) -> str:
        obs, info = self.env.reset(seed=seed)
        self.suffix = str((info or {}).get("suffix", ""))
        self.metadata = {"game": self.game, "seed": "" if seed is None else str(seed), "source": "gem"}
        return _with_suffix(str(obs), self.suffix)

    def _step(self, action: str) -> StepResult:
        obs, reward, terminated, truncated, info = self.env.step(action)
        info = dict(info or {})
        self.suffix = str(info.pop("suffix", self.suffix))
        done = bool(terminated or truncated)
        out = {"terminated": bool(terminated), "truncated": bool(truncated), **info}
        out["invalid_action"] = bool(_INVALID.search(str(obs)[:300]))
        return StepResult(
            observation=str(obs) if done else _with_suffix(str(obs), self.suffix),
            reward=float(reward),
            done=done,
            info=out,
        )


def _with_suffix(obs: str, suffix: str) -> str:
    return f"{obs}\n{suffix}" if suffix else obs
