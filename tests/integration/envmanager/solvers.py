"""Scripted players: they read the observations (text) and answer like an agent would, without model calls."""

from __future__ import annotations

import re
from collections import deque


def hanoi_moves(n: int, src: str, dst: str, via: str) -> list[tuple[str, str]]:
    if n == 0:
        return []
    return hanoi_moves(n - 1, src, via, dst) + [(src, dst)] + hanoi_moves(n - 1, via, dst, src)


def parse_hanoi(obs: str) -> tuple[int, str, str]:
    n = int(re.search(r"with (\d+) disks", obs).group(1))
    src, dst = re.search(r"from tower ([ABC]) to tower ([ABC])", obs).groups()
    return n, src, dst


def grid_path(grid: list[list[str]], start: str = "P", goal: str = "G", blocked: str = "H") -> list[str]:
    """Shortest path of moves (up/down/left/right) on a grid, avoiding blocked cells."""
    rows, cols = len(grid), len(grid[0])
    s = next((r, c) for r in range(rows) for c in range(cols) if grid[r][c] == start)
    prev = {s: None}
    queue = deque([s])
    while queue:
        cur = queue.popleft()
        if grid[cur[0]][cur[1]] == goal:
            path = []
            while prev[cur] is not None:
                cur, move = prev[cur]
                path.append(move)
            return path[::-1]
        for move, (dr, dc) in (("down", (1, 0)), ("right", (0, 1)), ("up", (-1, 0)), ("left", (0, -1))):
            nxt = (cur[0] + dr, cur[1] + dc)
            if 0 <= nxt[0] < rows and 0 <= nxt[1] < cols and nxt not in prev and grid[nxt[0]][nxt[1]] not in blocked:
                prev[nxt] = (cur, move)
                queue.append(nxt)
    raise AssertionError("no path to the goal")


def textarena_lake_grid(obs: str) -> list[list[str]]:
    board = obs[obs.rindex("Current Board"):]
    rows = [line for line in board.splitlines() if line.startswith("|")]
    return [[cell.strip() or "F" for cell in row.strip("|").split("|")] for row in rows]


def gym_lake_grid(obs: str) -> list[list[str]]:
    return [line.split() for line in obs.splitlines() if re.fullmatch(r"[SFHGP]( [SFHGP])+", line.strip())]


LINES = [(0, 1, 2), (3, 4, 5), (6, 7, 8), (0, 3, 6), (1, 4, 7), (2, 5, 8), (0, 4, 8), (2, 4, 6)]


def tictactoe_board(obs: str) -> list[str]:
    board = obs[obs.rindex("Current Board"):]
    cells: list[str] = []
    for line in board.splitlines():
        if "|" in line and "+" not in line:
            cells += [c.strip() for c in line.split("|")]
    return cells[:9]


def tictactoe_move(obs: str, me: str = "O", them: str = "X") -> int:
    b = tictactoe_board(obs)
    free = [i for i in range(9) if b[i] not in ("X", "O")]
    for who in (me, them):  # win, else block
        for line in LINES:
            marks = [b[i] for i in line]
            if marks.count(who) == 2:
                gap = [i for i in line if i in free]
                if gap:
                    return gap[0]
    for pref in (4, 0, 2, 6, 8, 1, 3, 5, 7):
        if pref in free:
            return pref
    raise AssertionError("board full")
