"""Thin-ice maps and their solvers (:mod:`tether.envs.thin_ice` is the env that plays them).

Maps (a pure function of ``size``, ``hole_p``, ``trap_prob`` and the seed; :func:`generate_map`): ``size x
size``, start top-left, goal bottom-right, visible holes ``O`` with probability ``hole_p`` per tile, then thin ice:

* a *trap* map (probability ``trap_prob``) gets thin ice on the shortest paths until *every* shortest path that
  treats ``~`` as safe crosses one, so a policy that ignores the hazard falls on every shortest route;
* any other map gets 1-3 thin-ice tiles placed so that some shortest path still avoids them all.

Every map has at least one ``~`` and a path from start to goal that avoids holes and thin ice (BFS-checked), of
at most ``max_turns - 2`` moves.

*Monotone* maps (``routes="monotone"``, :func:`generate_monotone_map`) are for policies that cannot plan a route
on a grid: the solvers are greedy walkers that only move down or right (:func:`monotone_plan`), so every decision
is local (which of the two moves toward the goal is free), and a trap map puts one ``~`` on the naive walker's
route, where the safe walker turns aside (the env's views for such policies are in
:mod:`tether.envs.thin_ice`).

Tiles are gymnasium-like letters, never shown to the policy: ``S`` start, ``F`` ice, ``T`` thin ice, ``H`` hole,
``G`` goal. Moves, walking and BFS come from :mod:`tether.envs.grid`.
"""

from __future__ import annotations

import random

from tether.envs.grid import MOVES, Cell, shortest_path, walk

START, ICE, THIN, HOLE, GOAL = "S", "F", "T", "H", "G"


# -- paths ---------------------------------------------------------------------------------------


def safe_plan(desc: list[str], row: int, col: int) -> list[str] | None:
    """The scripted solver: the shortest path avoiding holes and thin ice."""
    return shortest_path(desc, row, col, HOLE + THIN)


def naive_plan(desc: list[str], row: int, col: int) -> list[str] | None:
    """The naive solver: the shortest path avoiding holes only, treating thin ice as safe ice (as the warm start
    does before it has any reason to distrust ``~``)."""
    return shortest_path(desc, row, col, HOLE)


def moves_ahead(goal: int, row: int, col: int) -> list[tuple[str, int, int]]:
    """The two moves toward the goal at ``(goal, goal)`` from ``(row, col)`` and the cell each leads to (possibly
    off the map), the monotone walkers' preferred one first: toward the axis with more distance left, down on a
    tie."""
    order = ("down", "right") if goal - row >= goal - col else ("right", "down")
    return [(m, row + MOVES[m][0], col + MOVES[m][1]) for m in order]


def monotone_plan(desc: list[str], row: int, col: int, avoid: str) -> list[str] | None:
    """The greedy walker of monotone maps: from ``(row, col)``, each move goes down or right, toward the axis with
    more distance left (down on a tie), or the other one when that tile is in ``avoid`` or off the map. None when
    both are blocked before the goal. It never backtracks, so every choice depends on the two tiles ahead only."""
    goal = len(desc) - 1
    plan: list[str] = []
    while (row, col) != (goal, goal):
        free = [(m, r, c) for m, r, c in moves_ahead(goal, row, col)
                if r <= goal and c <= goal and desc[r][c] not in avoid]
        if not free:
            return None
        move, row, col = free[0]
        plan.append(move)
    return plan


def crosses_thin_ice(desc: list[str], actions: list[str]) -> bool:
    """Whether walking ``actions`` from the start steps on thin ice."""
    return any(desc[r][c] == THIN for r, c in walk((0, 0), actions, len(desc)))


# -- maps ----------------------------------------------------------------------------------------


def generate_map(size: int, seed: int, *, hole_p: float = 0.15, trap_prob: float = 0.5,
                 max_steps: int = 18) -> list[str]:
    """A solvable map for ``seed`` (module docstring). Rows are strings of tile letters S F T H G.

    Raises:
        RuntimeError: no valid map in 1000 draws (settings far outside the tested range, e.g. hole_p 0.6).
    """
    rng = random.Random(seed)
    trap = rng.random() < trap_prob
    for _ in range(1000):
        grid = _holes(size, hole_p, rng)
        naive = naive_plan(["".join(r) for r in grid], 0, 0)
        if naive is None:
            continue
        placed = _cut_shortest_paths(grid, len(naive), rng) if trap else _sprinkle(grid, len(naive), rng)
        desc = ["".join(r) for r in grid]
        plan = safe_plan(desc, 0, 0)
        if placed and plan is not None and len(plan) <= max_steps:
            return desc
    raise RuntimeError(f"no thin-ice map for size={size}, hole_p={hole_p}, seed={seed} in 1000 draws")


def generate_monotone_map(size: int, seed: int, *, hole_p: float = 0.15, trap_prob: float = 0.5) -> list[str]:
    """A monotone map for ``seed`` (module docstring): the safe greedy walker (holes and ``~`` blocked) reaches the
    goal; on a trap map the naive one (holes blocked) steps on the ``~`` put on its route, on any other map 1-3
    ``~`` lie off its route and it reaches the goal.

    Raises:
        RuntimeError: no valid map in 1000 draws (settings far outside the tested range, e.g. hole_p 0.6).
    """
    rng = random.Random(seed)
    trap = rng.random() < trap_prob
    for _ in range(1000):
        grid = _holes(size, hole_p, rng)
        naive = monotone_plan(["".join(r) for r in grid], 0, 0, HOLE)
        if naive is None:
            continue
        route = _path_cells(grid, naive)
        off_route = [(r, c) for r, row in enumerate(grid) for c, tile in enumerate(row)
                     if tile == ICE and (r, c) not in route]
        for r, c in [rng.choice(route)] if trap else rng.sample(off_route, min(len(off_route), rng.randint(1, 3))):
            grid[r][c] = THIN
        desc = ["".join(r) for r in grid]
        if any(THIN in row for row in desc) and monotone_plan(desc, 0, 0, HOLE + THIN) is not None:
            return desc
    raise RuntimeError(f"no monotone thin-ice map for size={size}, hole_p={hole_p}, seed={seed} in 1000 draws")


def _holes(size: int, hole_p: float, rng: random.Random) -> list[list[str]]:
    grid = [[HOLE if rng.random() < hole_p else ICE for _ in range(size)] for _ in range(size)]
    grid[0][0], grid[-1][-1] = START, GOAL
    return grid


def _path_cells(grid: list[list[str]], plan: list[str]) -> list[Cell]:
    """The cells strictly between start and goal on ``plan``."""
    return walk((0, 0), plan, len(grid))[1:-1]


def _cut_shortest_paths(grid: list[list[str]], naive_len: int, rng: random.Random) -> bool:
    """Put thin ice on the current shortest safe path until every safe path is longer than ``naive_len`` (then
    every shortest path through ``~`` crosses thin ice). False if that disconnects start from goal."""
    while (plan := safe_plan(["".join(r) for r in grid], 0, 0)) is not None:
        if len(plan) > naive_len:
            return True
        r, c = rng.choice(_path_cells(grid, plan))
        grid[r][c] = THIN
    return False


def _sprinkle(grid: list[list[str]], naive_len: int, rng: random.Random) -> bool:
    """1-3 thin-ice tiles on ice that keep a shortest path free of thin ice; False if none could be placed."""
    ice = [(r, c) for r, row in enumerate(grid) for c, tile in enumerate(row) if tile == ICE]
    rng.shuffle(ice)
    placed, wanted = 0, rng.randint(1, 3)
    for r, c in ice:
        if placed == wanted:
            break
        grid[r][c] = THIN
        plan = safe_plan(["".join(row) for row in grid], 0, 0)
        if plan is None or len(plan) > naive_len:
            grid[r][c] = ICE
        else:
            placed += 1
    return placed > 0
