"""The agent loop's rewards when the env rewards every turn, not only the last: each row carries the episode's whole
return (the sum of all its env rewards) minus the invalid-action penalty, a step return discounted by env.step_gamma
from its own turn on, and the hazard metrics read the flags of each episode's last step.

:class:`~tests.rollout.helpers.PlanEnv` rewards a win 1.0, a wrong guess -0.5 and an invalid word -0.25; the
scripted engine plays win / invalid-then-win / three wrong guesses, so every number below is written by hand.
"""

from __future__ import annotations

import pytest

from tests.rollout.helpers import agent_config

PLAN_ENV = {"name": "tests.rollout.helpers:PlanEnv"}
# rows in collection order: turn 1 of episodes 0-5, turn 2 of 1, 2, 4, 5, turn 3 of 2, 5 (kinds win, invalid, wrong)
EPISODE_IDS = [0, 1, 2, 3, 4, 5, 1, 2, 4, 5, 2, 5]
# episode env rewards: win [1], invalid-then-win [-0.25, 1], wrong [-0.5, -0.5, -0.5]
RETURNS = {"win": 1.0, "invalid": 0.75, "wrong": -1.5}
KINDS = ["win", "invalid", "wrong"] * 2


def test_every_row_carries_the_whole_episode_return_minus_the_penalty(tmp_path, agent_trainer):
    trainer = agent_trainer(agent_config(tmp_path, "env.invalid_action_penalty=0.1", env=PLAN_ENV))
    batch, metrics = trainer.collect()
    assert batch.info["episode_id"] == EPISODE_IDS
    assert [e.ret for e in batch.info["episode"][:6]] == [RETURNS[k] for k in KINDS]
    # the invalid turn-1 rows (episodes 1 and 4) lose 0.1; every other row has its episode's return
    assert batch.rewards.tolist() == pytest.approx(
        [1.0, 0.65, -1.5, 1.0, 0.65, -1.5, 0.75, -1.5, 0.75, -1.5, -1.5, -1.5], abs=1e-6)
    assert metrics["env/episode_return"] == pytest.approx((1.0 + 0.75 - 1.5) / 3, abs=1e-9)


def test_step_returns_discount_the_env_rewards_from_each_turn_on(tmp_path, agent_trainer):
    trainer = agent_trainer(agent_config(tmp_path, "env.step_gamma=0.5", env=PLAN_ENV))
    batch, _ = trainer.collect()
    # G_t = sum_k 0.5**k r_(t+k), no penalty: win 1; invalid -0.25 + 0.5 * 1 = 0.25, then 1;
    # wrong -0.5 - 0.25 - 0.125 = -0.875, then -0.5 - 0.25 = -0.75, then -0.5
    assert batch.info["step_return"] == pytest.approx(
        [1.0, 0.25, -0.875, 1.0, 0.25, -0.875, 1.0, -0.75, 1.0, -0.75, -0.5, -0.5], abs=1e-9)


def test_hazard_deaths_count_the_flags_of_each_episodes_last_step(tmp_path, agent_trainer):
    trainer = agent_trainer(agent_config(tmp_path, env=PLAN_ENV))
    _, metrics = trainer.collect()
    # the wrong episodes end on a flagged step; the invalid ones were flagged on turn 1 only, then won
    assert metrics["env/hazard_death_frac"] == pytest.approx(2 / 6, abs=1e-9)
    assert metrics["env/fell_in_pit_frac"] == pytest.approx(2 / 6, abs=1e-9)
    assert metrics["env/success_rate"] == pytest.approx(4 / 6, abs=1e-9)
