"""Grid worlds shared by FrozenLake and thin ice: moves, walking, path search, rendering and reading a map back.

A map is a list of equal-length strings of tile letters (gymnasium's ``S`` start, ``F`` frozen, ``H`` hole, ``G``
goal; thin ice adds ``T``); a cell is ``(row, col)``, row 0 at the top. Moves are ``left``, ``down``, ``right``,
``up``; a move off the map leaves the player where they are. Each env keeps its own tiles' meaning and symbols
(:mod:`tether.envs.frozenlake`, :mod:`tether.envs.thin_ice`) and passes them in.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

Cell = tuple[int, int]

# The order BFS tries moves in, hence the tie-break between equally short paths.
MOVES: dict[str, Cell] = {"left": (0, -1), "down": (1, 0), "right": (0, 1), "up": (-1, 0)}
GOAL = "G"


def neighbours(desc: list[str], row: int, col: int) -> dict[str, Cell | None]:
    """The cell each move from ``(row, col)`` leads to, None where it would leave the map, in :data:`MOVES` order."""
    n_rows, n_cols = len(desc), len(desc[0])
    out: dict[str, Cell | None] = {}
    for name, (dr, dc) in MOVES.items():
        r, c = row + dr, col + dc
        out[name] = (r, c) if 0 <= r < n_rows and 0 <= c < n_cols else None
    return out


def walk(cell: Cell, actions: list[str], size: int) -> list[Cell]:
    """The cells visited from ``cell`` by ``actions`` on a ``size x size`` map (edges stop you), ``cell`` included."""
    cells = [cell]
    for action in actions:
        dr, dc = MOVES[action]
        r, c = cells[-1][0] + dr, cells[-1][1] + dc
        cells.append((r, c) if 0 <= r < size and 0 <= c < size else cells[-1])
    return cells


def shortest_path(desc: list[str], row: int, col: int, avoid: str) -> list[str] | None:
    """Fewest moves from ``(row, col)`` to the goal ``G`` stepping on no tile in ``avoid``, by BFS in
    :data:`MOVES` order; None if there is none."""
    parent: dict[Cell, tuple[Cell, str] | None] = {(row, col): None}
    queue = deque([(row, col)])
    while queue:
        cell = queue.popleft()
        if desc[cell[0]][cell[1]] == GOAL:
            return _backtrack(parent, cell)
        for name, nxt in neighbours(desc, *cell).items():
            if nxt is not None and nxt not in parent and desc[nxt[0]][nxt[1]] not in avoid:
                parent[nxt] = (cell, name)
                queue.append(nxt)
    return None


def _backtrack(parent: dict[Cell, tuple[Cell, str] | None], cell: Cell) -> list[str]:
    actions = []
    while (link := parent[cell]) is not None:
        cell, name = link
        actions.append(name)
    return actions[::-1]


def render(desc: list[str], row: int, col: int, symbol: Callable[[str, bool], str]) -> str:
    """The map as text, one line per row and one character per cell: ``symbol(tile, player_here)``."""
    return "\n".join("".join(symbol(tile, (r, c) == (row, col)) for c, tile in enumerate(line))
                     for r, line in enumerate(desc))


def read_map(text: str, tiles: dict[str, str], player: str) -> tuple[list[str], Cell] | None:
    """A rendered map read back: its tile rows (``tiles`` maps each symbol to a tile letter) and the player's cell,
    the one cell showing a symbol in ``player``; None unless the rows are equally long with exactly one player."""
    rows = text.split("\n")
    where = [(r, c) for r, line in enumerate(rows) for c, ch in enumerate(line) if ch in player]
    if len(where) != 1 or len({len(line) for line in rows}) != 1:
        return None
    return ["".join(tiles[ch] for ch in line) for line in rows], where[0]
