"""Every shipped agent config validates, and its env builds with its kwargs."""

from __future__ import annotations

from pathlib import Path

import pytest

from tether.config import load_command_config, load_config
from tether.envs import check_env_kwargs

AGENTS = Path(__file__).parents[2] / "configs" / "agents"
CONFIGS = sorted(p for p in AGENTS.glob("*.yaml") if not p.stem.endswith("_sft"))
WARM_STARTS = sorted(AGENTS.glob("*_sft.yaml"))


def test_there_are_agent_configs():
    assert {p.stem for p in CONFIGS} >= {"sokoban_grpo", "frozenlake_grpo", "textworld_grpo"}
    assert {p.stem for p in WARM_STARTS} == {"sokoban_sft", "frozenlake_sft"}


@pytest.mark.parametrize("path", WARM_STARTS, ids=[p.stem for p in WARM_STARTS])
def test_a_warm_start_plays_the_env_of_its_grpo_config(path):
    """tether sft reads a config of its own; its env section is the GRPO config's, so it trains on RL's prompts."""
    cfg = load_command_config("sft", path)
    assert cfg.sft.data == "solver" and path.read_text().startswith(f"# tether sft configs/agents/{path.name}\n")
    assert cfg.env == load_config(path.with_name(path.name.replace("_sft", "_grpo"))).env


@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_agent_config_validates(path):
    cfg = load_config(path)
    assert cfg.env is not None and cfg.task is None
    check_env_kwargs(cfg.env.name, cfg.env.kwargs)
    assert cfg.algorithm.advantage == "episode" and cfg.rollout.stop == ["</action>"]
    assert cfg.train.best_metric == "val/success_rate"
    assert path.read_text().startswith(f"# tether train configs/agents/{path.name}")
