"""textarena games, single-player or against a scripted opponent; rewards come from textarena's ``close()``.

The agent is player 0. Observations are the game's messages since the agent's last move (the raw env, no
textarena wrappers: the loop keeps the history). In two-player games the opponent is a script that plays a
move from the "available moves" the game lists (``first``, ``last`` or ``random`` with the episode's seed).
When the game ends, textarena's ``close()`` gives the rewards (1 win, 0 draw, -1 loss; single-player games
give their own scale); the final step's reward is the agent's.

textarena seeds the process-global ``random``: run one environment per process (process or bwrap backend).
Some textarena games use Python 3.12 syntax and cannot be imported on Python 3.11, others need the network or
an NLTK corpus; two-player games whose observations do not list the legal moves (ConnectFour, Nim) have no
generic scripted opponent. None of those are listed.
"""

from __future__ import annotations

import random
import re
from typing import Any

from .base import Env, EnvConfigError, EnvUnavailable, StepResult
from .options import opt_choice

SYSTEM_PROMPT = "You are playing a text game. Think, then give your move in square brackets, e.g. [4]."

# game id -> number of players (the agent plus scripted opponents)
GAMES: dict[str, int] = {
    "FrozenLake-v0": 1,
    "FrozenLake-v0-random": 1,
    "FrozenLake-v0-hardcore": 1,
    "TowerOfHanoi-v0": 1,
    "Minesweeper-v0": 1,
    "Minesweeper-v0-small": 1,
    "GuessTheNumber-v0": 1,
    "GuessTheNumber-v0-hardcore": 1,
    "Mastermind-v0": 1,
    "Sudoku-v0": 1,
    "LightsOut-v0": 1,
    "TicTacToe-v0": 2,
}
OPTIONS = {
    "opponent": "scripted opponent of two-player games: first | last | random (default first)",
}
_MOVE = re.compile(r"'?(\[[^\[\]\n]{1,20}\])'?")
_AVAILABLE = re.compile(r"(?:Available|Valid|Legal)[ \w]*?(?:Moves|moves|Actions|actions|columns)\s*:\s*(.+)")


def available_moves(text: str) -> list[str]:
    """Moves listed by the game in its latest "Available Moves: '[0]', '[1]'" style line."""
    lines = _AVAILABLE.findall(text)
    if not lines:
        return []
    return _MOVE.findall(lines[-1])


def render(messages: list[tuple[int, str, Any]], agent: int) -> str:
    parts = []
    for sender, message, _kind in messages:
        if sender == agent:
            continue  # the agent's own move, echoed back
        prefix = "[GAME]" if sender == -1 else f"[Player {sender}]"
        parts.append(f"{prefix} {message}")
    return "\n".join(parts)


class TextArenaEnv(Env):
    system_prompt = SYSTEM_PROMPT
    default_max_turns = 50
    agent = 0

    def __init__(self, game: str, **options: Any) -> None:
        super().__init__(**options)
        if game not in GAMES:
            raise EnvConfigError(f"textarena game {game!r} is not supported (one of {', '.join(sorted(GAMES))})")
        import textarena as ta

        try:
            self.env = ta.make(f"{game}-raw")
        except (ImportError, SyntaxError, LookupError) as exc:
            raise EnvUnavailable(f"textarena game {game!r} cannot run here: {exc}") from exc
        self.game = game
        self.players = GAMES[game]
        self.opponent = opt_choice(options, "opponent", "first", ("first", "last", "random"))
        self.rng = random.Random(0)
        self.last_opponent_view = ""

    def _reset(self, seed: int | None) -> str:
        self.rng = random.Random(seed)
        self.env.reset(num_players=self.players, seed=seed)
        self.metadata = {"game": self.game, "seed": "" if seed is None else str(seed), "source": "textarena",
                         "opponent": self.opponent if self.players > 1 else ""}
        done, _ = self._play_opponents()
        if done:  # cannot happen in the listed games; guard anyway
            raise EnvUnavailable(f"{self.game} ended before the agent's first move")
        pid, messages = self.env.get_observation()
        return render(messages, self.agent)

    def _play_opponents(self) -> tuple[bool, dict[str, Any]]:
        """Scripted opponents move until it is the agent's turn or the game ends."""
        done, info = False, {}
        guard = 0
        while self.env.state.current_player_id != self.agent and not done:
            guard += 1
            if guard > 1000:
                raise RuntimeError("scripted opponent made no progress")
            pid, messages = self.env.get_observation()
            view = render(messages, pid)
            self.last_opponent_view = view
            moves = available_moves(view)
            if not moves:
                raise RuntimeError(f"{self.game}: the scripted opponent found no listed moves")
            move = {"first": moves[0], "last": moves[-1]}.get(self.opponent) or self.rng.choice(moves)
            done, info = self.env.step(move)
        return done, dict(info or {})

    def _step(self, action: str) -> StepResult:
        done, info = self.env.step(action)
        info = dict(info or {})
        if not done:
            done, more = self._play_opponents()
            info.update(more)
        pid, messages = self.env.get_observation()
        observation = render(messages, self.agent)
        invalid = "invalid move" in observation.lower() or "resubmit" in observation.lower()
        if not done:
            return StepResult(observation, 0.0, False, {**info, "invalid_action": invalid})
        rewards, game_info = self.env.close()
        mine = (game_info or {}).get(self.agent, {})
        reward = float((rewards or {}).get(self.agent, 0.0))
        return StepResult(
            observation,
            reward,
            True,
            {**info, "invalid_action": invalid or bool(mine.get("invalid_move")), "rewards": rewards,
             "reason": mine.get("reason", ""), "outcome": _outcome(reward, self.players)},
        )


def _outcome(reward: float, players: int) -> str:
    if players == 1:
        return "success" if reward > 0 else "failure"
    return "win" if reward > 0 else ("loss" if reward < 0 else "draw")
