"""``train.gradient_checkpointing: auto``: each micro-batch whose estimated activations exceed
``train.activation_memory_budget_gb`` recomputes its decoder layers in backward, the others do not, and the gradient
is the same either way (float64, right-padded rows as in tests/trainer/test_token_budget.py)."""

from __future__ import annotations

import pytest
import torch

from tests.trainer.test_token_budget import float64_trainer, update
from tether.models import forward, layers

SMALL_MICRO_BATCHES = "optim.micro_batch_size=3"  # the fixed batch's 10 rows in 4 micro-batches of 3, 3, 3 and 1


def checkpointed_update(policy, path, monkeypatch, *overrides: str):
    """(gradient, metrics, each micro-batch's (estimated GiB, checkpointed), decoder-layer recomputations)."""
    calls = []

    def counting(fn, *args, **kwargs):
        calls.append(fn)
        return torch.utils.checkpoint.checkpoint(fn, *args, **kwargs)

    monkeypatch.setattr(layers, "checkpoint", counting)
    trainer = float64_trainer(policy, path, SMALL_MICRO_BATCHES, *overrides)
    choices = []
    choose = trainer._choose_checkpointing
    trainer._choose_checkpointing = lambda *a: choices.append(choose(*a)) or choices[-1]
    grad, metrics, _ = update(trainer)
    return grad, metrics, choices, len(calls)


def test_auto_checkpoints_the_micro_batches_above_the_budget(tiny_policy, tmp_path, monkeypatch):
    monkeypatch.setattr(forward, "_can_pack", lambda model: False)
    want, _, _, none = checkpointed_update(tiny_policy, tmp_path / "off", monkeypatch,
                                           "train.gradient_checkpointing=false")
    assert none == 0
    under, metrics, choices, calls = checkpointed_update(tiny_policy, tmp_path / "under", monkeypatch,
                                                         "train.activation_memory_budget_gb=1000")
    assert calls == 0 and not any(on for _, on in choices) and metrics["perf/checkpointed_micro_batches"] == 0
    estimates = sorted({gb for gb, _ in choices})
    assert len(estimates) > 1  # micro-batches of different padded sizes
    assert metrics["perf/activation_gb"] == pytest.approx(estimates[-1])
    budget = (estimates[0] + estimates[-1]) / 2
    mixed, metrics, choices, calls = checkpointed_update(tiny_policy, tmp_path / "mixed", monkeypatch,
                                                         f"train.activation_memory_budget_gb={budget}")
    assert [on for _, on in choices] == [gb > budget for gb, _ in choices]
    assert 0 < metrics["perf/checkpointed_micro_batches"] < 1
    assert calls == 2 * sum(on for _, on in choices)  # each of the 2 decoder layers once per checkpointed forward
    over, metrics, _, _ = checkpointed_update(tiny_policy, tmp_path / "over", monkeypatch,
                                              "train.activation_memory_budget_gb=1e-9")
    assert metrics["perf/checkpointed_micro_batches"] == 1
    assert want.abs().max() > 1e-3
    for got in (under, mixed, over):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-15)


def test_true_and_false_keep_their_meaning(tiny_policy, tmp_path, monkeypatch):
    for setting, checkpointed in (("true", 1), ("false", 0)):
        _, metrics, _, _ = checkpointed_update(tiny_policy, tmp_path / setting, monkeypatch,
                                               f"train.gradient_checkpointing={setting}",
                                               "train.activation_memory_budget_gb=1e-9")
        assert metrics["perf/checkpointed_micro_batches"] == checkpointed
