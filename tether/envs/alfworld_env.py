"""ALFWorld (text) adapter over a local copy of the ALFWorld data.

ALFWorld's data cannot be downloaded by tether (``alfworld-download`` needs GitHub). Run it on a
machine with network access and copy the folder over. Expected layout (``data_dir`` argument, else
``$ALFWORLD_DATA``, else ``~/.cache/alfworld``, alfworld's own default)::

    <data_dir>/json_2.1.1/train/<task>-<object>-...-<scene>/trial_<id>/game.tw-pddl
    <data_dir>/json_2.1.1/valid_seen/...    (in-distribution eval, 140 games)
    <data_dir>/json_2.1.1/valid_unseen/...  (out-of-distribution eval, 134 games)

Each ``game.tw-pddl`` embeds the PDDL domain, problem and grammar, so nothing else is read. Games that
ALFWorld marks unsolvable, and the "movable"/"Sliced" ones it skips itself, are left out. Needs
``pip install alfworld`` (for its name demangler) and textworld.

Seeds: a train seed ``s`` plays ``train[s % n_train]``; an eval seed plays ``<eval_split>[(s -
EVAL_SEED_OFFSET) % n_eval]``, games sorted by path. Reward 1.0 on the winning step (SEED's launchers use
10·won; tether keeps 1.0 so that "return >= 1" means success everywhere). Commands outside the
admissible list are no-ops ("Nothing happens.", as ALFWorld itself answers). ``solution()`` is None:
ALFWorld's hand-coded expert is not wired in.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import re
from pathlib import Path
from typing import Any

from tether.envs.base import (
    EVAL_SEED_OFFSET,
    EnvReset,
    EnvStep,
    EnvUnavailableError,
    check_can_step,
    eval_seeds,
    is_eval_seed,
    normalize_action,
    parse_tagged_action,
    train_seeds,
)

SPLITS = ("train", "valid_seen", "valid_unseen")


def default_data_dir() -> Path:
    return Path(os.environ.get("ALFWORLD_DATA", Path.home() / ".cache" / "alfworld"))


@functools.lru_cache(maxsize=8)
def list_games(data_dir: str, split: str) -> tuple[str, ...]:
    """The playable ``game.tw-pddl`` files of a split, sorted (cached: reading them takes seconds)."""
    games = []
    for path in sorted((Path(data_dir) / "json_2.1.1" / split).glob("*/*/game.tw-pddl")):
        if "movable" in str(path) or "Sliced" in str(path):
            continue
        with open(path) as f:
            if json.load(f).get("solvable", True):
                games.append(str(path))
    return tuple(games)


def missing_packages() -> list[str]:
    """The packages the env imports when built (alfworld for its name demangler, textworld to play)."""
    return [f"the {name} package (pip install {name})" for name in ("alfworld", "textworld")
            if importlib.util.find_spec(name) is None]


def missing_inputs(data_dir: Path, eval_split: str) -> list[str]:
    """What the env needs and does not find: a split without any game file, a package."""
    missing = [f"no game.tw-pddl files under {data_dir / 'json_2.1.1' / split}" for split in ("train", eval_split)
               if next((data_dir / "json_2.1.1" / split).glob("*/*/game.tw-pddl"), None) is None]
    return missing + missing_packages()


def unavailable_message(data_dir: Path, missing: list[str]) -> str:
    return ("ALFWorld is not available: " + "; ".join(missing) + ". Set data_dir= or ALFWORLD_DATA to a "
            "copy of the folder `alfworld-download` creates (it needs network access; see docs/environments.md).")


class AlfWorldEnv:
    """ALFWorld text games from local data (module docstring: layout, seeds, reward).

    Args:
        data_dir (str | None): the ALFWorld data folder.
        eval_split (str): "valid_seen" (in-distribution) or "valid_unseen" (out-of-distribution).

    Raises:
        EnvUnavailableError: the data or the alfworld package is missing (the message says which).
    """

    name = "alfworld"
    max_turns = 30
    action_format = ("Reply with exactly one of the admissible actions inside <action> </action> tags, "
                     "e.g. <action>go to desk 1</action>.")
    train_seeds = staticmethod(train_seeds)
    eval_seeds = staticmethod(eval_seeds)

    @staticmethod
    def check_config(*, eval_split: str = "valid_seen", **_: object) -> None:
        """The settings the constructor refuses, checked before any model loads (``tether.checks``)."""
        if eval_split not in SPLITS[1:]:
            raise ValueError(f"eval_split must be one of {', '.join(SPLITS[1:])}, got {eval_split!r}")

    @staticmethod
    def check_inputs(*, data_dir: str | None = None, eval_split: str = "valid_seen", **_: object) -> None:
        """The data and the packages are here (``tether validate`` and the start of a run ask, before any model
        loads). One game file per split is enough to tell: reading them all, as the env does, takes seconds."""
        root = Path(data_dir).expanduser() if data_dir else default_data_dir()
        missing = missing_inputs(root, eval_split)
        if missing:
            raise ValueError(unavailable_message(root, missing))

    def __init__(self, *, data_dir: str | None = None, eval_split: str = "valid_seen") -> None:
        self.check_config(eval_split=eval_split)
        self.data_dir = Path(data_dir).expanduser() if data_dir else default_data_dir()
        self.eval_split = eval_split
        self._check_available()
        import textworld
        from alfworld.agents.environment.alfred_tw_env import AlfredDemangler

        self._textworld, self._demangler = textworld, AlfredDemangler
        self._game = None
        self._state: Any = None
        self._done = False

    def _check_available(self) -> None:
        missing = [f"no playable game.tw-pddl files under {self.data_dir / 'json_2.1.1' / split}"
                   for split in ("train", self.eval_split) if not list_games(str(self.data_dir), split)]
        missing += missing_packages()
        if missing:
            raise EnvUnavailableError(unavailable_message(self.data_dir, missing))

    @property
    def admissible(self) -> list[str] | None:
        return None if self._state is None else list(self._state["admissible_commands"])

    def reset(self, seed: int) -> EnvReset:
        split = self.eval_split if is_eval_seed(seed) else "train"
        games = list_games(str(self.data_dir), split)
        path = games[(seed - EVAL_SEED_OFFSET if is_eval_seed(seed) else seed) % len(games)]
        self.close()
        infos = self._textworld.EnvInfos(feedback=True, won=True, admissible_commands=True)
        self._game = self._textworld.start(path, request_infos=infos,
                                           wrappers=[self._demangler(shuffle=False)])
        self._state = self._game.reset()
        self._done = False
        obs = self._state["feedback"].replace("-= Welcome to TextWorld, ALFRED! =-", "").strip()
        match = re.search(r"Your task is to:\s*(.*)", obs)
        task = match.group(1).strip() if match else ""
        return EnvReset(observation=obs, task=task, admissible_actions=self.admissible,
                        info={"game_file": path, "split": split})

    def step(self, action: str) -> EnvStep:
        check_can_step(self.name, self._game is not None, self._done)
        command = {normalize_action(a): a for a in self.admissible or []}.get(normalize_action(action))
        if command is None:
            info = {"won": False, "admissible_actions": self.admissible, "invalid_action": True}
            return EnvStep(observation="Nothing happens.", reward=0.0, done=False, info=info)
        self._state, _, done = self._game.step(command)
        won = bool(self._state["won"])
        self._done = bool(done) or won
        info = {"won": won, "admissible_actions": self.admissible, "invalid_action": False}
        return EnvStep(observation=self._state["feedback"].strip(), reward=1.0 if won else 0.0,
                       done=self._done, info=info)

    def parse_action(self, response_text: str) -> tuple[str, bool]:
        return parse_tagged_action(response_text, self.admissible)

    def solution(self) -> list[str] | None:
        return None

    def close(self) -> None:
        if self._game is not None:
            self._game.close()
        self._game = None
