"""The work of one RL step, counted rather than timed: state dicts built, forward passes of each model. A pass the
math does not need is waste that no timing on a shared machine shows reliably; a count does, and the results must not
move when it goes."""

from __future__ import annotations

import copy

import pytest
import torch

from tests.trainer.helpers import tiny_config
from tether.trainer import Trainer


def counted_state_dicts(monkeypatch) -> list[str]:
    """Records the class of every module whose ``state_dict()`` is built from here on (top-level calls only)."""
    built, depth, original = [], [0], torch.nn.Module.state_dict

    def state_dict(self, *args, **kwargs):
        if depth[0] == 0:
            built.append(type(self).__name__)
        depth[0] += 1
        try:
            return original(self, *args, **kwargs)
        finally:
            depth[0] -= 1

    monkeypatch.setattr(torch.nn.Module, "state_dict", state_dict)
    return built


class OwnCopyLike:
    """The trainer's engine seen as one with weights of its own (no ``model`` attribute): every push builds and sends
    the policy's state dict, which the in-process engine then finds to be its own tensors."""

    def __init__(self, engine) -> None:
        self.inner = engine

    def generate(self, *args, **kwargs):
        return self.inner.generate(*args, **kwargs)

    def load_weights(self, state_dict) -> None:
        self.inner.load_weights(state_dict)


def params(model) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def without_timings(metrics: dict[str, float]) -> dict[str, float]:
    return {k: v for k, v in metrics.items() if not k.startswith("perf/")}


@pytest.mark.parametrize("lora", [False, True])
def test_the_in_process_engine_gets_no_weight_push(tmp_path, tiny_policy, monkeypatch, lora):
    """The engine samples with the policy module itself: pushing its weights built the policy's state dict and then
    the engine's own, to find the same tensors, every step (2 builds a step, plain or LoRA). Now none; the two steps'
    metrics and weights are bit for bit those of pushing."""
    overrides = ["model.lora.rank=4"] if lora else []
    model, tok = tiny_policy
    pushed = Trainer(tiny_config(tmp_path / "pushed", *overrides), policy=copy.deepcopy(model), tokenizer=tok)
    pushed.use_engine(OwnCopyLike(pushed.engine))
    shared = Trainer(tiny_config(tmp_path / "shared", *overrides), policy=copy.deepcopy(model), tokenizer=tok)
    built = counted_state_dicts(monkeypatch)
    expected = [without_timings(pushed.train_step()) for _ in range(2)]
    assert len(built) == 4  # the policy's and the engine's, each step
    built.clear()
    got = [without_timings(shared.train_step()) for _ in range(2)]
    assert built == []
    assert got == expected
    assert torch.equal(params(shared.policy), params(pushed.policy))


ARMOR = ["algorithm.policy_loss=armor", "algorithm.loss_kwargs={alpha: 0.75}"]


def armor_step(run_dir, tiny_policy, kl_metrics: bool) -> tuple[dict, torch.Tensor, list[str], object, torch.Tensor]:
    """One ARMOR step against a reference moved away from the policy: (metrics, weights, the phase of each policy
    forward, the batch, its pi_old in float64, scored before the update)."""
    model, tok = tiny_policy
    overrides = [*ARMOR, f"methods.armor={{ref_n: 4, kl_metrics: {str(kl_metrics).lower()}}}"]
    trainer = Trainer(tiny_config(run_dir, *overrides), policy=copy.deepcopy(model), tokenizer=tok)
    with torch.no_grad():  # a reference away from the policy: the drift is not 0
        for p in trainer.ref_policy.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(1)))
    phase, passes, seen, score = ["other"], [], [], trainer.score
    trainer.policy.model.register_forward_pre_hook(lambda *_: passes.append(phase[0]))

    def scored(batch):
        seen[:] = [batch, trainer.log_probs(trainer.policy, batch).double()]
        phase[0] = "score"
        try:
            return score(batch)
        finally:
            phase[0] = "other"

    trainer.score = scored
    metrics = without_timings(trainer.train_step())
    return metrics, params(trainer.policy), passes, *seen


def test_armor_drift_metrics_cost_no_policy_pass_with_one_optimiser_step(tmp_path, tiny_policy):
    """With one optimiser step the trainer skips scoring pi_old, and ARMOR's kl_on_old / kl_on_ref ran that pass
    itself (3 no-grad policy forwards over the 12 rows here, as many as the update's). They now come from the update's
    own detached forward: no policy pass in scoring, the same values (against a direct float64 token mean), and the
    run's weights and other metrics bit for bit those of a run without the metrics."""
    metrics, weights, passes, batch, old = armor_step(tmp_path / "kl", tiny_policy, True)
    plain, plain_weights, _, _, _ = armor_step(tmp_path / "plain", tiny_policy, False)
    assert "score" not in passes
    assert torch.equal(weights, plain_weights)
    drift = {k: metrics.pop(k) for k in ("armor/kl_on_old", "armor/kl_on_ref")}
    assert metrics == plain
    ref, mask = batch.token["ref_log_probs"].double(), batch.response_mask.double()
    anchor = (batch.source == 1).double()[:, None] * mask
    on = mask - anchor
    assert anchor.sum() > 0 and on.sum() > 0 and abs(drift["armor/kl_on_old"]) > 1e-3
    assert drift["armor/kl_on_old"] == pytest.approx(float(((old - ref) * on).sum() / on.sum()), rel=1e-5)
    assert drift["armor/kl_on_ref"] == pytest.approx(float(((ref - old) * anchor).sum() / anchor.sum()), rel=1e-5)
