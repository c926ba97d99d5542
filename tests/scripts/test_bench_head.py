"""benchmarks/bench_head.py's premise on a tiny float64 trainer: its modes make the same head gradient and the same
update from the same restored state, and only the ``autograd`` mode keeps away from linear_log_probs."""

from __future__ import annotations

import copy
import sys

import pytest
import torch

from benchmarks.bench_checkpointing import restore
from benchmarks.bench_head import HEAD_MODES, UPDATE_MODES, head_pass, timed_update
from tests.trainer.test_token_budget import fixed_batch, float64_trainer
from tether.models import forward


def counted_linear_log_probs(monkeypatch) -> list[bool]:
    """keep_logits of every call of linear_log_probs from here on."""
    calls, real = [], forward.linear_log_probs
    monkeypatch.setattr(forward, "linear_log_probs", lambda *a, keep_logits, **k: calls.append(keep_logits) or
                        real(*a, keep_logits=keep_logits, **k))
    return calls


def test_the_head_modes_give_one_gradient_and_only_autograd_calls_the_head(monkeypatch):
    head = torch.nn.Linear(8, 50, bias=False).double()
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(1, 13, 8, generator=g, dtype=torch.float64)
    targets = torch.randint(0, 50, (1, 13), generator=g)
    calls = counted_linear_log_probs(monkeypatch)
    grads, modes = {}, {}
    for name in HEAD_MODES:
        before = len(calls)
        assert head_pass(head, hidden, targets, name) > 0
        modes[name] = calls[before:]
        grads[name] = head.weight.grad.clone()
    assert modes == {"autograd": [], "recomputed": [False], "kept": [True]}
    assert not head._forward_hooks  # the autograd mode's hook is gone
    assert grads["kept"].abs().max() > 1e-3
    for name in ("autograd", "recomputed"):
        torch.testing.assert_close(grads[name], grads["kept"], rtol=1e-12, atol=1e-15)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self")
def test_both_update_modes_make_the_same_update(tiny_policy, tmp_path, monkeypatch):
    trainer = float64_trainer(tiny_policy, tmp_path, "train.gradient_checkpointing=true")
    batch = fixed_batch()
    trainer.score(batch)
    trainer.compute_advantages(batch)
    timed_update(trainer, batch, "kept")  # as the script: AdamW's state exists from here on
    weights, optimizer = copy.deepcopy(trainer.policy.state_dict()), copy.deepcopy(trainer.optimizer.state_dict())
    head = trainer.policy.get_output_embeddings()
    calls = counted_linear_log_probs(monkeypatch)
    after = {}
    for name in UPDATE_MODES:
        restore(trainer, weights, optimizer)
        before = len(calls)
        record = timed_update(trainer, batch, name)
        assert record["checkpointed"] == 0.0 and record["s"] > 0  # the layers kept in both
        # the loss pass's head: through autograd, or kept (scoring passes have no autograd: recomputed, no-op)
        assert (True in calls[before:]) == (name == "kept")
        after[name] = torch.cat([p.detach().flatten().clone() for p in trainer.policy.parameters()])
    assert not head._forward_hooks  # the script's hook is gone after its update
    assert not torch.equal(after["kept"], torch.cat([w.flatten() for w in weights.values()]))
    torch.testing.assert_close(after["autograd"], after["kept"], rtol=1e-12, atol=1e-15)
