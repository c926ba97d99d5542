"""Advantage estimators: hand-computed values, loop references, groups of one."""

from __future__ import annotations

import math

import pytest
import torch

from tether.algos import (
    AdvantageInputs,
    clean_baseline,
    dr_grpo,
    episode,
    get_advantage,
    gigpo,
    grpo,
    qae,
    rloo,
    step_advantages,
)

EPS = 1e-6


def adv(fn, rewards: torch.Tensor, group_ids: torch.Tensor, **hparams) -> torch.Tensor:
    """The advantages of an estimator that needs no tag."""
    return fn(AdvantageInputs(rewards, group_ids), **hparams).advantages


def test_hand_computed_values():
    r = torch.tensor([1.0, 2.0, 3.0, 5.0, 5.0], dtype=torch.float64)
    g = torch.tensor([0, 0, 0, 1, 1])
    # Group 0: mean 2, unbiased std 1. Group 1: equal rewards, std 0.
    torch.testing.assert_close(adv(grpo, r, g), torch.tensor([-1, 0, 1, 0, 0], dtype=torch.float64) / (1 + EPS))
    torch.testing.assert_close(adv(dr_grpo, r, g), torch.tensor([-1.0, 0, 1, 0, 0], dtype=torch.float64))
    # Leave-one-out baselines of group 0: 2.5, 2, 1.5.
    torch.testing.assert_close(adv(rloo, r, g), torch.tensor([-1.5, 0, 1.5, 0, 0], dtype=torch.float64))


def test_qae_hand_computed():
    r = torch.tensor([0.0, 1.0, 0.0, 1.0, 1.0], dtype=torch.float64)
    g = torch.zeros(5, dtype=torch.long)
    # Sorted 0,0,1,1,1: position 0.45 * 4 = 1.8 -> 0 + 0.8 * (1 - 0) = 0.8.
    # Mean 0.6, unbiased var (2 * 0.36 + 3 * 0.16) / 4 = 0.3.
    expected = (r - 0.8) / (0.3**0.5 + EPS)
    torch.testing.assert_close(adv(qae, r, g), expected)
    torch.testing.assert_close(adv(qae, r, g, quantile=0.5), (r - 1.0) / (0.3**0.5 + EPS))  # median is 1


def test_episode_hand_computed():
    # Rows are steps; group 7 has 4 step rows from 2 trajectories (returns 1 and 0), group 9 one row.
    s = torch.tensor([1.0, 1.0, 1.0, 0.0, 4.0], dtype=torch.float64)
    g = torch.tensor([7, 7, 7, 7, 9])
    # Over the 4 step rows: mean 0.75, unbiased std 0.5 (not over the 2 trajectories).
    std_norm = adv(episode, s, g)
    torch.testing.assert_close(std_norm[:4], (s[:4] - 0.75) / (0.5 + EPS))
    torch.testing.assert_close(adv(episode, s, g, mode="mean_norm")[:4], s[:4] - 0.75)
    # One row: mean 0, std 1, as in verl-agent's episode_norm_reward, not 0.
    torch.testing.assert_close(std_norm[4], torch.tensor(4.0 / (1 + EPS), dtype=torch.float64))
    assert adv(episode, s, g, mode="mean_norm")[4] == 4.0
    with pytest.raises(ValueError, match="mean_std_norm"):
        adv(episode, s, g, mode="std")


def test_step_advantages_by_hand():
    # group 0: rows 0,1,2 act on "A" (returns 1, 0, 0.5), row 3 on "B" alone; group 1: row 4 on "A" alone
    returns = torch.tensor([1.0, 0.0, 0.5, 0.7, 0.3])
    groups = torch.tensor([0, 0, 0, 0, 1])
    keys = ["A", "A", "A", "B", "A"]
    step, sizes = step_advantages(returns, groups, keys)
    # mean 0.5, unbiased std 0.5 -> (1, -1, 0); singletons get 0
    torch.testing.assert_close(step, torch.tensor([1.0, -1.0, 0.0, 0.0, 0.0]), atol=1e-5, rtol=0)
    assert sizes.tolist() == [3, 3, 3, 1, 1]
    step, _ = step_advantages(returns, groups, keys, mode="mean_norm")
    torch.testing.assert_close(step, torch.tensor([0.5, -0.5, 0.0, 0.0, 0.0]))
    with pytest.raises(ValueError, match="mode"):
        step_advantages(returns, groups, keys, mode="rank")


def test_gigpo_is_the_episode_advantage_plus_the_weighted_step_term():
    # one task group of 4 step rows: episode returns 1, 1, 0, 0; rows 0 and 2 act on "A", rows 1 and 3 on "B"
    rewards = torch.tensor([1.0, 1.0, 0.0, 0.0], dtype=torch.float64)
    returns = torch.tensor([0.5, 1.0, 0.0, 0.0], dtype=torch.float64)
    inputs = AdvantageInputs(rewards, torch.zeros(4, dtype=torch.long), step_returns=returns,
                             obs_keys=["A", "B", "A", "B"])
    out = gigpo(inputs, step_weight=0.5, eps=0.0)
    # episode: mean 0.5, unbiased std sqrt(1/3); step groups {0, 2}: returns 0.5, 0 -> +-0.25 / sqrt(1/8),
    # {1, 3}: returns 1, 0 -> +-0.5 / sqrt(1/2)
    episode_term = (rewards - 0.5) / math.sqrt(1 / 3)
    step_term = torch.tensor([0.25 / math.sqrt(1 / 8), 0.5 / math.sqrt(1 / 2), -0.25 / math.sqrt(1 / 8),
                              -0.5 / math.sqrt(1 / 2)], dtype=torch.float64)
    torch.testing.assert_close(out.advantages, episode_term + 0.5 * step_term)
    assert out.metrics["train/step_group_size"] == 2 and out.metrics["train/step_group_singleton_frac"] == 0
    torch.testing.assert_close(gigpo(inputs, step_weight=0.0).advantages, adv(episode, rewards, inputs.group_ids))
    with pytest.raises(ValueError, match=r"needs AdvantageInputs\.step_returns"):
        gigpo(AdvantageInputs(rewards, inputs.group_ids))


def test_clean_baseline_hand_values():
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0,   0.0, 0.0, 0.0, 1.0,   1.0, 0.0,   5.0])
    groups = torch.tensor([0, 0, 0, 0,            1, 1, 1, 1,           2, 2,       3])
    injected = torch.tensor([False, False, False, True,  False, False, False, True,  True, True,  False])
    out = clean_baseline(AdvantageInputs(rewards, groups, injected=injected), eps=0.0)
    # group 0: clean rewards [1, 0, 0]: mean 1/3, std sqrt(1/3); the injected success uses the same baseline
    mean, std = 1 / 3, math.sqrt(1 / 3)
    torch.testing.assert_close(out.advantages[:4], (rewards[:4] - mean) / std)
    # group 1: clean rewards all 0 (std 0) -> the whole group's std (0.5) scales; baseline stays 0
    torch.testing.assert_close(out.advantages[4:8], torch.tensor([0.0, 0.0, 0.0, 2.0]))
    # group 2: no clean rollout -> plain GRPO over the group; group 3: a group of one -> 0
    torch.testing.assert_close(out.advantages[8:], torch.tensor([0.5 / math.sqrt(0.5), -0.5 / math.sqrt(0.5), 0.0]))
    assert out.metrics["eapo/clean_baseline_frac"] == pytest.approx(8 / 11)  # groups 0 and 1 have clean rows
    dr = clean_baseline(AdvantageInputs(rewards, groups, injected=injected), scale=False).advantages
    torch.testing.assert_close(dr[:4], rewards[:4] - mean)
    # without any injection it is GRPO exactly
    none = AdvantageInputs(rewards, groups, injected=torch.zeros_like(injected))
    torch.testing.assert_close(clean_baseline(none).advantages, adv(grpo, rewards, groups))


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo", "qae"])
def test_group_of_one_gets_zero(name):
    fn = get_advantage(name)
    out = adv(fn, torch.tensor([3.0, 1.0, 2.0]), torch.tensor([0, 1, 1]))
    assert out[0] == 0.0 and torch.isfinite(out).all()
    assert adv(fn, torch.tensor([2.5]), torch.tensor([4]))[0] == 0.0


@pytest.mark.parametrize("size", [6, 8, 48])
@pytest.mark.parametrize("value", [1.2, 0.7, 0.2, -0.1])
@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo", "qae", "episode", "episode_mean_norm", "gigpo",
                                  "clean_baseline"])
def test_equal_rewards_get_exactly_zero(name, value, size):
    # float32 rewards that binary fractions cannot hold: summed in float32, the mean of eight 1.2s is one ulp off
    # and the std 1.3e-7, so (R - mean) / (std + 1e-6) gave +0.106 (48 rows of 1.2: -0.32) where it must be 0
    rewards = torch.full((size,), value)
    groups = torch.zeros(size, dtype=torch.long)
    inputs = AdvantageInputs(rewards, groups, injected=torch.arange(size) % 3 == 0,
                             step_returns=torch.full((size,), value), obs_keys=["same"] * size)
    if name == "episode_mean_norm":
        out = episode(inputs, mode="mean_norm").advantages
    else:
        out = get_advantage(name)(inputs).advantages
    assert out.dtype == torch.float32 and (out == 0).all(), out


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo", "qae", "episode", "episode_mean_norm"])
def test_float32_rewards_match_the_float64_loop(name, seed):
    # fractional float32 rewards (a format bonus of 0.2, a penalty of 0.1), some groups equal: the estimators
    # agree with the float64 loop to float32's rounding of the result, with no error scaled up by 1/eps
    g = torch.Generator().manual_seed(seed)
    group_ids = torch.arange(16).repeat_interleave(8)
    rewards = (torch.randint(0, 3, (128,), generator=g) * 0.5 + 0.2).float()
    rewards[:40] = 1.2  # five groups of equal rewards
    kwargs = {"mode": "mean_norm"} if name == "episode_mean_norm" else {}
    fn = episode if name.startswith("episode") else get_advantage(name)
    out = adv(fn, rewards, group_ids, **kwargs)
    torch.testing.assert_close(out, _loop_reference(name, rewards.double(), group_ids).float(), rtol=1e-6,
                               atol=1e-6)
    assert (out[:40] == 0).all()


def test_clean_baseline_with_equal_clean_fractional_rewards():
    # clean rewards all 1.2 (float32): their std is 0, not a rounding error, so the whole group's std scales
    rewards = torch.tensor([1.2, 1.2, 1.2, 2.2])
    injected = torch.tensor([False, False, False, True])
    out = clean_baseline(AdvantageInputs(rewards, torch.zeros(4, dtype=torch.long), injected=injected)).advantages
    r = rewards.double()
    expected = (r - r[:3].mean()) / (r.std() + EPS)  # 0, 0, 0 and 1 / std of the whole group
    torch.testing.assert_close(out, expected.float())
    assert (out[:3] == 0).all() and 1.5 < out[3] < 2.5


def _loop_reference(name: str, rewards: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """Straightforward per-group loop, as verl writes it."""
    out = torch.zeros_like(rewards)
    for gid in group_ids.unique():
        idx = (group_ids == gid).nonzero().squeeze(-1)
        r = rewards[idx]
        n = len(r)
        if n == 1:
            out[idx] = {"episode": r / (1 + EPS), "episode_mean_norm": r}.get(name, torch.zeros_like(r))
            continue
        mean, std = r.mean(), r.std()
        out[idx] = {
            "grpo": (r - mean) / (std + EPS),
            "dr_grpo": r - mean,
            "rloo": r - (r.sum() - r) / (n - 1),
            "qae": (r - torch.quantile(r, 0.45)) / (std + EPS),
            "episode": (r - mean) / (std + EPS),
            "episode_mean_norm": r - mean,
        }[name]
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo", "qae", "episode", "episode_mean_norm"])
def test_vectorised_equals_loop(name, seed):
    g = torch.Generator().manual_seed(seed)
    n = 64
    group_ids = torch.randint(0, 12, (n,), generator=g) * 3 - 5  # includes negative, sparse ids
    rewards = torch.randn(n, generator=g, dtype=torch.float64)
    rewards[: n // 2] = rewards[: n // 2].round()  # ties, as with binary rewards
    group_ids[-1] = 999  # a group of one
    if name == "episode_mean_norm":
        out = adv(episode, rewards, group_ids, mode="mean_norm")
    else:
        out = adv(get_advantage(name), rewards, group_ids)
    torch.testing.assert_close(out, _loop_reference(name, rewards, group_ids))


def test_integer_rewards_are_refused():
    with pytest.raises(TypeError, match="float"):
        adv(grpo, torch.tensor([1, 0]), torch.tensor([0, 0]))


def test_qae_quantile_range():
    with pytest.raises(ValueError, match="quantile"):
        adv(qae, torch.tensor([1.0, 0.0]), torch.tensor([0, 0]), quantile=1.5)


def test_clean_baseline_keeps_a_nan_as_grpo_does():
    # the equal-rewards shortcut must not turn a group holding a NaN into a silent 0
    rewards = torch.tensor([float("nan"), 1.0, 1.0])
    out = clean_baseline(AdvantageInputs(rewards, torch.zeros(3, dtype=torch.long),
                                         injected=torch.tensor([False, False, True]))).advantages
    assert out.isnan().all() and adv(grpo, rewards, torch.zeros(3, dtype=torch.long)).isnan().all()
