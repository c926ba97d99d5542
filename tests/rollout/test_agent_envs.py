"""A short training run (one RL step, tiny random model) on every registered environment.

The tiny model writes no ``<action>`` tags, so every action is invalid and every reward equal; an
entropy bonus makes the update non-zero, so the test still sees the parameters move. ALFWorld and
WebShop need data that cannot be downloaded here, so they skip with that reason.
"""

from __future__ import annotations

import math

import pytest
import torch

from tests.rollout.helpers import agent_config
from tether.envs import ENVS, EnvUnavailableError, make_env

ENV_KWARGS = {
    "scripted": {"turns": 3},
    "sokoban": {"max_solution_steps": 4},
    # the tiny text model trains on the visual envs' text fallback (tests/rollout/test_visual_agents.py: images)
    "sokoban_visual": {"max_solution_steps": 4, "observation": "text"},
    "ezpoints": {"observation": "text"},
    "frozenlake": {"size": 4, "is_slippery": False},
    "textworld": {"preset": "easy"},
}
OPTIONAL_PACKAGES = {"frozenlake": "gymnasium", "textworld": "textworld"}
SKIP_REASONS = {
    "alfworld": "ALFWorld data cannot be downloaded on this machine",
    "webshop": "WebShop data and search indexes cannot be downloaded on this machine",
}


@pytest.mark.parametrize("name", sorted(ENVS))
def test_one_training_step_on_each_env(name, tmp_path, agent_trainer, tw_cache):
    kwargs = dict(ENV_KWARGS.get(name, {}))
    if name == "textworld":
        kwargs["cache_dir"] = str(tw_cache)
    if name in OPTIONAL_PACKAGES:
        pytest.importorskip(OPTIONAL_PACKAGES[name])
    try:
        make_env(name, **kwargs).close()
    except EnvUnavailableError as e:
        pytest.skip(f"{SKIP_REASONS.get(name, name + ' unavailable')}: {e}")
    cfg = agent_config(tmp_path, "rollout.prompts_per_step=1", "rollout.group_size=2", "rollout.max_new_tokens=6",
                       "algorithm.entropy_coef=0.01", "env.max_turns=2", "env.reset_timeout_s=120",
                       env={"name": name, "kwargs": kwargs})
    trainer = agent_trainer(cfg, scripted=False)
    before = torch.cat([p.detach().flatten() for p in trainer.policy.parameters()]).clone()
    metrics = trainer.train_step()
    after = torch.cat([p.detach().flatten() for p in trainer.policy.parameters()])
    assert not torch.equal(before, after)
    assert metrics["env/faults"] == 0.0
    assert metrics["train/rows"] == 2 * metrics["env/turns"]  # one row per active turn of 2 episodes
    assert metrics["env/turns"] >= 1.0 and metrics["env/turns"] <= 2.0
    assert all(math.isfinite(metrics[k]) for k in ("actor/pg_loss", "actor/entropy", "env/episode_return"))
    assert (tmp_path / "run" / "transcripts.jsonl").is_file()
