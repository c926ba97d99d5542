"""Text Sokoban with procedural levels that are solvable by construction, plus an optimal solver.

Level generation follows gym-sokoban's idea (Schrader, 2018: carve a room with a random walk, put the
boxes on their targets, then play *backwards* with pulls) but enumerates the backward play exactly:
a breadth-first search over reverse moves (walk, or walk while pulling the box behind you) from
every solved configuration gives, for each reachable start state, the length of its optimal forward
solution. The start is drawn from the states whose optimal solution has ``min_solution_steps ..
max_solution_steps`` moves and no box on a target. A forward BFS (:func:`solve`) recovers an
optimal action sequence from any state, mid-episode included.

Symbols (verl-agent's text Sokoban): ``#`` wall, ``_`` floor, ``O`` target, ``X`` box, ``√`` box on
target, ``P`` player, ``S`` player on target.

Reward: ``reward_mode="sparse"`` (default) gives 1.0 when the last box reaches a target, else 0.0.
``"shaped"`` is gym-sokoban's: -0.1 every step (no-ops included), +1 for pushing a box onto a
target, -1 for pushing one off, +10 on solving.
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass

from tether.envs.base import (
    STATE_KEY,
    EnvReset,
    EnvStep,
    check_can_step,
    eval_seeds,
    normalize_action,
    parse_tagged_action,
    train_seeds,
)

Cell = tuple[int, int]
State = tuple[Cell, frozenset[Cell]]  # (player, boxes)

ACTIONS: dict[str, Cell] = {"up": (-1, 0), "down": (1, 0), "left": (0, -1), "right": (0, 1)}

LEGEND = ("Symbols: # wall, _ floor, O target, X box, √ box on target, P player, "
          "S player on target.")


@dataclass(frozen=True)
class Level:
    """A Sokoban level: static layout plus the dynamic state (player, boxes).

    Attributes:
        height, width: grid size, outer walls included.
        floor: every non-wall cell.
        targets: cells the boxes must end on.
        boxes: current box cells.
        player: current player cell.
    """

    height: int
    width: int
    floor: frozenset[Cell]
    targets: frozenset[Cell]
    boxes: frozenset[Cell]
    player: Cell

    @property
    def solved(self) -> bool:
        return self.boxes == self.targets

    def with_state(self, player: Cell, boxes: frozenset[Cell]) -> Level:
        return Level(self.height, self.width, self.floor, self.targets, boxes, player)


def _add(a: Cell, b: Cell) -> Cell:
    return (a[0] + b[0], a[1] + b[1])


def _sub(a: Cell, b: Cell) -> Cell:
    return (a[0] - b[0], a[1] - b[1])


def apply_move(level: Level, action: str) -> tuple[Level, bool]:
    """Apply one direction. Returns the new level and whether a box was pushed.

    Walking into a wall, or pushing a box into a wall or another box, leaves the level unchanged.
    """
    d = ACTIONS[action]
    nxt = _add(level.player, d)
    if nxt not in level.floor:
        return level, False
    if nxt not in level.boxes:
        return level.with_state(nxt, level.boxes), False
    beyond = _add(nxt, d)
    if beyond not in level.floor or beyond in level.boxes:
        return level, False
    return level.with_state(nxt, (level.boxes - {nxt}) | {beyond}), True


def render(level: Level) -> str:
    """The grid as text, one row per line (symbols in the module docstring)."""
    rows = []
    for r in range(level.height):
        row = []
        for c in range(level.width):
            row.append(_symbol(level, (r, c)))
        rows.append("".join(row))
    return "\n".join(rows)


def level_from_text(text: str) -> Level:
    r"""Parse a grid written with the render symbols (the inverse of :func:`render`).

    >>> render(level_from_text("#####\n#PXO#\n#####"))
    '#####\n#PXO#\n#####'
    """
    rows = text.strip("\n").split("\n")
    floor, targets, boxes, player = set(), set(), set(), None
    for r, row in enumerate(rows):
        for c, ch in enumerate(row):
            if ch == "#":
                continue
            if ch not in "_OX√PS":
                raise ValueError(f"unknown symbol {ch!r} at row {r}, column {c}")
            floor.add((r, c))
            if ch in "O√S":
                targets.add((r, c))
            if ch in "X√":
                boxes.add((r, c))
            if ch in "PS":
                player = (r, c)
    if player is None or len(boxes) != len(targets):
        raise ValueError("a level needs one player and as many boxes as targets")
    return Level(len(rows), max(len(row) for row in rows), frozenset(floor), frozenset(targets),
                 frozenset(boxes), player)


def _symbol(level: Level, cell: Cell) -> str:
    if cell not in level.floor:
        return "#"
    on_target = cell in level.targets
    if cell == level.player:
        return "S" if on_target else "P"
    if cell in level.boxes:
        return "√" if on_target else "X"
    return "O" if on_target else "_"


def dead_cells(floor: frozenset[Cell], targets: frozenset[Cell]) -> frozenset[Cell]:
    """Floor cells from which a box can never reach any target, even alone on the board.

    A box moves from ``b`` to ``b - d`` only if the player can stand at ``b + d``; pulling backwards
    from the targets therefore finds every cell a box can be pushed to a target from.
    """
    live = set(targets)
    queue = deque(targets)
    while queue:
        b = queue.popleft()
        for d in ACTIONS.values():
            prev, stand = _add(b, d), _add(b, (2 * d[0], 2 * d[1]))
            if prev in floor and stand in floor and prev not in live:
                live.add(prev)
                queue.append(prev)
    return frozenset(floor - live)


def solve(level: Level, node_limit: int = 200_000) -> list[str] | None:
    """An optimal (fewest moves) action sequence that solves ``level``, by breadth-first search.

    Args:
        level (Level): the level in its current state.
        node_limit (int): give up after this many expanded states.

    Returns:
        list[str] | None: the actions, ``[]`` if already solved, None if unsolvable or over the limit.
    """
    if level.solved:
        return []
    dead = dead_cells(level.floor, level.targets)
    start: State = (level.player, level.boxes)
    parent: dict[State, tuple[State, str] | None] = {start: None}
    queue = deque([start])
    while queue and len(parent) <= node_limit:
        state = queue.popleft()
        for action in ACTIONS:
            nxt, pushed = apply_move(level.with_state(*state), action)
            key: State = (nxt.player, nxt.boxes)
            if key in parent or (pushed and nxt.boxes & dead):
                continue
            parent[key] = (state, action)
            if nxt.boxes == level.targets:
                return _backtrack(parent, key)
            queue.append(key)
    return None


def _backtrack(parent: dict[State, tuple[State, str] | None], state: State) -> list[str]:
    actions = []
    link = parent[state]
    while link is not None:
        state, action = link
        actions.append(action)
        link = parent[state]
    return actions[::-1]


def reverse_distances(floor: frozenset[Cell], targets: frozenset[Cell],
                      node_limit: int = 100_000) -> dict[State, int]:
    """Optimal solution length of every state that can reach the solved configuration.

    Breadth-first search backwards from all solved states (boxes on targets, player on any free
    cell). A reverse move walks the player to a free neighbour, optionally pulling the box behind
    it; each is the exact inverse of one forward move or push, so BFS depth = forward optimum.
    """
    dist: dict[State, int] = {}
    queue: deque[State] = deque()
    for p in sorted(floor - targets):
        dist[(p, targets)] = 0
        queue.append((p, targets))
    while queue and len(dist) < node_limit:
        state = queue.popleft()
        for nxt in _reverse_moves(floor, state):
            if nxt not in dist:
                dist[nxt] = dist[state] + 1
                queue.append(nxt)
    return dist


def _reverse_moves(floor: frozenset[Cell], state: State) -> list[State]:
    player, boxes = state
    out = []
    for d in ACTIONS.values():
        nxt = _add(player, d)
        if nxt not in floor or nxt in boxes:
            continue
        out.append((nxt, boxes))
        behind = _sub(player, d)
        if behind in boxes:
            out.append((nxt, (boxes - {behind}) | {player}))
    return out


_MASKS = (  # gym-sokoban's carving patterns, as offsets from the walker
    ((0, -1), (0, 0), (0, 1)),
    ((-1, 0), (0, 0), (1, 0)),
    ((0, -1), (0, 0), (1, 0)),
    ((0, -1), (0, 0), (1, -1), (1, 0)),
    ((0, 0), (0, 1), (1, 0)),
)


def carve_room(rng: random.Random, height: int, width: int) -> frozenset[Cell]:
    """Floor cells carved by a random walk inside the outer wall (gym-sokoban's topology)."""
    directions = list(ACTIONS.values())
    pos = (rng.randrange(1, height - 1), rng.randrange(1, width - 1))
    d = rng.choice(directions)
    floor: set[Cell] = set()
    for _ in range(int(1.7 * (height + width))):
        if rng.random() < 0.35:
            d = rng.choice(directions)
        pos = (min(max(pos[0] + d[0], 1), height - 2), min(max(pos[1] + d[1], 1), width - 2))
        for off in rng.choice(_MASKS):
            cell = _add(pos, off)
            if 1 <= cell[0] <= height - 2 and 1 <= cell[1] <= width - 2:
                floor.add(cell)
    return frozenset(floor)


def generate_level(rng: random.Random, height: int = 6, width: int = 6, num_boxes: int = 1,
                   min_solution_steps: int = 2, max_solution_steps: int = 10, max_tries: int = 200,
                   node_limit: int = 100_000) -> tuple[Level, int]:
    """Draw a solvable level.

    Args:
        rng (random.Random): the only source of randomness.
        height, width (int): grid size including the outer wall.
        num_boxes (int): boxes (= targets).
        min_solution_steps, max_solution_steps (int): bounds on the optimal solution length.
        max_tries (int): rooms to try before giving up (rooms under half the interior are skipped).
        node_limit (int): cap on the reverse search per room (bounds time on large rooms).

    Returns:
        tuple[Level, int]: the level and the length of its optimal solution.

    Raises:
        RuntimeError: no room in ``max_tries`` had a start state within the bounds.
    """
    # Rooms of a few cells make trivial puzzles: ask for at least half the interior.
    min_floor = max(num_boxes + 2, (height - 2) * (width - 2) // 2)
    for _ in range(max_tries):
        floor = carve_room(rng, height, width)
        if len(floor) < min_floor:
            continue
        targets = frozenset(rng.sample(sorted(floor), num_boxes))
        dist = reverse_distances(floor, targets, node_limit)
        starts = sorted((d, p, tuple(sorted(b))) for (p, b), d in dist.items()
                        if min_solution_steps <= d <= max_solution_steps and not b & targets)
        if starts:
            d, player, boxes = rng.choice(starts)
            return Level(height, width, floor, targets, frozenset(boxes), player), d
    raise RuntimeError(f"no {height}x{width} level with {num_boxes} boxes and an optimal solution of "
                       f"{min_solution_steps}..{max_solution_steps} moves in {max_tries} tries")


class SokobanEnv:
    """Text Sokoban (module docstring: generation, symbols, rewards).

    Args:
        height, width (int): grid size including the outer wall (6x6 as in verl-agent).
        num_boxes (int): boxes per level.
        min_solution_steps, max_solution_steps (int): bounds on a level's optimal solution length;
            keep ``max_solution_steps`` below the loop's turn budget so every level is winnable.
        reward_mode (str): "sparse" or "shaped".
    """

    name = "sokoban"
    max_turns = 15
    action_format = ("Reply with exactly one action inside <action> </action> tags: up, down, left or "
                     "right, e.g. <action>left</action>.")
    train_seeds = staticmethod(train_seeds)
    eval_seeds = staticmethod(eval_seeds)

    @staticmethod
    def check_config(*, height: int = 6, width: int = 6, num_boxes: int = 1, min_solution_steps: int = 2,
                     max_solution_steps: int = 10, reward_mode: str = "sparse", **_: object) -> None:
        """The settings the constructor refuses, checked before any model loads (``tether.checks``)."""
        if min(height, width) < 4:
            raise ValueError(f"height and width must be >= 4, got {height}x{width}")
        if num_boxes < 1:
            raise ValueError(f"num_boxes must be >= 1, got {num_boxes}")
        if not 1 <= min_solution_steps <= max_solution_steps:
            raise ValueError("need 1 <= min_solution_steps <= max_solution_steps, got "
                             f"{min_solution_steps}, {max_solution_steps}")
        if reward_mode not in ("sparse", "shaped"):
            raise ValueError(f"reward_mode must be 'sparse' or 'shaped', got {reward_mode!r}")

    def __init__(self, *, height: int = 6, width: int = 6, num_boxes: int = 1, min_solution_steps: int = 2,
                 max_solution_steps: int = 10, reward_mode: str = "sparse") -> None:
        self.check_config(height=height, width=width, num_boxes=num_boxes, min_solution_steps=min_solution_steps,
                          max_solution_steps=max_solution_steps, reward_mode=reward_mode)
        self.height, self.width, self.num_boxes = height, width, num_boxes
        self.min_solution_steps, self.max_solution_steps = min_solution_steps, max_solution_steps
        self.reward_mode = reward_mode
        self.level: Level | None = None
        self._done = False

    @property
    def admissible(self) -> list[str]:
        return list(ACTIONS)

    def reset(self, seed: int) -> EnvReset:
        self.level, optimal = generate_level(random.Random(seed), self.height, self.width, self.num_boxes,
                                             self.min_solution_steps, self.max_solution_steps)
        self._done = False
        task = (f"Push every box onto a target. A box moves when you walk into it and the cell behind "
                f"it is free; boxes cannot be pulled. {LEGEND} Actions: up, down, left, right.")
        return EnvReset(observation=render(self.level), task=task, admissible_actions=self.admissible,
                        info={"optimal_steps": optimal})

    def step(self, action: str) -> EnvStep:
        check_can_step(self.name, self.level is not None, self._done)
        assert self.level is not None
        before = self.level
        key = normalize_action(action)
        invalid = key not in ACTIONS
        pushed = False
        if not invalid:
            self.level, pushed = apply_move(before, key)
        self._done = self.level.solved
        obs = render(self.level)
        info = {"won": self._done, "admissible_actions": self.admissible, "invalid_action": invalid,
                "moved": self.level.player != before.player, "pushed": pushed,
                "boxes_on_target": len(self.level.boxes & self.level.targets)}
        if invalid:
            info[STATE_KEY] = obs
            obs = f"Invalid action '{action}'; the valid actions are up, down, left, right.\n{obs}"
        return EnvStep(observation=obs, reward=self._reward(before, self.level), done=self._done, info=info)

    def _reward(self, before: Level, after: Level) -> float:
        if self.reward_mode == "sparse":
            return 1.0 if after.solved else 0.0
        delta = len(after.boxes & after.targets) - len(before.boxes & before.targets)
        return -0.1 + float(delta) + (10.0 if after.solved else 0.0)

    def parse_action(self, response_text: str) -> tuple[str, bool]:
        return parse_tagged_action(response_text, self.admissible)

    def solution(self) -> list[str] | None:
        if self.level is None or self._done:
            return None
        return solve(self.level)

    def close(self) -> None:
        self.level = None
