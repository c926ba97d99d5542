"""gymnasium's FrozenLake-v1 as a text env, with a random map per seed.

The seed drives both the map (gymnasium's ``generate_random_map(size, p, seed)``, which guarantees a
path from start to goal; the start is top-left, the goal bottom-right) and the slip noise
(``reset(seed=seed)`` of the gymnasium env), so an episode is a pure function of the seed and the
actions.

Symbols (RAGEN's text FrozenLake): ``P`` player, ``_`` frozen tile, ``O`` hole, ``G`` goal,
``X`` player in a hole, ``√`` player on the goal.

Reward: 1.0 on reaching the goal (gymnasium's), else 0.0. Falling into a hole ends the episode lost.
"""

from __future__ import annotations

import importlib.util

from tether.envs import grid
from tether.envs.base import (
    STATE_KEY,
    EnvReset,
    EnvStep,
    EnvUnavailableError,
    check_can_step,
    eval_seeds,
    normalize_action,
    parse_tagged_action,
    train_seeds,
)

# gymnasium's action ids.
NEEDS_GYMNASIUM = "frozenlake needs gymnasium: pip install gymnasium (or pip install 'tether[agents]')"
ACTIONS = {"left": 0, "down": 1, "right": 2, "up": 3}

LEGEND = "Symbols: P you, _ frozen tile, O hole, G goal, X you in a hole, √ you on the goal."


def render(desc: list[str], row: int, col: int) -> str:
    """The map as text with the player at ``(row, col)`` (symbols in the module docstring)."""
    return grid.render(desc, row, col, _symbol)


def _symbol(tile: str, player: bool) -> str:
    if player:
        return {"H": "X", "G": "√"}.get(tile, "P")
    return {"H": "O", "G": "G"}.get(tile, "_")


def shortest_path(desc: list[str], row: int, col: int) -> list[str] | None:
    """Fewest moves from ``(row, col)`` to the goal avoiding holes, by BFS; None if there is none."""
    return grid.shortest_path(desc, row, col, avoid="H")


class FrozenLakeEnv:
    """FrozenLake as text (module docstring: maps, symbols, reward).

    Args:
        size (int): the map is ``size x size``.
        p (float): probability that a generated tile is frozen (gymnasium's default 0.8).
        is_slippery (bool): if True the player moves in the intended direction with probability
            ``success_rate`` and otherwise to one of the two perpendicular directions.
        success_rate (float): see ``is_slippery``.
    """

    name = "frozenlake"
    max_turns = 20
    action_format = ("Reply with exactly one action inside <action> </action> tags: left, down, right or "
                     "up, e.g. <action>down</action>.")
    train_seeds = staticmethod(train_seeds)
    eval_seeds = staticmethod(eval_seeds)

    @staticmethod
    def check_config(*, size: int = 4, p: float = 0.8, **_: object) -> None:
        """The settings the constructor refuses, checked before any model loads (``tether.checks``)."""
        if size < 2:
            raise ValueError(f"size must be >= 2, got {size}")
        if not 0.0 < p <= 1.0:
            raise ValueError(f"p must be in (0, 1], got {p}")

    @staticmethod
    def check_inputs(**_: object) -> None:
        """The gymnasium package is here (``tether validate`` and the start of a run ask)."""
        if importlib.util.find_spec("gymnasium") is None:
            raise ValueError(NEEDS_GYMNASIUM)

    def __init__(self, *, size: int = 4, p: float = 0.8, is_slippery: bool = False,
                 success_rate: float = 1.0 / 3.0) -> None:
        self.check_config(size=size, p=p)
        try:
            from gymnasium.envs.toy_text import frozen_lake
        except ImportError as e:
            raise EnvUnavailableError(NEEDS_GYMNASIUM) from e
        self._lib = frozen_lake
        self.size, self.p, self.is_slippery, self.success_rate = size, p, is_slippery, success_rate
        self.desc: list[str] = []
        self._gym = None
        self._state = 0
        self._done = False

    @property
    def admissible(self) -> list[str]:
        return list(ACTIONS)

    @property
    def position(self) -> tuple[int, int]:
        return divmod(self._state, self.size)

    def reset(self, seed: int) -> EnvReset:
        self.desc = self._lib.generate_random_map(size=self.size, p=self.p, seed=seed)
        self._gym = self._lib.FrozenLakeEnv(desc=self.desc, is_slippery=self.is_slippery,
                                            success_rate=self.success_rate)
        self._state, _ = self._gym.reset(seed=seed)
        self._done = False
        slip = (" The ice is slippery: you may slide to a side instead of where you meant to go."
                if self.is_slippery else "")
        task = (f"Walk from your position to the goal G without falling into a hole O.{slip} {LEGEND} "
                "Actions: left, down, right, up.")
        return EnvReset(observation=render(self.desc, *self.position), task=task,
                        admissible_actions=self.admissible, info={"map": list(self.desc)})

    def step(self, action: str) -> EnvStep:
        check_can_step(self.name, self._gym is not None, self._done)
        key = normalize_action(action)
        invalid = key not in ACTIONS
        reward = 0.0
        if not invalid:
            self._state, r, terminated, _, _ = self._gym.step(ACTIONS[key])
            reward, self._done = float(r), bool(terminated)
        row, col = self.position
        tile = self.desc[row][col]
        obs = render(self.desc, row, col)
        info = {"won": tile == "G", "admissible_actions": self.admissible, "invalid_action": invalid,
                "fell_in_hole": tile == "H"}
        if invalid:
            info[STATE_KEY] = obs
            obs = f"Invalid action '{action}'; the valid actions are left, down, right, up.\n{obs}"
        return EnvStep(observation=obs, reward=reward, done=self._done, info=info)

    def parse_action(self, response_text: str) -> tuple[str, bool]:
        return parse_tagged_action(response_text, self.admissible)

    def solution(self) -> list[str] | None:
        """The shortest hole-free path. On slippery ice it is the intended moves, not a guarantee."""
        if self._gym is None or self._done:
            return None
        return shortest_path(self.desc, *self.position)

    def close(self) -> None:
        self._gym = None
