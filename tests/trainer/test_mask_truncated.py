"""``algorithm.mask_truncated``, DAPO's overlong filtering (arXiv:2503.14476 Sec. 3.4): a row that hit
``rollout.max_new_tokens`` leaves the loss, and its group's advantage baseline still counts it (TRL's
``mask_truncated_completions``).

The update runs in float64 on one fixed batch (tests/distributed/helpers.py, packing off as in
tests/trainer/test_token_budget.py), with a KL term and an entropy bonus, so every term of the loss is covered. The
rows with 6 response tokens (``rollout.max_new_tokens``) are the truncated ones.
"""

from __future__ import annotations

import copy

import pytest
import torch

from tests.distributed.helpers import fixed_batch
from tests.trainer.helpers import tiny_config
from tether.algos import AGG_MODES
from tether.config import ConfigError, NoSignalConfig
from tether.health.no_signal import NoSignalCheck
from tether.models import forward
from tether.rollout.batch import RolloutBatch
from tether.trainer import Trainer

BASE = ("optim.micro_batch_size=4", "optim.grad_clip=1e9", "algorithm.kl.coef=0.1", "algorithm.entropy_coef=0.01")
ON = "algorithm.mask_truncated=true"


def float64_trainer(policy, tmp_path, *overrides: str) -> Trainer:
    """A float64 trainer whose reference is moved off the policy, so that the KL term has a gradient."""
    model, tok = policy
    trainer = Trainer(tiny_config(tmp_path, *BASE, *overrides), policy=copy.deepcopy(model).double(), tokenizer=tok)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in trainer.ref_policy.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=gen, dtype=p.dtype))
    return trainer


def truncated_batch() -> RolloutBatch:
    batch = fixed_batch()
    batch.info["truncated"] = (batch.response_mask.sum(1) == 6).tolist()  # rows 0, 4 and 7, in both groups
    return batch


def scored(trainer: Trainer, batch: RolloutBatch) -> RolloutBatch:
    trainer.score(batch)
    trainer.compute_advantages(batch)
    return batch


def gradient(trainer: Trainer, batch: RolloutBatch) -> tuple[torch.Tensor, dict[str, float]]:
    """The accumulated gradient of one update of ``trainer`` on ``batch`` (scored already), and its metrics."""
    metrics = trainer.update(batch)
    return torch.cat([p.grad.flatten() for p in trainer.policy.parameters()]), metrics


@pytest.mark.parametrize("mode", AGG_MODES)
def test_a_truncated_row_is_out_of_the_loss(tiny_policy, tmp_path, monkeypatch, mode):
    """Masked, the update's gradient is the one of the batch without its truncated rows (their advantages made with
    them in the group, as the masked run's), in every aggregation mode: the rows add nothing and count in no
    normaliser, the policy loss, the KL term and the entropy bonus alike."""
    monkeypatch.setattr(forward, "_can_pack", lambda model: False)
    agg = f"algorithm.loss_agg={mode}"
    masked = float64_trainer(tiny_policy, tmp_path / "masked", agg, ON)
    got, metrics = gradient(masked, scored(masked, truncated_batch()))
    plain = float64_trainer(tiny_policy, tmp_path / "plain", agg)
    batch = scored(plain, truncated_batch())
    kept = [i for i, cut in enumerate(batch.info["truncated"]) if not cut]
    assert len(kept) == 7
    want, _ = gradient(plain, batch.select(kept))
    everything, _ = gradient(float64_trainer(tiny_policy, tmp_path / "all", agg), scored(plain, truncated_batch()))
    assert (everything - want).abs().max() > 1e-3 * want.abs().max()  # the truncated rows would move the gradient
    torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-12 * want.abs().max().item())
    assert metrics["train/masked_truncated_frac"] == pytest.approx(0.3)


def test_truncated_rows_stay_in_the_group_statistics(tiny_policy, tmp_path):
    """As in TRL (its advantages are made from every completion's reward before the mask): grpo's mean and std of a
    group count its truncated rows, and a truncated row keeps its own advantage (only the loss leaves it out)."""
    trainer = float64_trainer(tiny_policy, tmp_path, ON)
    batch = scored(trainer, truncated_batch())
    rewards = batch.rewards.double()
    want = torch.empty_like(rewards)
    for g in (0, 1):
        rows = batch.group_ids == g
        want[rows] = (rewards[rows] - rewards[rows].mean()) / (rewards[rows].std() + 1e-6)
    got = batch.token["advantages"][:, 0].double()
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    assert got[[0, 4, 7]].abs().min() > 1e-2


def test_off_changes_nothing_and_on_without_truncated_rows_neither(tiny_policy, tmp_path):
    """Bit for bit: off, rows flagged truncated train as before; on, a batch without a truncated row trains as off."""
    plain = fixed_batch()
    trainer = float64_trainer(tiny_policy, tmp_path / "a")
    want, want_metrics = gradient(trainer, scored(trainer, plain))
    trainer = float64_trainer(tiny_policy, tmp_path / "b")
    got, metrics = gradient(trainer, scored(trainer, truncated_batch()))
    assert torch.equal(got, want) and metrics == want_metrics
    assert "train/masked_truncated_frac" not in metrics
    none_cut = fixed_batch()
    none_cut.info["truncated"] = [False] * len(none_cut)
    trainer = float64_trainer(tiny_policy, tmp_path / "c", ON)
    got, metrics = gradient(trainer, scored(trainer, none_cut))
    assert torch.equal(got, want)
    assert metrics.pop("train/masked_truncated_frac") == 0.0
    # every row kept: the loss keeps every advantage
    every = (none_cut.token["advantages"].double().abs() * none_cut.response_mask).sum() / none_cut.response_mask.sum()
    assert metrics.pop("actor/kept_advantage_abs_mean") == pytest.approx(every.item(), rel=1e-6)  # float32 advantages
    assert metrics == want_metrics


def test_the_key_validates_and_is_refused_where_every_row_is_truncated(tmp_path):
    assert tiny_config(tmp_path, ON, "algorithm.loss_agg=token-mean").algorithm.mask_truncated
    with pytest.raises(ConfigError, match=r"algorithm\.mask_truncated=true with rollout\.ignore_eos=true"):
        tiny_config(tmp_path, ON, "rollout.ignore_eos=true")


def test_a_step_whose_every_row_is_truncated_is_a_step_without_signal(tiny_policy, tmp_path):
    """Every row truncated, the loss keeps nothing: the gradient is 0 though train/advantage_abs_mean is not, and
    health.no_signal counts the step (it counted it as signal, reading only the advantages). With some rows kept,
    actor/kept_advantage_abs_mean is the mean |A| over their response tokens."""
    trainer = float64_trainer(tiny_policy, tmp_path, ON)
    batch = fixed_batch()
    batch.info["truncated"] = [True] * len(batch)
    trainer.score(batch)
    metrics = trainer.compute_advantages(batch)
    got, update = gradient(trainer, batch)
    metrics.update(update)
    assert metrics["train/advantage_abs_mean"] > 0.1 and metrics["train/masked_truncated_frac"] == 1.0
    assert torch.count_nonzero(got) == 0 and metrics["actor/kept_advantage_abs_mean"] == 0.0
    check = NoSignalCheck(NoSignalConfig(patience=1))
    assert check.observe(1, metrics) == {"health/no_signal_steps": 1.0}
    assert "algorithm.mask_truncated left every row out of the loss" in check.failure

    trainer = float64_trainer(tiny_policy, tmp_path / "some", ON)
    batch = truncated_batch()
    trainer.score(batch)
    metrics = {**trainer.compute_advantages(batch), **gradient(trainer, batch)[1]}
    kept = batch.response_mask.double() * torch.tensor([not cut for cut in batch.info["truncated"]],
                                                        dtype=torch.float64)[:, None]
    want = (batch.token["advantages"].double().abs() * kept).sum() / kept.sum()
    assert metrics["actor/kept_advantage_abs_mean"] == pytest.approx(want.item(), rel=1e-6)  # float32 advantages
    assert NoSignalCheck(NoSignalConfig(patience=1)).observe(1, metrics) == {"health/no_signal_steps": 0.0}
