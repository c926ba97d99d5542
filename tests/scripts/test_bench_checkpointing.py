"""benchmarks/bench_checkpointing.py's premise on a tiny float64 trainer: its two modes make the same update from
the same restored state, and only one of them recomputes the decoder layers; and bench_trl.py gives TRL layer
checkpointing where tether has it."""

from __future__ import annotations

import copy
import sys

import pytest
import torch

from benchmarks.bench_checkpointing import MODES, restore, timed_update
from benchmarks.bench_trl import trl_gradient_checkpointing
from tests.trainer.test_token_budget import fixed_batch, float64_trainer
from tether.models import layers


def flat(tensors) -> torch.Tensor:
    return torch.cat([t.flatten() for t in tensors])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self")
def test_both_modes_make_the_same_update_and_only_one_recomputes(tiny_policy, tmp_path, monkeypatch):
    calls = []

    def counting(fn, *args, **kwargs):
        calls.append(fn)
        return torch.utils.checkpoint.checkpoint(fn, *args, **kwargs)

    monkeypatch.setattr(layers, "checkpoint", counting)
    trainer = float64_trainer(tiny_policy, tmp_path, "train.gradient_checkpointing=true")
    batch = fixed_batch()
    trainer.score(batch)
    trainer.compute_advantages(batch)
    timed_update(trainer, batch, recompute=False)  # as the script: AdamW's state exists from here on
    weights, optimizer = copy.deepcopy(trainer.policy.state_dict()), copy.deepcopy(trainer.optimizer.state_dict())
    grads, after, recomputations = {}, {}, {}
    for name, recompute in [*MODES.items(), ("kept again", False)]:
        restore(trainer, weights, optimizer)
        before = len(calls)
        record = timed_update(trainer, batch, recompute)
        recomputations[name] = len(calls) - before
        assert record["checkpointed"] == float(recompute) and record["s"] > 0 and record["peak_gb"] > 0
        grads[name] = flat(p.grad for p in trainer.policy.parameters())
        after[name] = flat(trainer.policy.parameters()).detach().clone()
    assert recomputations["kept"] == 0 and recomputations["recomputed"] > 0
    assert grads["kept"].abs().max() > 1e-3
    torch.testing.assert_close(grads["recomputed"], grads["kept"], rtol=1e-12, atol=1e-15)
    # each update starts from the snapshot: AdamW's moments were not stepped by the updates before it
    assert not torch.equal(after["kept"], flat(weights.values()))
    torch.testing.assert_close(after["kept again"], after["kept"], rtol=0, atol=0)
    torch.testing.assert_close(after["recomputed"], after["kept"], rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize(("tether", "trl"), [(True, True), ("auto", False), (False, False)])
def test_trl_checkpoints_its_layers_where_tether_is_told_to(tether, trl):
    from tether.config import load_config

    cfg = load_config("configs/quickstart.yaml", [f"train.gradient_checkpointing={str(tether).lower()}"])
    assert trl_gradient_checkpointing(cfg) is trl
