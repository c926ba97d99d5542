"""Group-relative advantage estimators: one scalar per row, from rewards, a group id per row and optional tags.

Each estimator takes one :class:`~tether.algos.types.AdvantageInputs` and returns an
:class:`~tether.algos.types.AdvantageOutput` (advantages ``[N]`` and metrics); the trainer makes them in one place,
once per RL step, and broadcasts the per-row advantage to the row's response tokens. Estimators that read a tag
declare it (``needs``): ``gigpo`` the agent loop's step returns and observation keys, ``clean_baseline`` EAPO's
injected rows.

The group statistics are vectorised over groups (scatter sums, no Python loop): group ids are mapped to
``0..G-1`` with ``torch.unique`` and statistics are gathered back per row. Two estimators keep the Python of their
reference code: GiGPO's step groups are formed from observation strings, and the clean baseline is EAPO's
per-group loop.

A group of one has no baseline to compare against: ``grpo``, ``dr_grpo``, ``rloo``, ``qae`` and
``clean_baseline`` give it advantage 0 (never NaN). ``episode`` (and so ``gigpo``) follows the SEED/verl-agent
code instead (see its docstring).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from tether.algos.registry import register_advantage
from tether.algos.types import AdvantageInputs, AdvantageOutput

EPISODE_MODES = ("mean_std_norm", "mean_norm")


def _group_stats(rewards: Tensor, group_ids: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Per-row (group index in 0..G-1, group size, mean, unbiased std; std 0 for a group of one).

    A group of equal rewards has exactly its reward as mean and std 0, so its rows get advantage 0 under every
    estimator. Summed in ``rewards``' dtype, the mean of eight float32 rewards of 1.2 is one ulp off and its std
    1.3e-7: ``grpo`` then gave every row +0.106, and 48 rows of ``episode`` -0.32 (a group that carries no signal
    trained as if it did). The sums run in float64 as well, for the groups that differ.
    """
    if not rewards.is_floating_point():
        raise TypeError(f"rewards must be a float tensor, got {rewards.dtype}")
    unique, index = torch.unique(group_ids, return_inverse=True)
    wide = rewards.double()
    zeros = wide.new_zeros(unique.numel())
    counts = zeros.index_add(0, index, torch.ones_like(wide))
    mean = zeros.index_add(0, index, wide) / counts
    squares = zeros.index_add(0, index, (wide - mean[index]) ** 2)
    std = (squares / (counts - 1).clamp(min=1)).sqrt()  # torch.std's N-1 (verl, ARMOR and SEED code)
    low = zeros.scatter_reduce(0, index, wide, "amin", include_self=False)
    high = zeros.scatter_reduce(0, index, wide, "amax", include_self=False)
    equal = (low == high)[index]
    mean = torch.where(equal, wide, mean[index])
    std = std[index].masked_fill(equal, 0.0)
    return index, counts[index].to(rewards.dtype), mean.to(rewards.dtype), std.to(rewards.dtype)


def _differ(rewards: Tensor) -> bool:
    """Whether some of ``rewards`` differ (their std is then > 0, and not a rounding error's)."""
    return bool(rewards.max() > rewards.min())


def _group_quantile(rewards: Tensor, index: Tensor, counts: Tensor, q: float) -> Tensor:
    """Per-row q-quantile of the row's group, with torch.quantile's linear interpolation."""
    by_reward = torch.argsort(rewards, stable=True)
    order = by_reward[torch.argsort(index[by_reward], stable=True)]  # by group, then by reward
    ranked = rewards[order]
    starts = torch.searchsorted(index[order].contiguous(), index)  # first slot of each row's group
    position = q * (counts - 1)
    low = position.floor()
    v_low = ranked[starts + low.long()]
    v_high = ranked[starts + position.ceil().long()]
    return torch.lerp(v_low, v_high, position - low)


def group_normalised(rewards: Tensor, group_ids: Tensor, *, eps: float = 1e-6) -> Tensor:
    """``(R - mean_g R) / (std_g R + eps)``, unbiased std; 0 for a group of one (``grpo``'s math)."""
    _, counts, mean, std = _group_stats(rewards, group_ids)
    adv = (rewards - mean) / (std + eps)
    return adv.where(counts > 1, rewards.new_zeros(()))


def group_centred(rewards: Tensor, group_ids: Tensor) -> Tensor:
    """``R - mean_g R``; exactly 0 for a group of one (``dr_grpo``'s math)."""
    _, _, mean, _ = _group_stats(rewards, group_ids)
    return rewards - mean


@register_advantage("grpo")
def grpo(inputs: AdvantageInputs, *, eps: float = 1e-6) -> AdvantageOutput:
    """GRPO outcome advantage ``(R - mean_g R) / (std_g R + eps)``, unbiased std.

    DeepSeekMath (arXiv:2402.03300) Sec. 4.1.2; verl ``compute_grpo_outcome_advantage``; the ARMOR
    code (Eq. 1 of arXiv:2607.10481) and the SEED code use ``torch.std`` (N-1), as here.

    Args:
        inputs: ``rewards`` ``[N]`` scalar reward per row; ``group_ids`` ``[N]`` long, rows with the same id form
            a group (the samples of one prompt).
        eps: added to the std, so a group of equal rewards gets 0 rather than 0/0.

    Returns:
        ``[N]`` advantages; 0 for a group of one.
    """
    return AdvantageOutput(group_normalised(inputs.rewards, inputs.group_ids, eps=eps))


@register_advantage("dr_grpo")
def dr_grpo(inputs: AdvantageInputs) -> AdvantageOutput:
    """Dr.GRPO advantage ``R - mean_g R`` (no std division; Liu et al., arXiv:2503.20783).

    Pair it with ``agg="seq-mean-token-sum-norm"`` to remove GRPO's length bias as well.
    """
    return AdvantageOutput(group_centred(inputs.rewards, inputs.group_ids))


@register_advantage("rloo")
def rloo(inputs: AdvantageInputs) -> AdvantageOutput:
    """REINFORCE leave-one-out: ``R_i - mean_{j != i} R_j = n/(n-1) (R_i - mean_g R)``.

    Ahmadian et al., arXiv:2402.14740 (after Kool et al. 2019); verl ``compute_rloo_outcome_advantage``.
    """
    rewards = inputs.rewards
    _, counts, mean, _ = _group_stats(rewards, inputs.group_ids)
    adv = counts / (counts - 1).clamp(min=1) * (rewards - mean)
    return AdvantageOutput(adv.where(counts > 1, rewards.new_zeros(())))


@register_advantage("qae")
def qae(inputs: AdvantageInputs, *, quantile: float = 0.45, eps: float = 1e-6) -> AdvantageOutput:
    """Quantile advantage: ``(R - Q_q(R_g)) / (std_g R + eps)``, the group mean replaced by a quantile.

    QAE (arXiv:2509.22611) as run in the ARMOR code (``algorithm.quantile_k=0.45``, std division
    kept; armor.md Sec. 1.3). With binary rewards and a mostly-correct group the quantile is the top
    reward, so correct samples (an ARMOR anchor included) get exactly 0 (ARMOR Sec. 5.1 footnote 4).

    Args:
        inputs: ``rewards`` ``[N]``, ``group_ids`` ``[N]`` long.
        quantile: in [0, 1]; ``torch.quantile`` linear interpolation.
        eps: added to the std.
    """
    if not 0.0 <= quantile <= 1.0:
        raise ValueError(f"qae quantile must be in [0, 1], got {quantile}")
    rewards = inputs.rewards
    index, counts, _, std = _group_stats(rewards, inputs.group_ids)
    baseline = _group_quantile(rewards, index, counts, quantile)
    adv = (rewards - baseline) / (std + eps)
    return AdvantageOutput(adv.where(counts > 1, rewards.new_zeros(())))


@register_advantage("episode")
def episode(inputs: AdvantageInputs, *, mode: str = "mean_std_norm", eps: float = 1e-6) -> AdvantageOutput:
    """Episode-level advantage for multi-turn training rows (SEED, arXiv:2607.14777; verl-agent/GiGPO).

    Every step row of every trajectory of a task is one row here, carrying its episode's return, and
    the statistics run over *all step rows* of the group (``compute_mean_std_cross_steps=True`` in
    ``gigpo/core_gigpo.py::episode_norm_reward``), so long episodes weigh more in the mean:

    * ``mean_std_norm``: ``(S - mean_g S) / (std_g S + eps)``, unbiased std (SEED: ALFWorld, Search);
    * ``mean_norm``: ``S - mean_g S`` (SEED: WebShop).

    A group with a single row takes mean 0 and std 1, exactly as that code does (seed.md Sec. 1.2(A)),
    so it keeps its raw score: ``S / (1 + eps)`` or ``S``. This differs from the other estimators here,
    which give such a row 0.
    """
    return AdvantageOutput(_episode(inputs.rewards, inputs.group_ids, mode=mode, eps=eps))


def _episode(rewards: Tensor, group_ids: Tensor, *, mode: str, eps: float) -> Tensor:
    """:func:`episode`'s math on tensors, shared with :func:`gigpo`."""
    if mode not in EPISODE_MODES:
        raise ValueError(f"episode mode must be 'mean_std_norm' or 'mean_norm', got '{mode}'")
    _, counts, mean, std = _group_stats(rewards, group_ids)
    single = counts == 1
    mean = mean.where(~single, rewards.new_zeros(()))
    if mode == "mean_norm":
        return rewards - mean
    return (rewards - mean) / (std.where(~single, rewards.new_ones(())) + eps)


def step_advantages(returns: Tensor, group_ids: Tensor, obs_keys: Sequence[str], *,
                    mode: str = "mean_std_norm", eps: float = 1e-6) -> tuple[Tensor, Tensor]:
    """GiGPO's step-level advantage: normalise returns over rows of a task group with the same observation.

    Feng et al., "Group-in-Group Policy Optimization for LLM Agent Training", arXiv:2505.10978, Eq. 6-7;
    verl-agent ``gigpo/core_gigpo.py::build_step_group`` (exact-match anchor observations within one
    ``uid``) and ``step_norm_reward``. A step group of one row gets 0 (its own mean), as there.

    Args:
        returns: ``[N]`` discounted return of each row from its turn on.
        group_ids: ``[N]`` the task group of each row (the episode advantage's groups).
        obs_keys: the observation each row acted on (the raw env observation, not the prompt).
        mode: ``mean_std_norm`` ``(G - mean) / (std + eps)`` (unbiased std) or ``mean_norm`` ``G - mean``.
        eps: added to the std.

    Returns:
        (``[N]`` step advantages, ``[N]`` long size of each row's step group).
    """
    if mode not in EPISODE_MODES:
        raise ValueError(f"step advantage mode must be 'mean_std_norm' or 'mean_norm', got '{mode}'")
    ids: dict[tuple[int, str], int] = {}
    step_ids = torch.tensor([ids.setdefault((g, k), len(ids)) for g, k in
                             zip(group_ids.tolist(), obs_keys, strict=True)], dtype=torch.long,
                            device=group_ids.device)
    sizes = torch.bincount(step_ids)[step_ids]
    if mode == "mean_norm":
        return group_centred(returns, step_ids), sizes
    return group_normalised(returns, step_ids, eps=eps), sizes


@register_advantage("gigpo", needs=("step_returns", "obs_keys"))
def gigpo(inputs: AdvantageInputs, *, mode: str = "mean_std_norm", eps: float = 1e-6,
          step_weight: float = 1.0) -> AdvantageOutput:
    """GiGPO: the episode advantage plus ``step_weight`` times the step advantage (arXiv:2505.10978, Eq. 7-8).

    ``A = A_episode + w * A_step``: :func:`episode` over the rewards (the episode return on every step row, an
    invalid action's penalty included), :func:`step_advantages` over the step returns (env rewards discounted
    with ``env.step_gamma``, no penalty), both with the same ``mode`` and ``eps``, as verl-agent's
    ``compute_gigpo_outcome_advantage`` (``step_advantage_w`` = 1.0 there).

    Args:
        inputs: needs ``step_returns`` and ``obs_keys`` (the agent loop sets both).
        mode: ``mean_std_norm`` or ``mean_norm``, for both terms.
        eps: added to both stds.
        step_weight: ``w``, the weight of the step term.

    Returns:
        advantages ``[N]``; metrics ``train/step_adv_abs_mean`` (of the step term before ``step_weight``),
        ``train/step_group_size`` (mean rows per step group, over rows) and ``train/step_group_singleton_frac``
        (rows alone in their step group, advantage 0).
    """
    returns = inputs.require("step_returns", "gigpo")
    step, sizes = step_advantages(returns, inputs.group_ids, inputs.require("obs_keys", "gigpo"), mode=mode,
                                  eps=eps)
    adv = _episode(inputs.rewards, inputs.group_ids, mode=mode, eps=eps) + step_weight * step
    return AdvantageOutput(adv, {"train/step_adv_abs_mean": step.abs().mean(),
                                 "train/step_group_size": sizes.float().mean(),
                                 "train/step_group_singleton_frac": (sizes == 1).float().mean()})


@register_advantage("clean_baseline", needs=("injected",))
def clean_baseline(inputs: AdvantageInputs, *, scale: bool = True, eps: float = 1e-6) -> AdvantageOutput:
    """Group-relative advantages whose baseline comes from the rollouts without injection (EAPO, RECONSTRUCTED).

    For each group with ``k`` "clean" rollouts, sampled by the policy alone (no injected token, and not another
    sampler's row: ARMOR's anchors come from the reference, correct by construction), every rollout (injected ones
    and anchors included, unclipped) gets ``(R_i - mean_clean) / (s + eps)`` (``R_i - mean_clean`` without ``scale``, as
    Dr.GRPO), where ``s`` is the unbiased std of the clean rewards, or of the whole group's rewards
    when ``k < 2`` or the clean rewards are all equal (then the clean std is 0 and an injected success
    would get ``1 / eps``). A group with ``k = 0`` is plain GRPO (mean over all rollouts); a group of one gets 0.
    Adapted from LUFFY's ``compute_mixedpolicy_grpo_outcome_advantage`` (docs/methods/eapo.md).

    Args:
        inputs: needs ``injected``, the rows with at least one injected token; reads ``source``.
        scale: divide by the std (GRPO) or not (Dr.GRPO).
        eps: added to the std.

    Returns:
        advantages ``[N]``; metric ``eapo/clean_baseline_frac``, the share of rows whose group's baseline came
        from clean rollouts only.
    """
    rewards, group_ids = inputs.rewards, inputs.group_ids
    injected = inputs.require("injected", "clean_baseline")
    by_policy = torch.ones_like(injected) if inputs.source is None else inputs.source == 0
    adv = torch.zeros_like(rewards)
    from_clean = torch.zeros_like(injected)
    for gid in group_ids.unique().tolist():
        rows = group_ids == gid
        r, clean = rewards[rows].double(), (by_policy & ~injected)[rows]  # float64: see _group_stats
        if int(rows.sum()) < 2:
            continue  # a group of one has no baseline: advantage 0, as the other estimators
        from_clean[rows] = bool(clean.any())
        if not _differ(r) and not bool(r.isnan().any()):
            continue  # equal rewards carry no signal: 0, not a rounding error over eps (NaN stays NaN, as in grpo)
        mean = r[clean].mean() if bool(clean.any()) else r.mean()
        std = r[clean].std() if int(clean.sum()) >= 2 and _differ(r[clean]) else r.std()
        adv[rows] = ((r - mean) / (std + eps) if scale else r - mean).to(adv.dtype)
    return AdvantageOutput(adv, {"eapo/clean_baseline_frac": from_clean.float().mean()})
