"""WebShop adapter over a local WebShop checkout with its data.

WebShop is not on PyPI: clone github.com/princeton-nlp/WebShop, run its ``setup.sh`` (product data,
goals, the pyserini search indexes; needs Java) on a machine with network access, and point tether at
the folder (``webshop_dir`` argument, else ``$WEBSHOP_DIR``). Expected layout::

    <webshop_dir>/web_agent_site/envs/web_agent_text_env.py
    <webshop_dir>/data/items_shuffle_1000.json, items_ins_v2_1000.json, items_human_ins.json
    <webshop_dir>/search_engine/indexes_1k/     (indexes/ for the full product set)

``num_products=1000`` (default) is the small version verl-agent trains on; ``None`` uses the full
set (edit ``web_agent_site/utils.py`` to point at the full files, as WebShop's README says).

Seeds follow WebShop's split of the (shuffled) human goals: eval seeds play the test goals 0-499,
train seeds the goals from 1500 on (500-1499 are WebShop's dev goals, unused here).

Actions are ``search[<query>]`` (only where the page has a search bar) and ``click[<button>]`` with
a button on the page. ``admissible_actions`` is None because searches are open-ended; the page's
actions are in ``info["available_actions"]`` for the prompt, and ``parse_action`` checks an action
against them. Reward: the purchase's task score in [0, 1] on the final step; ``won`` iff it is 1.0.
"""

from __future__ import annotations

import os
import re
import sys
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
    parse_tagged_action,
    train_seeds,
)

_TEST_GOALS, _TRAIN_START = 500, 1500
SIZES = (1000, None)  # the product sets WebShop's setup.sh builds indexes for
_SEARCH = re.compile(r"search\[(.+)\]\Z", re.IGNORECASE | re.DOTALL)
_CLICK = re.compile(r"click\[(.+)\]\Z", re.IGNORECASE | re.DOTALL)


def required_files(webshop_dir: Path, num_products: int | None) -> list[Path]:
    """What must exist in a WebShop checkout for ``num_products``."""
    small = num_products == 1000
    return [webshop_dir / "web_agent_site" / "envs" / "web_agent_text_env.py",
            webshop_dir / "data" / ("items_shuffle_1000.json" if small else "items_shuffle.json"),
            webshop_dir / "data" / "items_human_ins.json",
            webshop_dir / "search_engine" / ("indexes_1k" if small else "indexes")]


def checkout_dir(webshop_dir: str | None, num_products: int | None) -> Path:
    """The checkout (``webshop_dir``, else ``$WEBSHOP_DIR``) with every file :func:`required_files` names.

    Raises:
        ValueError: no checkout given, or the files it lacks.
    """
    root = webshop_dir or os.environ.get("WEBSHOP_DIR")
    if not root:
        raise ValueError("WebShop is not available: pass webshop_dir= or set WEBSHOP_DIR to a WebShop checkout "
                         "with its data (see docs/environments.md)")
    path = Path(root).expanduser()
    missing = [str(p) for p in required_files(path, num_products) if not p.exists()]
    if missing:
        raise ValueError(f"WebShop is not available: missing {', '.join(missing)} (run WebShop's setup.sh on a "
                         "machine with network access)")
    return path


class WebShopEnv:
    """WebShop in text mode (module docstring: layout, seeds, actions, reward).

    Args:
        webshop_dir (str | None): the WebShop checkout.
        num_products (int | None): 1000 (small) or None (full).

    Raises:
        EnvUnavailableError: the checkout, its data or its Python dependencies are missing.
    """

    name = "webshop"
    max_turns = 15
    action_format = ("Reply with exactly one action inside <action> </action> tags: search[<your query>] "
                     "or click[<a button on the page>], e.g. <action>click[buy now]</action>.")
    train_seeds = staticmethod(train_seeds)
    eval_seeds = staticmethod(eval_seeds)

    @staticmethod
    def check_config(*, num_products: int | None = 1000, **_: object) -> None:
        """The settings the constructor refuses, checked before any model loads (``tether.checks``)."""
        if num_products not in SIZES:
            raise ValueError(f"num_products must be 1000 (the small product set) or null (the full one), "
                             f"got {num_products!r}")

    @staticmethod
    def check_inputs(*, webshop_dir: str | None = None, num_products: int | None = 1000, **_: object) -> None:
        """The checkout and its data are here (``tether validate`` and the start of a run ask, before any model
        loads); its Python requirements are imported only when the env is built."""
        checkout_dir(webshop_dir, num_products)

    def __init__(self, *, webshop_dir: str | None = None, num_products: int | None = 1000) -> None:
        self.check_config(num_products=num_products)
        try:
            self.webshop_dir = checkout_dir(webshop_dir, num_products)
        except ValueError as err:
            raise EnvUnavailableError(str(err)) from None
        self._env = self._load(num_products)
        self._available: dict[str, Any] = {"has_search_bar": False, "clickables": []}
        self._started = False
        self._done = False

    def _load(self, num_products: int | None) -> Any:
        if str(self.webshop_dir) not in sys.path:
            sys.path.insert(0, str(self.webshop_dir))
        try:
            from web_agent_site.envs.web_agent_text_env import WebAgentTextEnv
        except ImportError as e:
            raise EnvUnavailableError(f"WebShop's code failed to import ({e}); install its requirements "
                                      f"(requirements.txt in {self.webshop_dir})") from e
        file_path = self.webshop_dir / "data" / ("items_shuffle_1000.json" if num_products == 1000
                                                 else "items_shuffle.json")
        return WebAgentTextEnv(observation_mode="text", file_path=str(file_path), num_products=num_products,
                               human_goals=True)

    def available_actions(self) -> list[str]:
        """The page's actions as strings, for the prompt."""
        search = ["search[<your query>]"] if self._available["has_search_bar"] else []
        return search + [f"click[{c}]" for c in self._available["clickables"]]

    def reset(self, seed: int) -> EnvReset:
        n_goals = len(self._env.server.goals)
        if is_eval_seed(seed):
            goal = (seed - EVAL_SEED_OFFSET) % _TEST_GOALS
        else:
            goal = _TRAIN_START + seed % (n_goals - _TRAIN_START)
        obs, _ = self._env.reset(session=goal)
        self._available = self._env.get_available_actions()
        self._started, self._done = True, False
        task = re.sub(r"^\s*Instruction:\s*", "", self._env.instruction_text).strip()
        return EnvReset(observation=obs, task=task, admissible_actions=None,
                        info={"goal_index": goal, "available_actions": self.available_actions()})

    def step(self, action: str) -> EnvStep:
        check_can_step(self.name, self._started, self._done)
        canonical = self._canonical(action)
        if canonical is None:
            info = {"won": False, "admissible_actions": None, "invalid_action": True,
                    "available_actions": self.available_actions()}
            return EnvStep(observation="Invalid action. Nothing happens.", reward=0.0, done=False, info=info)
        obs, reward, done, _ = self._env.step(canonical)
        self._available = self._env.get_available_actions()
        self._done = bool(done)
        score = float(reward) if done else 0.0
        info = {"won": self._done and score == 1.0, "admissible_actions": None, "invalid_action": False,
                "score": score, "available_actions": self.available_actions()}
        return EnvStep(observation=obs, reward=score, done=self._done, info=info)

    def _canonical(self, action: str) -> str | None:
        """``search[q]`` / ``click[x]`` in WebShop's spelling, or None if not possible on this page."""
        action = " ".join(action.split())
        search, click = _SEARCH.match(action), _CLICK.match(action)
        if search and self._available["has_search_bar"]:
            return f"search[{search.group(1).strip()}]"
        by_key = {c.lower(): c for c in self._available["clickables"]}
        if click and click.group(1).strip().lower() in by_key:
            return f"click[{by_key[click.group(1).strip().lower()]}]"
        return None

    def parse_action(self, response_text: str) -> tuple[str, bool]:
        action, found = parse_tagged_action(response_text)
        if not found:
            return action, False
        canonical = self._canonical(action)
        return (canonical, True) if canonical else (action, False)

    def solution(self) -> list[str] | None:
        return None

    def close(self) -> None:
        self._started = False
