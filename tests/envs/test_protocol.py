"""Every registered env follows the TextEnv protocol (tether/envs/base.py)."""

from __future__ import annotations

import pytest

from tether.envs import ENVS, EnvReset, EnvStep, EpisodeOverError, Observation, TextEnv, observation_text

NAMES = sorted(ENVS)


def _play(env: TextEnv, seed: int, n_steps: int = 3) -> list[str]:
    """Observations of a fixed policy: the first admissible action, else the first word of the format."""
    first = env.reset(seed)
    observations = [first.observation, first.task]
    admissible = first.admissible_actions
    for _ in range(n_steps):
        action = admissible[0] if admissible else "look"
        step = env.step(action)
        observations.append(step.observation)
        if step.done:
            break
        admissible = step.admissible_actions
    return observations


@pytest.mark.parametrize("name", NAMES)
def test_reset_and_step_types(env_factory, name):
    env = env_factory(name)
    assert isinstance(env, TextEnv)
    assert env.name == name and env.max_turns > 0 and "<action>" in env.action_format
    first = env.reset(0)
    assert isinstance(first, EnvReset)
    assert isinstance(first.observation, (str, Observation)) and observation_text(first.observation)
    assert isinstance(first.task, str) and first.task
    assert first.admissible_actions is None or all(isinstance(a, str) for a in first.admissible_actions)
    assert isinstance(first.info, dict)
    action = first.admissible_actions[0] if first.admissible_actions else "look"
    step = env.step(action)
    assert isinstance(step, EnvStep)
    assert isinstance(step.observation, (str, Observation)) and isinstance(step.reward, float)
    assert isinstance(step.done, bool)
    assert {"won", "admissible_actions", "invalid_action"} <= set(step.info)
    assert isinstance(step.info["won"], bool) and isinstance(step.info["invalid_action"], bool)
    env.close()


@pytest.mark.parametrize("name", NAMES)
def test_same_seed_same_observations(env_factory, name):
    a, b = env_factory(name), env_factory(name)
    assert _play(a, 1) == _play(b, 1)
    assert _play(a, 1) == _play(a, 1)  # a reset fully re-seeds the same instance


@pytest.mark.parametrize("name", NAMES)
def test_different_seeds_differ(env_factory, name):
    env = env_factory(name)
    starts = {(r.observation, r.task) for r in (env.reset(0), env.reset(1))}
    assert len(starts) == 2


@pytest.mark.parametrize("name", NAMES)
def test_step_before_reset_and_after_done_raise(env_factory, name):
    env = env_factory(name)
    with pytest.raises(EpisodeOverError, match="before reset"):
        env.step("up")
    env.reset(0)
    plan = env.solution()
    if plan is None:
        pytest.skip(f"{name} has no solver to reach a terminal state")
    for action in plan:
        step = env.step(action)
    assert step.done and step.won
    assert env.solution() is None
    with pytest.raises(EpisodeOverError, match="after the episode ended"):
        env.step(plan[-1] if plan else "up")


@pytest.mark.parametrize("name", NAMES)
def test_admissible_actions_parse_as_valid(env_factory, name):
    env = env_factory(name)
    admissible = env.reset(0).admissible_actions
    if admissible is None:
        pytest.skip(f"{name} does not enumerate its actions")
    assert admissible, "an env that enumerates actions must offer at least one"
    for action in admissible:
        assert env.parse_action(f"<think>...</think><action>{action.upper()}</action>") == (action, True)
    assert env.parse_action("<action>definitely not an action</action>") == (
        "definitely not an action", False)


@pytest.mark.parametrize("name", NAMES)
def test_invalid_action_is_a_noop_that_keeps_the_episode_winnable(env_factory, name):
    env = env_factory(name)
    env.reset(0)
    action, valid = env.parse_action("I refuse to use the tags")
    assert (action, valid) == ("", False)
    step = env.step(action)  # verl-agent style: an invalid action still takes a turn
    assert step.info["invalid_action"] and not step.done and step.reward <= 0.0
    plan = env.solution()
    if plan is None:
        pytest.skip(f"{name} has no solver")
    for action in plan:
        step = env.step(action)
    assert step.done and step.won
