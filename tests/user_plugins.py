"""User code as a config names it (``tests.user_plugins:...``): a task class, an advantage, a loss, a method."""

from __future__ import annotations

from tether.algos import AdvantageOutput
from tether.algos.policy_losses import ppo
from tether.envs.base import eval_seeds, train_seeds
from tether.methods.base import Method
from tether.tasks import Score, TaskItem

calls = {"advantage": 0, "loss": 0}


class EvenLength:
    """The parity task's rule, defined outside tether and never registered."""

    name, system_prompt = "even_length", None

    def __init__(self, size: int = 8) -> None:
        self.train = [TaskItem(f"Say {i}.", None, id=f"t/{i}") for i in range(size)]
        self.val = [TaskItem(f"Tell {i}.", None, id=f"v/{i}") for i in range(2)]

    def score(self, item, text):
        even = len(text) % 2 == 0
        return Score(float(even), even, text)


def centred(inputs, *, shift: float = 0.0):
    """Rewards minus their group mean (plus ``shift``), counted."""
    calls["advantage"] += 1
    adv = inputs.rewards.clone()
    for group in inputs.group_ids.unique():
        rows = inputs.group_ids == group
        adv[rows] = inputs.rewards[rows] - inputs.rewards[rows].mean()
    return AdvantageOutput(adv + shift)


def counted_ppo(inputs, *, agg: str = "token-mean", clip_low: float = 0.2, clip_high: float = 0.2):
    calls["loss"] += 1
    return ppo(inputs, agg=agg, clip_low=clip_low, clip_high=clip_high)


NOT_CALLABLE = 1


class StepCounter(Method):
    """A method outside tether, named in a config as ``methods: {"tests.user_plugins:StepCounter": {}}``."""

    name = "step_counter"

    def __init__(self, settings) -> None:
        super().__init__(settings)
        self.updates = 0

    def after_update(self, ctx):
        self.updates += 1
        return {"step_counter/updates": float(self.updates)}


class Steering(Method):
    """A method that intervenes in sampling (its hook steers nothing: it only has to exist)."""

    name = "steering"

    def intervention(self, ctx):
        return None


class OtherSteering(Steering):
    """A second one: a run may hold at most one."""

    name = "other_steering"


class GymnasiumStyle:
    """A newcomer's env: tether's attributes, but gymnasium's return values, ``reset -> (observation, info)`` and
    ``step -> (observation, reward, terminated, truncated, info)`` (``tuple_reset=False``: a proper reset)."""

    name, max_turns, action_format = "gymnasium_style", 3, "Write <action>0</action> or <action>1</action>."

    def __init__(self, tuple_reset: bool = True) -> None:
        self.tuple_reset = tuple_reset

    def reset(self, seed):
        from tether.envs import EnvReset

        return ("Pick 0 or 1.", {}) if self.tuple_reset else EnvReset("Pick 0 or 1.", "pick", ["0", "1"])

    def step(self, action):
        return "done", 1.0, True, False, {"won": True}

    def parse_action(self, text):
        from tether.envs.base import parse_tagged_action

        return parse_tagged_action(text, ["0", "1"])

    def solution(self):
        return ["0"]

    def close(self):
        pass

    train_seeds = staticmethod(train_seeds)
    eval_seeds = staticmethod(eval_seeds)


class HalfAnEnv:
    """A newcomer's env with reset and step right but without the members the run reads of the rest of the protocol
    (``action_format``, ``parse_action``, the seed splits)."""

    name, max_turns = "half", 2

    def reset(self, seed):
        from tether.envs import EnvReset

        return EnvReset("Pick 0 or 1.", "pick", ["0", "1"])

    def step(self, action):
        from tether.envs import EnvStep

        return EnvStep("done", 1.0, True, {"won": True, "admissible_actions": None, "invalid_action": False})

    def close(self):
        pass
