"""Every collector samples as one function says (tether.engine.base.sampling_params): training as ``rollout`` says,
validation as ``val`` says, whether the workload is a task or an environment."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from tests.rollout.helpers import agent_config, seed_sft_config
from tests.trainer.helpers import tiny_config
from tether.engine.base import SamplingParams, sampling_params
from tether.recipes.seed_sft import rollout_episodes
from tether.rewards.task import build_config_task
from tether.rollout.base import NoHooks
from tether.rollout.multi_turn import AgentCollector
from tether.rollout.single_turn import SingleTurnCollector
from tether.seeding import StepSeeds

ROLLOUT = {"max_new_tokens": 12, "temperature": 0.7, "top_p": 0.9, "top_k": 20, "stop": ["</answer>"]}
VAL = {"temperature": 0.5, "top_p": 0.8, "greedy": False, "max_prompts": 1}
TRAIN_PARAMS = SamplingParams(max_new_tokens=12, temperature=0.7, top_p=0.9, top_k=20, stop=("</answer>",))
# val's temperature and top-p, no top-k (val has none), rollout's budget and stop strings
VAL_PARAMS = SamplingParams(max_new_tokens=12, temperature=0.5, top_p=0.8, top_k=0, stop=("</answer>",))


class Stop(Exception):
    """Raised by :class:`Recorder` once it has what the test reads."""


class Recorder:
    """An engine that records the sampling it is asked for, then stops the collector."""

    def __init__(self) -> None:
        self.params: list[SamplingParams] = []

    def generate(self, prompt_ids: list[list[int]], params: SamplingParams, *, seed: int | None = None,
                 intervention: Any = None) -> None:
        self.params.append(params)
        raise Stop


def asked_for(call: Any) -> SamplingParams:
    """The sampling the first engine call of ``call(engine)`` asked for."""
    engine = Recorder()
    with pytest.raises(Stop):
        call(engine)
    return engine.params[0]


def test_sampling_params_of_training_and_of_validation(tmp_path):
    cfg = tiny_config(tmp_path, rollout={**ROLLOUT, "ignore_eos": True}, val={**VAL, "greedy": True})
    assert sampling_params(cfg.rollout) == SamplingParams(max_new_tokens=12, temperature=0.7, top_p=0.9, top_k=20,
                                                          stop=("</answer>",), ignore_eos=True)
    # validation is unchanged by ignore_eos, and greedy is val's
    assert sampling_params(cfg.rollout, cfg.val) == SamplingParams(max_new_tokens=12, temperature=0.5, top_p=0.8,
                                                                   greedy=True, stop=("</answer>",))


def test_single_turn_and_agent_training_and_validation_sample_alike(tmp_path, tiny_policy):
    _, tokenizer = tiny_policy
    task_cfg = tiny_config(tmp_path, rollout=ROLLOUT, val=VAL)
    single = SingleTurnCollector(build_config_task(task_cfg), tokenizer, task_cfg)
    agent = AgentCollector(agent_config(tmp_path, rollout=ROLLOUT, val=VAL), tokenizer)
    assert asked_for(lambda engine: single.collect(engine, StepSeeds(0, 0), NoHooks())) == TRAIN_PARAMS
    assert asked_for(lambda engine: agent.collect(engine, StepSeeds(0, 0), NoHooks())) == TRAIN_PARAMS
    assert asked_for(lambda engine: single.validate(engine, seed=0)) == VAL_PARAMS
    assert asked_for(lambda engine: agent.validate(engine, seed=0)) == VAL_PARAMS


@pytest.mark.parametrize("temperature, expected", [(None, 0.7), (0.3, 0.3)])
def test_seed_sft_rollouts_sample_as_rollout_says_at_stage_ones_temperature(tmp_path, tiny_policy, temperature,
                                                                            expected):
    _, tokenizer = tiny_policy
    cfg = seed_sft_config(tmp_path, rollout=ROLLOUT, sft={"temperature": temperature, "tasks": 1})
    params = asked_for(lambda engine: rollout_episodes(cfg.rl_config(), None, tokenizer, cfg.sft, engine=engine))
    assert params == dataclasses.replace(TRAIN_PARAMS, temperature=expected)
