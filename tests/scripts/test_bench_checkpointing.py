"""benchmarks/bench_checkpointing.py's premise on a tiny float64 trainer: its two modes make the same update, and
only one of them recomputes the decoder layers; and bench_trl.py gives TRL layer checkpointing where tether has it."""

from __future__ import annotations

import copy
import sys

import pytest
import torch

from benchmarks.bench_checkpointing import MODES, timed_update
from benchmarks.bench_trl import trl_gradient_checkpointing
from tests.trainer.test_token_budget import fixed_batch, float64_trainer
from tether.models import layers


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
    weights, optimizer = copy.deepcopy(trainer.policy.state_dict()), copy.deepcopy(trainer.optimizer.state_dict())
    grads, recomputations = {}, {}
    for name, recompute in MODES.items():
        trainer.policy.load_state_dict(weights)
        trainer.optimizer.load_state_dict(optimizer)
        before = len(calls)
        record = timed_update(trainer, batch, recompute)
        recomputations[name] = len(calls) - before
        assert record["checkpointed"] == float(recompute) and record["s"] > 0 and record["peak_gb"] > 0
        grads[name] = torch.cat([p.grad.flatten() for p in trainer.policy.parameters()])
    assert recomputations["kept"] == 0 and recomputations["recomputed"] > 0
    assert grads["kept"].abs().max() > 1e-3
    torch.testing.assert_close(grads["recomputed"], grads["kept"], rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize(("tether", "trl"), [(True, True), ("auto", False), (False, False)])
def test_trl_checkpoints_its_layers_where_tether_is_told_to(tether, trl, tmp_path):
    from tether.config import load_config

    cfg = load_config("configs/quickstart.yaml", [f"train.gradient_checkpointing={str(tether).lower()}"])
    assert trl_gradient_checkpointing(cfg) is trl
