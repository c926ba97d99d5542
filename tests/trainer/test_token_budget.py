"""Micro-batches formed by a token budget (``optim.max_tokens_per_micro_batch``): the same gradient and the same
log-probs as the fixed-size plan, every micro-batch under the budget.

Both sides run in float64 on one fixed batch, with right-padded rows (packing off): HF's RMSNorm computes in float32
even in a float64 model, so rows packed differently would differ at 1e-8 (tests/models/test_forward.py).
"""

from __future__ import annotations

import copy

import pytest
import torch

from tests.distributed.helpers import fixed_batch
from tests.trainer.helpers import tiny_config
from tether.algos import AGG_MODES
from tether.models import forward
from tether.trainer import Trainer

BUDGET = 14  # padded tokens: the fixed batch's rows (prompt 1-3, response 1-6 tokens) fall into 4-5 micro-batches
# one optimiser step over the whole batch, gradient clipping off (it would rescale a wrongly weighted gradient)
BASE = ("optim.micro_batch_size=10", "optim.grad_clip=1e9", "algorithm.kl.coef=0.1", "algorithm.entropy_coef=0.01")


def float64_trainer(policy, tmp_path, *overrides: str) -> Trainer:
    model, tok = policy
    return Trainer(tiny_config(tmp_path, *BASE, *overrides), policy=copy.deepcopy(model).double(), tokenizer=tok)


def update(trainer: Trainer) -> tuple[torch.Tensor, dict[str, float], list[tuple[int, int]]]:
    """(the accumulated gradient of one update on the fixed batch, its metrics, each micro-batch's rows x width)."""
    shapes = []
    loss = trainer._micro_batch_loss

    def spy(micro, *args, **kwargs):
        shapes.append((len(micro), micro.width + max(len(p) for p in micro.prompt_ids)))
        return loss(micro, *args, **kwargs)

    trainer._micro_batch_loss = spy
    batch = fixed_batch()
    trainer.score(batch)
    trainer.compute_advantages(batch)
    metrics = trainer.update(batch)
    return torch.cat([p.grad.flatten() for p in trainer.policy.parameters()]), metrics, shapes


@pytest.mark.parametrize("mode", AGG_MODES)
def test_token_budget_gives_the_fixed_size_gradient(tiny_policy, tmp_path, monkeypatch, mode):
    monkeypatch.setattr(forward, "_can_pack", lambda model: False)
    agg = f"algorithm.loss_agg={mode}"
    want, want_metrics, fixed_shapes = update(float64_trainer(tiny_policy, tmp_path / "fixed", agg))
    got, got_metrics, shapes = update(float64_trainer(tiny_policy, tmp_path / "budget", agg,
                                                                   f"optim.max_tokens_per_micro_batch={BUDGET}"))
    assert fixed_shapes == [(10, 9)]  # one micro-batch: every row padded to prompt 3 + response 6
    assert len(shapes) > 2 and sum(n for n, _ in shapes) == 10
    assert all(n * width <= BUDGET for n, width in shapes)
    assert len({width for _, width in shapes}) > 1  # short rows ran without the long rows' padding
    assert want.abs().max() > 1e-3
    torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-12 * want.abs().max().item())
    for key in ("actor/pg_loss", "actor/kl_loss", "actor/entropy", "actor/grad_norm"):  # summed in float32
        assert got_metrics[key] == pytest.approx(want_metrics[key], rel=1e-6, abs=1e-6), key


def test_a_row_longer_than_the_budget_runs_alone(tiny_policy, tmp_path, monkeypatch):
    monkeypatch.setattr(forward, "_can_pack", lambda model: False)
    want, _, _ = update(float64_trainer(tiny_policy, tmp_path / "fixed"))
    got, _, shapes = update(float64_trainer(tiny_policy, tmp_path / "budget", "optim.max_tokens_per_micro_batch=1"))
    assert [n for n, _ in shapes] == [1] * 10
    torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-12 * want.abs().max().item())


@pytest.mark.parametrize("mode", AGG_MODES)
def test_one_row_micro_batches_give_the_one_micro_batch_gradient(tiny_policy, tmp_path, monkeypatch, mode):
    """Ten one-row micro-batches accumulate the gradient of one micro-batch of all ten rows, under every aggregation:
    each divides by the whole mini-batch's token and row counts (Dr.GRPO's by the generation budget), for the policy
    loss with dual clip, the entropy bonus and the KL term alike. (A micro-batch dividing by its own counts gives each
    row's tokens the weight of the whole batch's.)"""
    monkeypatch.setattr(forward, "_can_pack", lambda model: False)
    extra = (f"algorithm.loss_agg={mode}", "algorithm.loss_kwargs={dual_clip: 3.0}")
    want, want_metrics, _ = update(float64_trainer(tiny_policy, tmp_path / "one", *extra))
    got, got_metrics, shapes = update(float64_trainer(tiny_policy, tmp_path / "ten", "optim.micro_batch_size=1",
                                                      *extra))
    assert [n for n, _ in shapes] == [1] * 10
    assert want.abs().max() > 1e-3
    torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-12 * want.abs().max().item())
    for key in ("actor/pg_loss", "actor/kl_loss", "actor/entropy", "actor/pg_clipfrac"):
        assert got_metrics[key] == pytest.approx(want_metrics[key], rel=1e-6, abs=1e-6), key  # summed in float32


def test_length_grouped_scoring_equals_the_padded_forward(tiny_policy, tmp_path, monkeypatch):
    """Old and reference log-probs in budget groups, each cut to its longest response, against one padded pass."""
    monkeypatch.setattr(forward, "_can_pack", lambda model: False)
    batch = fixed_batch()
    padded = float64_trainer(tiny_policy, tmp_path / "fixed")
    grouped = float64_trainer(tiny_policy, tmp_path / "budget", f"optim.max_tokens_per_micro_batch={BUDGET}")
    want = padded.log_probs(padded.policy, batch)
    got = grouped.log_probs(grouped.policy, batch)
    assert got.shape == want.shape == batch.response_mask.shape
    assert (got[batch.response_mask > 0] != 0).all()
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)


def test_token_budget_with_shared_prompts_keeps_the_gradient_in_float32(tiny_policy, tmp_path):
    """As training runs: float32, each micro-batch's distinct prompts run once; the grouping changes only
    rounding."""
    grads = []
    for overrides in ((), (f"optim.max_tokens_per_micro_batch={BUDGET}",)):
        model, tok = tiny_policy
        trainer = Trainer(tiny_config(tmp_path / str(len(grads)), *BASE, *overrides), policy=copy.deepcopy(model),
                          tokenizer=tok)
        grads.append(update(trainer)[0])
    scale = grads[0].abs().max().item()
    torch.testing.assert_close(grads[1], grads[0], rtol=0, atol=1e-5 * scale)


def test_fixed_size_micro_batches_take_rows_of_similar_length(tiny_policy, tmp_path, monkeypatch):
    """Several ``micro_batch_size`` micro-batches are filled longest rows first, each cut to its own longest row:
    the same gradient, less padding than chunks of the shuffled rows."""
    monkeypatch.setattr(forward, "_can_pack", lambda model: False)
    want, _, _ = update(float64_trainer(tiny_policy, tmp_path / "one"))
    got, _, shapes = update(float64_trainer(tiny_policy, tmp_path / "four", "optim.micro_batch_size=3"))
    assert [n for n, _ in shapes] == [3, 3, 3, 1]
    widths = [w for _, w in shapes]
    assert widths == sorted(widths, reverse=True) and widths[-1] < widths[0]
    torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-12 * want.abs().max().item())
