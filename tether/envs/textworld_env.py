"""TextWorld games generated locally, cached on disk, played through textworld's own API.

Games are made with textworld's Python API (not the ``tw-make`` CLI): ``kind="custom"`` uses
``textworld.generator.make_game`` with a world size, a number of objects and a quest length;
``"tw-treasure_hunter"`` and ``"tw-cooking"`` use textworld's built-in challenges. A preset names one
setting; the custom presets accept overrides of the three size knobs.

Each game is a pure function of (settings, seed, textworld version) and is compiled once into
``<cache>/tw-<version>/<settings>/seed<seed>.z8`` (about 1-3 s per game) and reused afterwards. The
cache root is the ``cache_dir`` argument, else ``$TETHER_CACHE/textworld``, else
``~/.cache/tether/textworld``: outside the repository, shared by all runs. One process compiles a game
while the others wait on its lock, into a temporary folder whose finished files are renamed into place, so
concurrent processes never read a half-written game nor compile one twice.

Splits: train seeds ``0..`` and eval seeds ``EVAL_SEED_OFFSET..`` (see :mod:`tether.envs.base`) give
two disjoint sets of generated games; :meth:`TextWorldEnv.game_files` generates a split ahead of a run.

Reward: ``reward_mode="sparse"`` (default) gives 1.0 on the winning step; ``"score"`` gives the game's
score increase divided by its max score (sums to 1.0 for a full-score win). ``info`` carries textworld's
``intermediate_reward`` (+1 closer to the goal, -1 further, 0 otherwise), ``score`` and ``lost``.
Commands outside the admissible list are not sent to the game: they are no-ops ("Nothing happens.").
"""

from __future__ import annotations

import fcntl
import importlib.util
import os
import re
import shutil
import warnings
from pathlib import Path
from typing import Any

from tether.envs.base import (
    EnvReset,
    EnvStep,
    EnvUnavailableError,
    check_can_step,
    eval_seeds,
    normalize_action,
    parse_tagged_action,
    train_seeds,
)

NEEDS_TEXTWORLD = "textworld env needs textworld: pip install textworld (or pip install 'tether[agents]')"
PRESETS: dict[str, dict[str, Any]] = {
    "easy": {"kind": "custom", "world_size": 1, "nb_objects": 3, "quest_length": 1},
    "medium": {"kind": "custom", "world_size": 3, "nb_objects": 6, "quest_length": 3},
    "hard": {"kind": "custom", "world_size": 6, "nb_objects": 12, "quest_length": 6},
    "treasure-easy": {"kind": "tw-treasure_hunter", "level": 3},
    "treasure-medium": {"kind": "tw-treasure_hunter", "level": 13},
    "cooking-easy": {"kind": "tw-cooking", "recipe": 1, "take": 1, "go": 1, "open": False, "cook": False,
                     "cut": False},
    "cooking-medium": {"kind": "tw-cooking", "recipe": 2, "take": 2, "go": 6, "open": True, "cook": True,
                       "cut": True},
}


def default_cache_dir() -> Path:
    """``$TETHER_CACHE/textworld`` if TETHER_CACHE is set, else ``~/.cache/tether/textworld``."""
    root = os.environ.get("TETHER_CACHE")
    return Path(root) / "textworld" if root else Path.home() / ".cache" / "tether" / "textworld"


def settings_slug(settings: dict[str, Any]) -> str:
    """A readable, unique folder name for a game setting, e.g. ``custom-nb_objects3-...``."""
    knobs = sorted((k, int(v) if isinstance(v, bool) else v) for k, v in settings.items() if k != "kind")
    return "-".join([str(settings["kind"])] + [f"{k}{v}" for k, v in knobs])


def game_file(settings: dict[str, Any], seed: int, cache_dir: Path) -> Path:
    """The compiled game for (settings, seed), generating it on a cache miss.

    One process compiles a game while the others that want it wait on its lock (an advisory ``flock`` on
    ``seed<seed>.lock``, released by the kernel however its holder ends): the ``group_size`` clones of a task reset at
    once, and each compiling the same game on a loaded 2-core machine took past the 30 s reset limit of
    ``configs/agents/textworld_grpo.yaml``, whose first step then had no episode to start. The holder writes into
    ``.tmp-seed<seed>``, cleared first: a holder killed at the reset limit leaves its half-written folder to the next.

    Args:
        settings (dict): a preset's settings (``kind`` plus its knobs).
        seed (int): the game seed (textworld derives its map, object, quest and grammar seeds from it).
        cache_dir (Path): the cache root.

    Returns:
        Path: the ``.z8`` game file (its ``.json`` sits next to it).
    """
    import textworld

    folder = cache_dir / f"tw-{textworld.__version__}" / settings_slug(settings)
    path = folder / f"seed{seed}.z8"
    if _compiled(path):
        return path
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / f"seed{seed}.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, or when this process dies
        if _compiled(path):  # another process compiled it while this one waited
            return path
        tmp = folder / f".tmp-seed{seed}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        try:
            built = _compile(settings, seed, tmp / path.name)
            # json first: a reader takes the .z8 as the sign that both files are complete.
            os.replace(built.with_suffix(".json"), path.with_suffix(".json"))
            os.replace(built, path)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return path


def _compiled(path: Path) -> bool:
    return path.is_file() and path.with_suffix(".json").is_file()


def _compile(settings: dict[str, Any], seed: int, path: Path) -> Path:
    import textworld
    import textworld.challenges
    from textworld.generator import compile_game

    options = textworld.GameOptions()
    options.seeds = seed
    options.path = str(path)
    options.file_ext = ".z8"
    knobs = {k: v for k, v in settings.items() if k != "kind"}
    if settings["kind"] == "custom":
        options.nb_rooms = knobs["world_size"]
        options.nb_objects = knobs["nb_objects"]
        options.quest_length = knobs["quest_length"]
        game = textworld.generator.make_game(options)
    else:
        _, make, _ = textworld.challenges.CHALLENGES[settings["kind"]]
        if settings["kind"] == "tw-cooking":  # the challenge reads these keys unconditionally
            knobs = {"drop": False, "recipe_seed": 0, "split": None, **knobs}
        game = make(knobs, options)
    return Path(compile_game(game, options))


def clean_feedback(text: str) -> str:
    """Drop the title banner, the ``>`` prompt with its status line, the end-of-game menu and the
    Inform layout whitespace."""
    text = re.sub(r"\n>[^\n]*\Z", "", text.rstrip())
    text = re.sub(r"\n\s*You scored .*\Z", "", text, flags=re.DOTALL)  # "... Would you like to RESTART"
    lines = [line.strip() for line in text.split("\n")]
    while lines and not re.search(r"[A-Za-z]", lines[0]):  # the ASCII-art banner has no letters
        lines.pop(0)
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip()


class TextWorldEnv:
    """A generated TextWorld game per seed (module docstring: presets, cache, splits, rewards).

    Args:
        preset (str): one of :data:`PRESETS`.
        world_size, nb_objects, quest_length (int | None): override a custom preset's knob.
        cache_dir (str | None): the cache root (default: :func:`default_cache_dir`).
        reward_mode (str): "sparse" or "score".
    """

    name = "textworld"
    max_turns = 20
    action_format = ("Reply with exactly one of the admissible commands inside <action> </action> tags, "
                     "e.g. <action>go north</action>.")
    train_seeds = staticmethod(train_seeds)
    eval_seeds = staticmethod(eval_seeds)

    @staticmethod
    def check_inputs(**_: Any) -> None:
        """The textworld package is here (``tether validate`` and the start of a run ask, before any model loads)."""
        if importlib.util.find_spec("textworld") is None:
            raise ValueError(NEEDS_TEXTWORLD)

    def __init__(self, *, preset: str = "easy", world_size: int | None = None, nb_objects: int | None = None,
                 quest_length: int | None = None, cache_dir: str | None = None,
                 reward_mode: str = "sparse") -> None:
        self.settings = _settings(preset, world_size=world_size, nb_objects=nb_objects,
                                  quest_length=quest_length)
        if reward_mode not in ("sparse", "score"):
            raise ValueError(f"reward_mode must be 'sparse' or 'score', got {reward_mode!r}")
        try:
            import textworld
        except ImportError as e:
            raise EnvUnavailableError(NEEDS_TEXTWORLD) from e
        self._textworld = textworld
        self.cache_dir = Path(cache_dir).expanduser() if cache_dir else default_cache_dir()
        self.reward_mode = reward_mode
        self._game = None
        self._state: Any = None
        self._done = False

    def game_files(self, seeds: list[int]) -> list[Path]:
        """Generate (or find in the cache) the games of ``seeds``, e.g. ``env.train_seeds(100)``."""
        return [game_file(self.settings, s, self.cache_dir) for s in seeds]

    @property
    def admissible(self) -> list[str] | None:
        return None if self._state is None else list(self._state["admissible_commands"])

    def reset(self, seed: int) -> EnvReset:
        path = game_file(self.settings, seed, self.cache_dir)
        self.close()
        infos = self._textworld.EnvInfos(
            feedback=True, objective=True, admissible_commands=True, policy_commands=True,
            intermediate_reward=True, score=True, max_score=True, won=True, lost=True,
            extras=["walkthrough"])
        with warnings.catch_warnings():
            # jericho does not know textworld's games and disables its own score tracking, which
            # tether does not use (textworld tracks score and win itself).
            warnings.filterwarnings("ignore", message=".*is not fully supported")
            self._game = self._textworld.start(str(path), request_infos=infos)
        self._state = self._game.reset()
        self._done = False
        info = {"game_file": str(path), "walkthrough": list(self._state.get("extra.walkthrough") or []),
                "max_score": self._state["max_score"]}
        return EnvReset(observation=clean_feedback(self._state["feedback"]), task=self._state["objective"],
                        admissible_actions=self.admissible, info=info)

    def step(self, action: str) -> EnvStep:
        check_can_step(self.name, self._game is not None, self._done)
        by_key = {normalize_action(a): a for a in self.admissible or []}
        command = by_key.get(normalize_action(action))
        if command is None:
            info = self._info(invalid=True)
            info["intermediate_reward"] = 0
            return EnvStep(observation="Nothing happens.", reward=0.0, done=False, info=info)
        before = self._state["score"]
        self._state, _, done = self._game.step(command)
        self._done = bool(done)
        return EnvStep(observation=clean_feedback(self._state["feedback"]),
                       reward=self._reward(before), done=self._done, info=self._info(invalid=False))

    def _reward(self, score_before: int) -> float:
        if self.reward_mode == "sparse":
            return 1.0 if self._state["won"] else 0.0
        return (self._state["score"] - score_before) / max(self._state["max_score"], 1)

    def _info(self, invalid: bool) -> dict[str, Any]:
        s = self._state
        return {"won": bool(s["won"]), "lost": bool(s["lost"]), "admissible_actions": self.admissible,
                "invalid_action": invalid, "score": s["score"], "max_score": s["max_score"],
                "intermediate_reward": s["intermediate_reward"]}

    def parse_action(self, response_text: str) -> tuple[str, bool]:
        return parse_tagged_action(response_text, self.admissible)

    def solution(self) -> list[str] | None:
        """textworld's winning policy from the current state (the walkthrough at the start)."""
        if self._game is None or self._done:
            return None
        return list(self._state["policy_commands"])

    def close(self) -> None:
        if self._game is not None:
            self._game.close()
        self._game = None


def _settings(preset: str, **overrides: int | None) -> dict[str, Any]:
    if preset not in PRESETS:
        raise ValueError(f"unknown textworld preset {preset!r}; choose from {sorted(PRESETS)}")
    settings = dict(PRESETS[preset])
    given = {k: v for k, v in overrides.items() if v is not None}
    if given and settings["kind"] != "custom":
        raise ValueError(f"{sorted(given)} only apply to the custom presets (easy, medium, hard), "
                         f"not to {preset!r}")
    for key, value in given.items():
        if value < 1:
            raise ValueError(f"{key} must be >= 1, got {value}")
    settings.update(given)
    return settings
