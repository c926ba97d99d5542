"""GiGPO against a float64 re-derivation of verl-agent's formulas (``gigpo/core_gigpo.py``), at the settings where
tether's defaults are verl-agent's GiGPO runs: gamma 0.95, invalid-action penalty 0.1, step weight 1.0, eps 1e-6,
``mean_std_norm`` (ALFWorld) or ``mean_norm`` (WebShop).

The batch is built by the agent loop's own ``to_batch`` from hand-made episodes, so the anchors, the step returns
and the penalty are tether's, not the test's."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from types import SimpleNamespace

import pytest
import torch

from tether.advantage_inputs import advantage_inputs
from tether.algos import AdvantageInputs, gigpo
from tether.config.sections import EnvConfig
from tether.envs import STATE_KEY
from tether.rollout.batch import RolloutBatch
from tether.rollout.multi_turn import AgentCollector, Episode

GAMMA, PENALTY, EPS = 0.95, 0.1, 1e-6

# Two task groups of three episodes; each turn is (observation acted on, env reward, valid, the env's state key or
# None). Both groups start from the text "s0" (verl-agent groups anchors within a uid only). Episode 1 repeats "s1"
# after an invalid action; episode 4's invalid action adds a note to the state, whose key is "s1"; episode 2's
# last turn and episode 5 are alone in their step groups.
EPISODES = {
    0: [[("s0", 0.0, True, None), ("s1", 0.0, True, None), ("s2", 1.0, True, None)],
        [("s0", 0.0, True, None), ("s1", 0.0, False, None), ("s1", 0.5, True, None), ("s2", 0.0, True, None)],
        [("s0", 0.0, True, None), ("s4", 0.0, True, None)]],
    1: [[("s0", 0.2, True, None), ("s1", 1.0, True, None)],
        [("s0", 0.0, True, None), ("s1", 0.0, False, None), ("Invalid action; s1", 0.3, True, "s1")],
        [("s9", 0.0, False, None)]],
}


def verl_agent_reference(mode: str) -> list[float]:
    """verl-agent's GiGPO advantage of each row (turn), in tether's row order, re-derived in float64:

    * token-level score: the episode's summed env reward, minus the penalty on an invalid turn
      (``apply_invalid_action_penalty``);
    * episode term (``episode_norm_reward``, ``compute_mean_std_cross_steps=True``): over every row of the uid, a
      uid of one row taking mean 0 and std 1;
    * step return (``compute_step_discounted_returns``): ``G_t = r_t + gamma G_{t+1}`` over the env rewards;
    * step term (``build_step_group``, ``step_norm_reward``): over the rows of one uid with equal anchor, a group of
      one taking its own return as mean and std 1;
    * both ``(x - mean) / (unbiased std + eps)``, or ``x - mean`` in ``mean_norm``; summed with weight 1.
    """
    rows = []  # (turn, uid, anchor, score, step return); the anchor is the env's state key where it gives one
    for uid, episodes in EPISODES.items():
        for turns in episodes:
            total = sum(reward for _, reward, _, _ in turns)
            returns, running = [], 0.0
            for _, reward, _, _ in reversed(turns):
                running = reward + GAMMA * running
                returns.insert(0, running)
            for t, (obs, _, valid, key) in enumerate(turns):
                rows.append((t, uid, key or obs, total - PENALTY * (not valid), returns[t]))
    rows.sort(key=lambda row: row[0])  # stable: turn 0 of every episode, then turn 1, ... (the agent loop's order)

    def normalised(values: list[float], single_mean: float) -> list[float]:
        mean = statistics.fmean(values) if len(values) > 1 else single_mean
        std = statistics.stdev(values) if len(values) > 1 else 1.0
        return [v - mean if mode == "mean_norm" else (v - mean) / (std + EPS) for v in values]

    def by_group(key: Callable, value: Callable, single_mean: Callable) -> list[float]:
        out = [0.0] * len(rows)
        for group in {key(row) for row in rows}:
            members = [i for i, row in enumerate(rows) if key(row) == group]
            values = [value(rows[i]) for i in members]
            for i, adv in zip(members, normalised(values, single_mean(values)), strict=True):
                out[i] = adv
        return out

    episode = by_group(lambda row: row[1], lambda row: row[3], lambda values: 0.0)
    step = by_group(lambda row: (row[1], row[2]), lambda row: row[4], lambda values: values[0])
    return [e + s for e, s in zip(episode, step, strict=True)]


def collected_batch() -> RolloutBatch:
    """The batch the agent loop makes of :data:`EPISODES` (tether's default env settings)."""
    episodes, rows = [], []
    for uid, group in EPISODES.items():
        for turns in group:
            ep = Episode(env=None, task=f"task {uid}", group_id=uid, episode_id=len(episodes), seed=uid,
                         observation=turns[0][0], admissible=None)
            for t, (obs, reward, valid, key) in enumerate(turns):
                ep.seen.append(obs)
                ep.infos.append({STATE_KEY: key} if key else {})
                ep.turns.append({"observation": obs, "response": "a", "action": "a", "valid": valid, "reward": reward})
                ep.ret += reward
                rows.append({"episode": ep, "turn": t, "prompt_ids": [1], "response_ids": torch.tensor([2]),
                             "sample_log_probs": torch.tensor([-0.5]), "token": {}, "valid": valid, "text": "a",
                             "truncated": False})
            episodes.append(ep)
    rows.sort(key=lambda row: row["turn"])  # the agent loop's order: turn by turn
    return AgentCollector.to_batch(SimpleNamespace(env_cfg=EnvConfig(name="frozen_lake")), rows)


@pytest.mark.parametrize("mode", ["mean_std_norm", "mean_norm"])
def test_gigpo_equals_verl_agents_formulas(mode: str) -> None:
    assert (EnvConfig(name="frozen_lake").step_gamma, EnvConfig(name="frozen_lake").invalid_action_penalty) == \
        (GAMMA, PENALTY)
    expected = torch.tensor(verl_agent_reference(mode), dtype=torch.float64)
    batch = collected_batch()
    inputs = advantage_inputs(batch)
    # in float64: the collector's tags (its step returns are Python floats), its rewards recomputed in float64
    rewards = [ep.ret - PENALTY * (not valid) for ep, valid in zip(batch.info["episode"], batch.info["valid"],
                                                                     strict=True)]
    torch.testing.assert_close(batch.rewards.double(), torch.tensor(rewards, dtype=torch.float64))
    wide = AdvantageInputs(torch.tensor(rewards, dtype=torch.float64), batch.group_ids, obs_keys=inputs.obs_keys,
                           step_returns=torch.tensor(batch.info["step_return"], dtype=torch.float64))
    torch.testing.assert_close(gigpo(wide, mode=mode).advantages, expected, rtol=1e-12, atol=1e-12)
    # as the trainer runs it: float32 rewards and step returns
    torch.testing.assert_close(gigpo(inputs, mode=mode).advantages.double(), expected, rtol=1e-5, atol=1e-5)
    assert inputs.obs_keys.count("s1") == 6  # episode 4's noted state joined the "s1" anchor of its own group
