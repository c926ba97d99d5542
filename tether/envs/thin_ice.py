"""Thin ice: a FrozenLake-like grid where some tiles look harmless until you step on one.

Why it exists: SEED's claim is that hindsight from a finished trajectory carries information the acting policy
lacked. On FrozenLake every observation shows the whole map, so a failure reveals nothing new. Here a second kind
of hazard, *thin ice*, is drawn as ``~``, which the legend calls "snowy ice" and never says is dangerous: only
stepping on one reveals (in the final observation and in ``info``) that it breaks. Every ``~`` on every map is
thin ice, so the lesson a failure teaches ("never step on ~") transfers to held-out maps.

Design choice: a *distinct but innocuous-looking* symbol, not the safe-ice symbol itself. With ``_`` for both, the
hazard would be truly invisible but its cells random per map, so no lesson could transfer; with ``~`` the symbol
is visible, its meaning is not, and hindsight supplies the meaning.

Maps are pure functions of ``size``, ``hole_p``, ``trap_prob`` and the seed (:mod:`tether.envs.thin_ice_maps`:
trap maps, whose every shortest route through ``~`` crosses thin ice, other maps with 1-3 ``~`` off some shortest
route, and *monotone* maps for greedy down/right walkers). ``local_view=True`` adds a line under the map naming the
tile on each side of the player and the goal's distance, the local facts a monotone walker's decision needs.
``view="ahead"`` (monotone only) replaces the map with one line naming the two moves toward the goal in the
walkers' order of preference and the tile each leads to (:func:`ahead_view`), so a decision is one lookup: a
character-level policy of ~1M parameters did not learn to compare the goal's two distances from the map and the
local line (docs/methods/seed.md).

Symbols (ASCII only, one character per cell, so a character-level tokenizer sees one token per cell):
``P`` you, ``_`` ice, ``~`` snowy ice (thin ice), ``O`` hole, ``G`` goal, ``X`` you fallen in (a hole or through
thin ice), ``*`` you on the goal.

Actions, parsing and reward follow :mod:`tether.envs.frozenlake`: ``left``, ``down``, ``right``, ``up``; walking
off the edge leaves you in place; 1.0 on reaching ``G``, else 0.0; a hole or thin ice ends the episode lost.

Seed splits (never overlapping): train ``0 .. 499_999``, selection ``500_000 .. 999_999`` (choose checkpoints,
peaks and settings here), report ``1_000_000 ..`` (:data:`tether.envs.base.EVAL_SEED_OFFSET`; report numbers
here only). ``eval_seeds`` returns the split named by ``eval_split`` (default ``selection``, so the validation of
a training run never touches the report maps unless asked to).
"""

from __future__ import annotations

import re
from typing import Literal

from tether.envs.base import (
    EVAL_SEED_OFFSET,
    STATE_KEY,
    EnvReset,
    EnvStep,
    check_can_step,
    normalize_action,
    parse_tagged_action,
)
from tether.envs.grid import MOVES, Cell, neighbours, walk
from tether.envs.grid import render as render_grid
from tether.envs.thin_ice_maps import (
    GOAL,
    HOLE,
    ICE,
    START,
    THIN,
    crosses_thin_ice,
    generate_map,
    generate_monotone_map,
    monotone_plan,
    moves_ahead,
    naive_plan,
    safe_plan,
)

# The rendered symbols of the tiles (tether.envs.thin_ice_maps).
SYMBOLS = {START: "_", ICE: "_", THIN: "~", HOLE: "O", GOAL: "G"}
PLAYER, FALLEN, ON_GOAL = "P", "X", "*"
THIN_SYMBOL = SYMBOLS[THIN]
GRID_SYMBOLS = frozenset("P_~OGX*")

LEGEND = "Symbols: P you, _ ice, ~ snowy ice, O hole, G goal, X you fallen in, * you on the goal."

SELECTION_SEED_OFFSET = 500_000
Routes = Literal["shortest", "monotone"]
View = Literal["map", "ahead"]
Split = Literal["train", "selection", "report"]
_SPLIT_START = {"train": 0, "selection": SELECTION_SEED_OFFSET, "report": EVAL_SEED_OFFSET}
_SPLIT_SIZE = {"train": SELECTION_SEED_OFFSET, "selection": EVAL_SEED_OFFSET - SELECTION_SEED_OFFSET,
               "report": EVAL_SEED_OFFSET}


def split_seeds(split: Split, n: int) -> list[int]:
    """The first ``n`` seeds of ``split`` (module docstring); more than the split holds raises ValueError."""
    if not 0 <= n <= _SPLIT_SIZE[split]:
        raise ValueError(f"the {split} split holds {_SPLIT_SIZE[split]} seeds, asked for {n}")
    return list(range(_SPLIT_START[split], _SPLIT_START[split] + n))


def split_of(seed: int) -> Split:
    """Which split ``seed`` belongs to."""
    if seed < 0:
        raise ValueError(f"seeds are non-negative, got {seed}")
    if seed >= EVAL_SEED_OFFSET:
        return "report"
    return "selection" if seed >= SELECTION_SEED_OFFSET else "train"


def render(desc: list[str], row: int, col: int) -> str:
    """The map as text with the player at ``(row, col)``: one line per row, one character per cell."""
    return render_grid(desc, row, col, _symbol)


def _symbol(tile: str, player: bool) -> str:
    if not player:
        return SYMBOLS[tile]
    if tile in (HOLE, THIN):
        return FALLEN
    return ON_GOAL if tile == GOAL else PLAYER


def local_view(desc: list[str], row: int, col: int) -> str:
    """The tile on each side of the player (``edge`` off the map) and the goal's distance, e.g. ``Around you: left
    edge, down _, right ~, up edge. Goal: 5 down, 5 right.``"""
    sides = [f"{name} {'edge' if cell is None else SYMBOLS[desc[cell[0]][cell[1]]]}"
             for name, cell in neighbours(desc, row, col).items()]
    return f"Around you: {', '.join(sides)}. Goal: {len(desc) - 1 - row} down, {len(desc) - 1 - col} right."


def ahead_view(desc: list[str], row: int, col: int) -> str:
    """The two moves toward the goal, the one the monotone walkers prefer first (:func:`moves_ahead`), and the
    tile each leads to (``edge`` off the map), e.g. ``Ahead: down ~, then right _.``"""
    goal = len(desc) - 1
    first, second = (f"{m} {SYMBOLS[desc[r][c]] if r <= goal and c <= goal else 'edge'}"
                     for m, r, c in moves_ahead(goal, row, col))
    return f"Ahead: {first}, then {second}."


def parse_ahead(observation: str) -> list[tuple[str, str]] | None:
    """The (move, tile) pairs of the :func:`ahead_view` line in ``observation``, preferred move first; None
    without one."""
    match = re.search(r"Ahead: (\w+) (\S+), then (\w+) (\S+)\.", observation)
    return None if match is None else [(match[1], match[2]), (match[3], match[4])]


def walker_move(ahead: list[tuple[str, str]], avoid: str) -> str | None:
    """The move a monotone walker blocked by the symbols in ``avoid`` takes from an ahead line's pairs (the
    first whose tile is on the map and not avoided), as :func:`monotone_plan` would; None when both are blocked."""
    return next((move for move, tile in ahead if tile != "edge" and tile not in avoid), None)


# What a move does, as the env reports it in its infos (the class docstring): the kind of tile it lands on, or
# ``edge`` when it would leave the map (you stay where you are).
OUTCOMES = {START: "ice", ICE: "ice", THIN: "thin_ice", HOLE: "hole", GOAL: "goal"}


def move_outcomes(desc: list[str], row: int, col: int) -> dict[str, str]:
    """What each move from ``(row, col)`` does (:data:`OUTCOMES`, or ``edge``), in :data:`MOVES` order."""
    return {name: "edge" if cell is None else OUTCOMES[desc[cell[0]][cell[1]]]
            for name, cell in neighbours(desc, row, col).items()}


def states_lesson(skill: str) -> bool:
    """Whether a written skill states the hidden lesson of thin ice: it warns against stepping on ``~`` (the
    oracle's rule, or a paraphrase that names ``~`` with never/avoid/do not). A skill-correctness proxy for the
    self-analysis arm: it checks the lesson, not the path."""
    text = skill.lower()
    return "~" in text and any(w in text for w in ("never step on ~", "avoid", "never", "do not", "don't"))


def at_fork(info: dict) -> bool:
    """Whether the state an env info describes is a *fork*: the naive solver's next move lands on thin ice, so a
    skill that says "never step on ~" should change the move there (the states where SEED's teacher can raise the
    safe move most). ``info`` is a reset's or step's info (:meth:`ThinIceEnv._facts`); a finished episode's state
    is no fork."""
    return info.get("outcomes", {}).get(info.get("naive_move")) == "thin_ice"


def fall_message(row: int, col: int) -> str:
    """The line the final observation starts with after stepping on thin ice: the hindsight that ``~`` breaks."""
    return (f"The snowy ice ~ at row {row + 1}, column {col + 1} was thin ice: it broke and you fell into the "
            "water. Every ~ is thin ice.")


# -- the env -------------------------------------------------------------------------------------


class ThinIceEnv:
    """Thin ice as text (module docstring: maps, symbols, reward, splits).

    Args:
        size (int): the map is ``size x size``, at least 5 (on 4x4 maps the trap construction found no map in
            100,000 draws: cutting every shortest route there cuts every route).
        hole_p (float): probability that a tile is a visible hole ``O``.
        trap_prob (float): probability that a map is a trap (every shortest route through ``~`` crosses it).
        eval_split (str): the split ``eval_seeds`` draws from, ``selection`` or ``report``.
        routes (str): ``shortest`` (BFS solvers, trap maps cut every shortest route) or ``monotone`` (greedy
            down/right solvers, :func:`generate_monotone_map`; any ``size`` from 3).
        local_view (bool): add the line of :func:`local_view` under the map in every observation.
        view (str): ``map`` (the board, with ``local_view``'s line if set) or ``ahead`` (only the line of
            :func:`ahead_view`; monotone routes only).

    Besides the observation, every reset and step reports in its info what holds in the state it shows, so
    analyzers and diagnostics read facts, not the printed text: ``outcomes`` (what each move from here does:
    :func:`move_outcomes`), ``safe_move`` and ``naive_move`` (the next move of each solver, None when it has none
    or the episode is over; a *fork* is a state whose naive move lands on thin ice). A step's info adds what the
    move did, ``outcome`` (an :data:`OUTCOMES` kind, ``edge``, or ``invalid`` for a reply that is no move), and
    ``cell``, the player's cell after it.
    """

    name = "thin_ice"
    max_turns = 20
    # What SEED's diagnostics read (docs/methods/seed.md): the step-info flag of the hazard only hindsight reveals
    # (seed/delta_fatal), whether a skill states the lesson (seed/skill_correct_rate), and which states are forks
    # (seed/delta_fork*: where the lesson changes the move).
    hidden_hazard = "fell_through_ice"
    states_lesson = staticmethod(states_lesson)
    at_fork = staticmethod(at_fork)
    action_format = ("Reply with exactly one action inside <action> </action> tags: left, down, right or "
                     "up, e.g. <action>down</action>.")

    @staticmethod
    def check_config(*, size: int = 6, hole_p: float = 0.15, trap_prob: float = 0.5, eval_split: str = "selection",
                     routes: str = "shortest", local_view: bool = False, view: str = "map", **_: object) -> None:
        """The settings the constructor refuses, checked before any model loads (``tether.checks``)."""
        if routes not in ("shortest", "monotone"):
            raise ValueError(f"routes must be 'shortest' or 'monotone', got {routes!r}")
        if size < (5 if routes == "shortest" else 3):
            raise ValueError(f"size must be >= 5 with routes={routes} (>= 3 with monotone), got {size}")
        if not isinstance(local_view, bool):
            raise ValueError(f"local_view must be true or false, got {local_view!r}")
        if view not in ("map", "ahead"):
            raise ValueError(f"view must be 'map' or 'ahead', got {view!r}")
        if view == "ahead" and (routes != "monotone" or local_view):
            raise ValueError(f"view 'ahead' needs routes: monotone and local_view: false (it names the monotone "
                             f"walkers' two moves and replaces the map), got routes={routes!r}, "
                             f"local_view={local_view!r}")
        if not 0.0 <= hole_p < 0.5:
            raise ValueError(f"hole_p must be in [0, 0.5), got {hole_p}")
        if not 0.0 <= trap_prob <= 1.0:
            raise ValueError(f"trap_prob must be in [0, 1], got {trap_prob}")
        if eval_split not in ("selection", "report"):
            raise ValueError(f"eval_split must be 'selection' or 'report', got {eval_split!r}")

    def __init__(self, *, size: int = 6, hole_p: float = 0.15, trap_prob: float = 0.5,
                 eval_split: Literal["selection", "report"] = "selection", routes: Routes = "shortest",
                 local_view: bool = False, view: View = "map") -> None:
        self.check_config(size=size, hole_p=hole_p, trap_prob=trap_prob, eval_split=eval_split, routes=routes,
                          local_view=local_view, view=view)
        self.size, self.hole_p, self.trap_prob, self.eval_split = size, hole_p, trap_prob, eval_split
        self.routes, self.local_view, self.view = routes, local_view, view
        self.desc: list[str] = []
        self.position: Cell = (0, 0)
        self._started = False
        self._done = False

    @property
    def admissible(self) -> list[str]:
        return list(MOVES)

    def train_seeds(self, n: int) -> list[int]:
        return split_seeds("train", n)

    def eval_seeds(self, n: int) -> list[int]:
        """The first ``n`` seeds of ``eval_split``."""
        return split_seeds(self.eval_split, n)

    def reset(self, seed: int) -> EnvReset:
        if self.routes == "monotone":
            self.desc = generate_monotone_map(self.size, seed, hole_p=self.hole_p, trap_prob=self.trap_prob)
        else:
            self.desc = generate_map(self.size, seed, hole_p=self.hole_p, trap_prob=self.trap_prob,
                                     max_steps=self.max_turns - 2)
        self.position, self._started, self._done = (0, 0), True, False
        task = f"Walk from your position to the goal G without falling in. {LEGEND} Actions: left, down, right, up."
        safe, naive = self.solution() or [], self.naive_solution() or []
        falls = crosses_thin_ice(self.desc, naive)
        info = {"map": list(self.desc), "split": split_of(seed), "optimal_steps": len(safe),
                "naive_steps": len(naive), "trap": falls if self.routes == "monotone" else len(safe) > len(naive),
                "naive_falls": falls,
                "thin_ice": [(r, c) for r, row in enumerate(self.desc) for c, t in enumerate(row) if t == THIN],
                **self._facts()}
        return EnvReset(observation=self._observe(0, 0), task=task, admissible_actions=self.admissible, info=info)

    def _observe(self, row: int, col: int) -> str:
        if self.view == "ahead":
            return ahead_view(self.desc, row, col)
        board = render(self.desc, row, col)
        return f"{board}\n{local_view(self.desc, row, col)}" if self.local_view else board

    def step(self, action: str) -> EnvStep:
        check_can_step(self.name, self._started, self._done)
        key = normalize_action(action)
        invalid = key not in MOVES
        outcome = "invalid" if invalid else move_outcomes(self.desc, *self.position)[key]
        if not invalid:
            self.position = walk(self.position, [key], self.size)[-1]
        row, col = self.position
        tile = self.desc[row][col]
        self._done = tile in (GOAL, HOLE, THIN)
        obs = self._observe(row, col)
        info = {"won": tile == GOAL, "admissible_actions": self.admissible, "invalid_action": invalid,
                "fell_in_hole": tile == HOLE, "fell_through_ice": tile == THIN, "outcome": outcome,
                "cell": (row, col), **self._facts()}
        if invalid:
            info[STATE_KEY] = obs
            obs = f"Invalid action '{action}'; the valid actions are left, down, right, up.\n{obs}"
        elif tile == THIN:
            obs = f"{fall_message(row, col)}\n{obs}"
        return EnvStep(observation=obs, reward=1.0 if tile == GOAL else 0.0, done=self._done, info=info)

    def _facts(self) -> dict[str, object]:
        """The info every reset and step carries about the state it shows (class docstring)."""
        if self._done:
            return {"outcomes": {}, "safe_move": None, "naive_move": None}
        safe, naive = self.solution(), self.naive_solution()
        return {"outcomes": move_outcomes(self.desc, *self.position), "safe_move": safe[0] if safe else None,
                "naive_move": naive[0] if naive else None}

    def parse_action(self, response_text: str) -> tuple[str, bool]:
        return parse_tagged_action(response_text, self.admissible)

    def solution(self) -> list[str] | None:
        """The safe solver's plan (shortest path, or the monotone walker, avoiding holes and thin ice) from the
        current state; None when not running or when the monotone walker is stuck."""
        if not self._started or self._done:
            return None
        if self.routes == "monotone":
            return monotone_plan(self.desc, *self.position, HOLE + THIN)
        return safe_plan(self.desc, *self.position)

    def naive_solution(self) -> list[str] | None:
        """The naive solver's plan, which treats thin ice as safe (it may fall through); None as for solution."""
        if not self._started or self._done:
            return None
        if self.routes == "monotone":
            return monotone_plan(self.desc, *self.position, HOLE)
        return naive_plan(self.desc, *self.position)

    def close(self) -> None:
        self._started = False
