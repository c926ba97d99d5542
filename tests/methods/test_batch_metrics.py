"""The trainer's ``train/*`` batch metrics with method rows in the batch: ARMOR's anchors (``source == 1``) are
samples of the reference, so reward, accuracy and length describe the policy's own (``source == 0``) rows only;
EAPO's guided rows (prior tokens injected, still ``source == 0``) are the policy's rollouts and count."""

from __future__ import annotations

import pytest
import torch

from tether.rollout.batch import RolloutBatch
from tether.trainer.step import batch_metrics


def test_reward_accuracy_and_length_are_of_on_policy_rows_only():
    # rows: on-policy, on-policy with injected prior tokens (EAPO), anchor, anchor. Lengths 4, 2, 1, 3.
    lengths = [4, 2, 1, 3]
    mask = (torch.arange(4)[None, :] < torch.tensor(lengths)[:, None]).float()
    batch = RolloutBatch(
        prompt_ids=[[1, 2]] * 4, response_ids=torch.arange(16).view(4, 4), response_mask=mask,
        sample_log_probs=torch.full((4, 4), -1.0), group_ids=torch.zeros(4, dtype=torch.long),
        rewards=torch.tensor([0.5, -0.25, 1.0, 0.75]), correct=torch.tensor([True, False, True, True]),
        source=torch.tensor([0, 0, 1, 1]),
        token={"injected_mask": torch.tensor([[0.0] * 4, [0.0, 1.0, 0.0, 0.0], [0.0] * 4, [0.0] * 4])})
    m = batch_metrics(batch)
    assert m["train/reward_mean"] == pytest.approx((0.5 - 0.25) / 2, rel=1e-6)  # all rows: 0.5
    assert m["train/accuracy"] == pytest.approx(1 / 2)  # all rows: 3/4
    assert m["train/response_length"] == pytest.approx((4 + 2) / 2)  # all rows: 2.5
    assert m["train/rows"] == 4.0  # every row trains, anchors included

    plain = batch.select([0, 1])  # without anchors, the same values
    assert batch_metrics(plain) == {**m, "train/rows": 2.0}
