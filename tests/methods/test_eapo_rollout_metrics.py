"""EAPO's ``eapo/*`` rollout metrics (tether.methods.eapo.rollout_metrics), pinned to hand values.

The batch is hand-built: rows of different lengths, gate/injection flags and statistics set *in the padding* too, so a
metric that forgets the response mask, divides by the wrong count or averages the wrong rows gives another number.
"""

from __future__ import annotations

import pytest
import torch

from tether.methods.eapo import rollout_metrics
from tether.rollout.batch import RolloutBatch

BIG = 9.0  # a value only padding carries: a metric that reads padding moves by a lot

# 4 rows, width 5, lengths 5, 3, 2, 4: 14 response tokens
MASK = [[1, 1, 1, 1, 1],
        [1, 1, 1, 0, 0],
        [1, 1, 0, 0, 0],
        [1, 1, 1, 1, 0]]
# gated response tokens: r0 t1 t2 t4, r1 t0, r3 t1 t3 = 6 (r1 t4 is padding: 7 flags in all)
GATE = [[0, 1, 1, 0, 1],
        [1, 0, 0, 0, 1],
        [0, 0, 0, 0, 0],
        [0, 1, 0, 1, 0]]
# injected response tokens: r0 t2 t4, r3 t1 = 3; r1's only flag is in its padding, so r1 is a clean row
INJECTED = [[0, 0, 1, 0, 1],
            [0, 0, 0, 0, 1],
            [0, 0, 0, 0, 0],
            [0, 1, 0, 0, 0]]
JS = [[0.125, 0.25, 0.375, 0.5, 0.625],
      [0.75, 0.875, 1.0, BIG, BIG],
      [1.125, 1.25, BIG, BIG, BIG],
      [1.375, 1.5, 1.625, 1.75, BIG]]
GATE_STAT = [[0.5, 1.0, 1.5, 2.0, 2.5],
             [3.0, 3.5, 4.0, BIG, BIG],
             [4.5, 5.0, BIG, BIG, BIG],
             [5.5, 6.0, 6.5, 7.0, BIG]]
REWARDS = [1.0, 0.5, -1.0, 0.25]
CORRECT = [True, True, False, False]


def eapo_batch() -> RolloutBatch:
    n, width = len(MASK), len(MASK[0])
    return RolloutBatch(
        prompt_ids=[[1, 2]] * n,
        response_ids=torch.arange(n * width).view(n, width),
        response_mask=torch.tensor(MASK, dtype=torch.float32),
        sample_log_probs=torch.full((n, width), -1.0),
        group_ids=torch.tensor([0, 0, 1, 1]),
        rewards=torch.tensor(REWARDS),
        correct=torch.tensor(CORRECT),
        source=torch.zeros(n, dtype=torch.long),
        token={"gate_mask": torch.tensor(GATE, dtype=torch.float32),
               "injected_mask": torch.tensor(INJECTED, dtype=torch.float32),
               "eapo_js": torch.tensor(JS), "eapo_gate_stat": torch.tensor(GATE_STAT)},
    )


def test_token_and_row_fractions_count_response_tokens_only():
    m = rollout_metrics(eapo_batch())
    # 6 gated / 14 response tokens (with padding flags 7/14; over all positions 7/20)
    assert m["eapo/gated_token_frac"] == pytest.approx(6 / 14, rel=1e-12)
    # 3 injected / 14 (padding included 4/14)
    assert m["eapo/injected_token_frac"] == pytest.approx(3 / 14, rel=1e-12)
    # rows r0, r3 of 4 (r1's padding flag would make it 3/4)
    assert m["eapo/injected_rollouts_frac"] == pytest.approx(2 / 4, rel=1e-12)
    # mean over *all* rows of the injected count, (2 + 0 + 0 + 1) / 4; over injected rows only it would be 1.5, with
    # padding 1.0
    assert m["eapo/injected_per_rollout"] == pytest.approx(3 / 4, rel=1e-12)


def test_injection_rel_pos_is_position_over_row_length_averaged_over_injected_tokens():
    m = rollout_metrics(eapo_batch())
    # r0 (length 5): t2, t4 -> 2/5, 4/5; r3 (length 4): t1 -> 1/4. Dividing by the width gives (2+4+1)/5/3 = 0.4667,
    # by length - 1 gives (2/4 + 4/4 + 1/3)/3 = 0.6111, a mean of the per-row means (0.6 + 0.25)/2 = 0.425
    expected = (2 / 5 + 4 / 5 + 1 / 4) / 3
    assert m["eapo/injection_rel_pos"] == pytest.approx(expected, rel=1e-6)


def test_js_and_gate_stat_are_means_over_their_own_tokens():
    m = rollout_metrics(eapo_batch())
    # JS at the 6 gated response tokens: r0 t1 t2 t4, r1 t0, r3 t1 t3: 5.25/6 = 0.875. Over every response token it
    # would be 13.125/14 = 0.9375, over the injected ones 2.5/3, with r1's gated padding token (5.25 + BIG)/7
    js_gated = (0.25 + 0.375 + 0.625 + 0.75 + 1.5 + 1.75) / 6
    assert m["eapo/js_gated"] == pytest.approx(js_gated, rel=1e-6)
    # the gate statistic over the 14 response tokens; over all 20 positions the padding's BIG enters
    stat = [v for row, mask in zip(GATE_STAT, MASK, strict=True) for v, on in zip(row, mask, strict=True) if on]
    assert len(stat) == 14
    assert m["eapo/gate_stat_mean"] == pytest.approx(sum(stat) / 14, rel=1e-6)


def test_reward_and_accuracy_split_by_injected_rows():
    m = rollout_metrics(eapo_batch())
    # injected rows r0, r3; clean rows r1, r2 (r1's padding flag must not move it to the injected side, which would
    # give reward_injected (1 + 0.5 + 0.25)/3 and reward_clean -1)
    assert m["eapo/reward_injected"] == pytest.approx((1.0 + 0.25) / 2, rel=1e-12)
    assert m["eapo/reward_clean"] == pytest.approx((0.5 - 1.0) / 2, rel=1e-12)
    assert m["eapo/accuracy_injected"] == pytest.approx(1 / 2, rel=1e-12)  # r0 right, r3 wrong
    assert m["eapo/accuracy_clean"] == pytest.approx(1 / 2, rel=1e-12)    # r1 right, r2 wrong


def test_metrics_without_gates_or_injections_are_absent_not_zero():
    batch = eapo_batch()
    batch.token["gate_mask"].zero_()
    batch.token["injected_mask"].zero_()
    m = rollout_metrics(batch)
    assert m["eapo/gated_token_frac"] == 0.0 and m["eapo/injected_token_frac"] == 0.0
    assert m["eapo/injected_rollouts_frac"] == 0.0 and m["eapo/injected_per_rollout"] == 0.0
    for key in ("eapo/injection_rel_pos", "eapo/js_gated", "eapo/reward_injected", "eapo/accuracy_injected"):
        assert key not in m, key
    assert m["eapo/reward_clean"] == pytest.approx(sum(REWARDS) / 4, rel=1e-12)
    assert m["eapo/accuracy_clean"] == pytest.approx(2 / 4, rel=1e-12)
