"""The advantage metrics, pinned to hand values: ``train/advantage_abs_mean`` (the trainer's, tether/trainer/step.py)
and GiGPO's ``train/step_adv_abs_mean`` (tether/algos/advantages.py).

No model: the trainer's advantage phase runs on a stand-in that carries only what it reads (the estimator, the
config's kwargs, an empty method set).
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from tether import algos
from tether.algos import AdvantageInputs
from tether.methods.hooks import MethodSet
from tether.rollout.batch import RolloutBatch
from tether.trainer.step import StepPhases


def advantage_phase(estimator: str, **kwargs) -> SimpleNamespace:
    """What ``StepPhases.compute_advantages`` reads of the trainer."""
    return SimpleNamespace(advantage_fn=algos.get_advantage(estimator),
                           cfg=SimpleNamespace(algorithm=SimpleNamespace(advantage_kwargs=kwargs)),
                           methods=MethodSet([]), hook_context=lambda: None)


def batch_of(rewards: list[float], groups: list[int], mask: list[list[int]]) -> RolloutBatch:
    n, width = len(mask), len(mask[0])
    return RolloutBatch(prompt_ids=[[1, 2]] * n, response_ids=torch.zeros(n, width, dtype=torch.long),
                        response_mask=torch.tensor(mask, dtype=torch.float32),
                        sample_log_probs=torch.full((n, width), -1.0), group_ids=torch.tensor(groups),
                        rewards=torch.tensor(rewards), correct=torch.zeros(n, dtype=torch.bool),
                        source=torch.zeros(n, dtype=torch.long))


def test_advantage_abs_mean_is_the_token_weighted_mean_over_response_tokens():
    # dr_grpo (R - group mean): group 0 rewards 1, 0 -> +-0.5; group 1 rewards 3, 1 -> +-1. Rows of 1, 3, 2, 4 tokens
    batch = batch_of([1.0, 0.0, 3.0, 1.0], [0, 0, 1, 1],
                     [[1, 0, 0, 0], [1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1]])
    metrics = StepPhases.compute_advantages(advantage_phase("dr_grpo"), batch)
    # (0.5*1 + 0.5*3 + 1*2 + 1*4) / 10 = 0.8; a mean over rows gives 0.75, over all 16 positions 0.5
    assert metrics["train/advantage_abs_mean"] == pytest.approx(0.8, rel=1e-6)
    torch.testing.assert_close(batch.token["advantages"][:, 0], torch.tensor([0.5, -0.5, 1.0, -1.0]))


def test_advantage_abs_mean_follows_the_estimator_in_use():
    # grpo: (R - mean) / (std + eps) with the unbiased std; group 0 rewards 1, 0, 0 (mean 1/3, std sqrt(1/3)),
    # group 1 rewards 2, 4 (mean 3, std sqrt(2)); rows of 2, 1, 3, 1, 2 tokens
    rewards, groups = [1.0, 0.0, 0.0, 2.0, 4.0], [0, 0, 0, 1, 1]
    lengths = [2, 1, 3, 1, 2]
    batch = batch_of(rewards, groups, [[1] * k + [0] * (3 - k) for k in lengths])
    metrics = StepPhases.compute_advantages(advantage_phase("grpo", eps=1e-6), batch)
    expected_rows = []
    for r, g in zip(rewards, groups, strict=True):
        members = [x for x, h in zip(rewards, groups, strict=True) if h == g]
        mean = sum(members) / len(members)
        std = math.sqrt(sum((x - mean) ** 2 for x in members) / (len(members) - 1))
        expected_rows.append(abs(r - mean) / (std + 1e-6))
    expected = sum(a * k for a, k in zip(expected_rows, lengths, strict=True)) / sum(lengths)
    assert metrics["train/advantage_abs_mean"] == pytest.approx(expected, rel=1e-6)
    assert sum(expected_rows) / len(expected_rows) != pytest.approx(expected, rel=1e-3)  # rows vs tokens differ


def gigpo_inputs() -> AdvantageInputs:
    # task group 0: three rows see observation "a" (step returns 1, 0, 0.5), one sees "b" (a singleton);
    # task group 1: two rows see "a" too (returns 2, 0) -- a step group of their own, not merged with group 0's "a"
    return AdvantageInputs(rewards=torch.tensor([1.0, 0.0, 0.0, 1.0, 2.0, 0.0]),
                           group_ids=torch.tensor([0, 0, 0, 0, 1, 1]),
                           step_returns=torch.tensor([1.0, 0.0, 0.5, 0.25, 2.0, 0.0]),
                           obs_keys=["a", "a", "a", "b", "a", "a"])


def test_step_adv_abs_mean_is_the_unweighted_step_term_over_rows():
    out = algos.get_advantage("gigpo")(gigpo_inputs(), mode="mean_norm", step_weight=0.5)
    # mean_norm step advantages: group 0 "a" (mean 0.5) 0.5, -0.5, 0; "b" alone 0; group 1 "a" (mean 1) 1, -1.
    # |.| mean over the 6 rows: 3/6 = 0.5. Weighted by step_weight it would be 0.25, over the rows with a non-zero
    # term 3/4, over the 3 step groups' mean |.| (1/3 + 0 + 1)/3; merging the two task groups' "a" rows (mean 0.7)
    # gives (0.3 + 0.7 + 0.2 + 1.3 + 0.7)/6 = 0.533
    assert out.metrics["train/step_adv_abs_mean"].item() == pytest.approx(0.5, rel=1e-6)
    assert out.metrics["train/step_group_size"].item() == pytest.approx((3 * 3 + 1 + 2 * 2) / 6, rel=1e-6)
    assert out.metrics["train/step_group_singleton_frac"].item() == pytest.approx(1 / 6, rel=1e-6)
    # the advantage itself is the episode term plus 0.5 times that step term (the metric is of the step term alone)
    episode = algos.get_advantage("episode")(gigpo_inputs(), mode="mean_norm").advantages
    step = torch.tensor([0.5, -0.5, 0.0, 0.0, 1.0, -1.0])
    torch.testing.assert_close(out.advantages, episode + 0.5 * step)


def test_step_adv_abs_mean_with_std_normalisation():
    out = algos.get_advantage("gigpo")(gigpo_inputs(), eps=1e-6)
    # mean_std_norm: group 0 "a" returns 1, 0, 0.5 (mean 0.5, unbiased std 0.5) -> 0.5/(0.5+eps), -..., 0;
    # group 1 "a" returns 2, 0 (mean 1, std sqrt(2)) -> +-1/(sqrt(2)+eps); "b" -> 0
    a, b = 0.5 / (0.5 + 1e-6), 1 / (math.sqrt(2) + 1e-6)
    assert out.metrics["train/step_adv_abs_mean"].item() == pytest.approx((2 * a + 2 * b) / 6, rel=1e-6)
