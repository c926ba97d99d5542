"""SEED's OPD metrics (``Seed.extra_loss``, folded by the trainer's rule), pinned to a float64 computation.

The update is hand-made: two mini-batches, the first cut into two micro-batches, rows with and without a skill
(``seed_mask`` 0), padding whose teacher gap would raise the gate if it were read. docs/methods/seed.md defines
``seed/opd_loss = sum m g (l_T - l) / sum m``, ``seed/opd_gate_mean = sum m g / sum m``, ``seed/opd_raised_frac =
sum m 1[g > 0.5] / sum m``, sums over every micro-batch forward of the update (and rank:
tests/distributed/test_data_parallel.py).
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from tether.algos import LossInputs
from tether.methods import METHODS, MiniBatch, method_config
from tether.rollout.batch import RolloutBatch
from tether.trainer.step import add_micro_metrics, step_values

BETA = 5.0
# 4 rows, width 3, lengths 3, 2, 3, 1; r1's analysis produced no skill (seed_mask 0): 7 active of 9 response tokens
RESPONSE = [[1, 1, 1], [1, 1, 0], [1, 1, 1], [1, 0, 0]]
SKILL = [1, 0, 1, 1]
STUDENT = [[-1.0, -0.5, -2.0], [-0.25, -0.75, -5.0], [-1.5, -0.125, -1.0], [-0.5, -5.0, -5.0]]
# l_T - l on response tokens (exact in float32); the padding's gap is +5 (gate ~1)
GAP = [[0.25, -0.375, 0.125], [0.5, 0.75, 5.0], [-0.125, -0.5, 0.375], [0.625, 5.0, 5.0]]
# the update's mini-batches, as row lists, each a list of micro-batches
MINI_BATCHES = [[[0, 1], [2]], [[3]]]


def seed_batch() -> RolloutBatch:
    n = len(RESPONSE)
    response = torch.tensor(RESPONSE, dtype=torch.float32)
    student = torch.tensor(STUDENT)
    return RolloutBatch(prompt_ids=[[1, 2]] * n, response_ids=torch.zeros(n, 3, dtype=torch.long),
                        response_mask=response, sample_log_probs=student, group_ids=torch.zeros(n, dtype=torch.long),
                        rewards=torch.zeros(n), correct=torch.zeros(n, dtype=torch.bool),
                        source=torch.zeros(n, dtype=torch.long),
                        token={"teacher_log_probs": student + torch.tensor(GAP),
                               "seed_mask": torch.tensor(SKILL, dtype=torch.float32)[:, None] * response})


def run_update(loss_tokens_kept: int | None = None, **settings) -> dict[str, float]:
    """Every micro-batch's extra_loss of one update, its metrics folded as the trainer folds them: a metric without
    units by the micro-batch's loss tokens, its response tokens or (``loss_tokens_kept``, as with
    ``algorithm.mask_truncated``) those of its first rows only."""
    seed = METHODS["seed"](method_config("seed", {"gate_beta": BETA, **settings}))
    batch = seed_batch()
    folded: dict[str, torch.Tensor] = {}
    for micros in MINI_BATCHES:
        rows = [r for micro in micros for r in micro]
        mini = batch.select(rows)
        ctx = SimpleNamespace(mini_batch=MiniBatch(rows=torch.tensor(rows), num_tokens=float(mini.response_mask.sum()),
                                                   num_seqs=len(rows), batch=mini))
        for micro_rows in micros:
            micro = batch.select(micro_rows)
            lp = micro.sample_log_probs.clone().requires_grad_(True)
            inputs = LossInputs(log_probs=lp, old_log_probs=lp.detach(), advantages=torch.zeros_like(lp),
                                response_mask=micro.response_mask,
                                tokens={"teacher_log_probs": micro.token["teacher_log_probs"]})
            loss_tokens = micro.response_mask[:loss_tokens_kept].sum()
            add_micro_metrics(folded, seed.extra_loss(inputs, micro, ctx), tokens=loss_tokens)
    return step_values({k: float(v) for k, v in folded.items()}, dict.fromkeys(folded, 1))


def expected() -> dict[str, float]:
    """The definitions, in float64 over the active tokens of every row (one pass, no micro-batches)."""
    gaps = [GAP[i][t] for i in range(len(RESPONSE)) for t in range(3) if RESPONSE[i][t] and SKILL[i]]
    gates = [1 / (1 + math.exp(-BETA * d)) for d in gaps]
    n = len(gaps)
    assert n == 7 and sum(map(sum, RESPONSE)) == 9
    return {"seed/opd_loss": sum(g * d for g, d in zip(gates, gaps, strict=True)) / n,
            "seed/opd_delta_mean": sum(gaps) / n,
            "seed/opd_gate_mean": sum(gates) / n,
            "seed/opd_raised_frac": sum(g > 0.5 for g in gates) / n,
            "seed/opd_active_token_frac": n / 9}


@pytest.mark.parametrize("loss_tokens_kept", [None, 1], ids=["all rows", "truncated rows out of the loss"])
@pytest.mark.parametrize("global_token_mean", [True, False])
def test_opd_metrics_are_exact_token_means_over_the_update(global_token_mean, loss_tokens_kept):
    # Active tokens per micro-batch: 3 (rows 0, 1), 3 (row 2), 1 (row 3). An unweighted mean of the three micro-batch
    # means, a division by response tokens (9) rather than active ones (7), padding read (gap 5) or the loss sum
    # rescaled by the micro-batch's active count instead of the mini-batch's each give another number here; so does
    # active_token_frac weighted by the loss tokens where those are fewer than the response tokens it is over.
    metrics = run_update(loss_tokens_kept, global_token_mean=global_token_mean)
    want = expected()
    assert want["seed/opd_raised_frac"] == pytest.approx(4 / 7)  # gaps > 0: 0.25, 0.125, 0.375, 0.625
    for key, value in want.items():
        assert metrics[key] == pytest.approx(value, rel=1e-6, abs=1e-9), key
    assert set(metrics) == set(want)


def test_per_micro_batch_normalisation_is_divided_by_the_accumulation_count():
    """``global_token_mean: false`` is the SEED code: each micro-batch's OPD is a mean over its own active tokens, and
    verl divides every micro-batch's loss by the accumulation count (micro / mini rows). Without that division the
    OPD gradient grew with the number of micro-batches (twice the code's here). Reference: the gradient of
    ``(1/K) sum_k sum_{t in k} m g (l_T - l) / n_k`` in float64, the gate a constant."""
    micros = [[0, 1], [2, 3]]  # one mini-batch of four rows, two micro-batches: K = 2
    seed = METHODS["seed"](method_config("seed", {"gate_beta": BETA, "opd_coef": 1.0, "global_token_mean": False}))
    batch = seed_batch()
    mini = batch.select([0, 1, 2, 3])
    ctx = SimpleNamespace(mini_batch=MiniBatch(rows=torch.arange(4), num_tokens=float(mini.response_mask.sum()),
                                               num_seqs=4, batch=mini))
    got = torch.zeros(4, 3, dtype=torch.float64)
    for rows in micros:
        micro = batch.select(rows)
        lp = micro.sample_log_probs.double().requires_grad_(True)
        inputs = LossInputs(log_probs=lp, old_log_probs=lp.detach(), advantages=torch.zeros_like(lp),
                            response_mask=micro.response_mask.double(),
                            tokens={"teacher_log_probs": micro.token["teacher_log_probs"].double()})
        seed.extra_loss(inputs, micro, ctx).loss.backward()
        got[rows] = lp.grad
    want = torch.zeros(4, 3, dtype=torch.float64)
    for rows in micros:
        active = [(i, t) for i in rows for t in range(3) if RESPONSE[i][t] and SKILL[i]]
        for i, t in active:
            gate = 1 / (1 + math.exp(-BETA * GAP[i][t]))
            want[i, t] = -gate / (len(micros) * len(active))
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-15)
