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
    pushed.engine = OwnCopyLike(pushed.engine)
    shared = Trainer(tiny_config(tmp_path / "shared", *overrides), policy=copy.deepcopy(model), tokenizer=tok)
    built = counted_state_dicts(monkeypatch)
    expected = [without_timings(pushed.train_step()) for _ in range(2)]
    assert len(built) == 4  # the policy's and the engine's, each step
    built.clear()
    got = [without_timings(shared.train_step()) for _ in range(2)]
    assert built == []
    assert got == expected
    assert torch.equal(params(shared.policy), params(pushed.policy))
