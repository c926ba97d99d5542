"""An invalid action is a no-op wherever the player stands (test_protocol.py tries it at the start only, where two of
the four moves are no-ops too): FrozenLake and Sokoban, stepped with a non-action before every move of a winning
plan, keep the board, say so in the observation, end nothing and pay the no-op reward (Sokoban's shaped mode still
charges its step cost)."""

from __future__ import annotations

import pytest

from tether.envs import make_env, observation_key
from tether.envs.sokoban import render

INVALID = ("jump", "")


def test_frozenlake_invalid_actions_never_move_the_player():
    pytest.importorskip("gymnasium")
    env = make_env("frozenlake")
    for seed in range(4):
        shown = env.reset(seed).observation
        for action in env.solution():
            for bad in INVALID:
                where = env.position
                step = env.step(bad)
                assert env.position == where and step.reward == 0.0 and not step.done and not step.info["won"]
                assert step.info["invalid_action"] and not step.info["fell_in_hole"]
                assert step.observation == (f"Invalid action '{bad}'; the valid actions are left, down, right, up.\n"
                                            f"{shown}")
            step = env.step(action)
            assert not step.info["invalid_action"]
            shown = step.observation
        assert step.done and step.info["won"] and step.reward == 1.0


@pytest.mark.parametrize(("mode", "cost"), [("sparse", 0.0), ("shaped", -0.1)])
def test_sokoban_invalid_actions_leave_the_level_as_it_was(mode, cost):
    env = make_env("sokoban", reward_mode=mode)
    for seed in range(4):
        env.reset(seed)
        for action in env.solution():
            for bad in INVALID:
                before = env.level
                step = env.step(bad)
                assert env.level == before and step.reward == pytest.approx(cost, abs=1e-12) and not step.done
                assert step.info["invalid_action"] and not step.info["moved"] and not step.info["pushed"]
                assert step.observation == (f"Invalid action '{bad}'; the valid actions are up, down, left, right.\n"
                                            f"{render(before)}")
            assert not env.step(action).info["invalid_action"]
        assert env.level.solved


@pytest.mark.parametrize("name", ["frozenlake", "sokoban", "thin_ice", "sokoban_visual", "ezpoints"])
def test_an_invalid_action_anchors_on_the_state_it_left(env_factory, name):
    """GiGPO groups rows by anchor state: the reset and two invalid actions leave one state, so one key, whatever
    text the invalid action's note quotes (the notes made three singleton groups, each with step advantage 0)."""
    from tether.rollout.multi_turn import Episode, state_key

    env = env_factory(name)
    reset = env.reset(0)
    ep = Episode(env, "", 0, 0, 0, reset.observation, None, seen=[reset.observation], infos=[reset.info])
    for bad in ("foo", "bar"):
        step = env.step(bad)
        assert step.info["invalid_action"] and observation_key(step.observation) != observation_key(reset.observation)
        ep.seen.append(step.observation)
        ep.infos.append(step.info)
    assert [state_key(ep, turn) for turn in range(3)] == [observation_key(reset.observation)] * 3
