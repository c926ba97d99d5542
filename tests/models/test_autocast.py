"""``model.bf16_autocast`` is one context, tether.models.autocast, in every forward pass: the trainer's, the SFT loop's
and the in-process engine's decoding, so the engine samples in the precision the trainer scores in."""

from __future__ import annotations

import types
from typing import Any

import pytest
import torch

from tether.engine import hf
from tether.engine.hf import KVDecoder
from tether.models import autocast
from tether.recipes import sft
from tether.trainer import build, step

CPU = torch.device("cpu")


def precision() -> tuple[bool, torch.dtype]:
    """Whether autocast is on, and the dtype a float32 matmul runs in here."""
    return torch.is_autocast_enabled("cpu"), (torch.ones(2, 2) @ torch.ones(2, 2)).dtype


class Recorder(torch.nn.Module):
    """A causal LM's forward that records the precision it ran under."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(1))
        self.seen: list[tuple[bool, torch.dtype]] = []

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor,
                past_key_values: Any = None, use_cache: bool = True) -> Any:
        self.seen.append(precision())
        return types.SimpleNamespace(logits=torch.zeros(input_ids.shape[0], 1, 3))


def trainer_pass(flag: bool) -> tuple[bool, torch.dtype]:
    trainer = types.SimpleNamespace(cfg=types.SimpleNamespace(model=types.SimpleNamespace(bf16_autocast=flag)),
                                    device=CPU)
    with build.TrainerBuild.autocast.fget(trainer)():
        return precision()


def sft_pass(flag: bool, monkeypatch: pytest.MonkeyPatch) -> tuple[bool, torch.dtype]:
    seen = []
    monkeypatch.setattr(sft, "nll_sum", lambda *args: seen.append(precision()) or torch.tensor(0.0))
    sft.evaluate_nll(Recorder(), [([1], [2])], pad_id=0, micro=1, bf16_autocast=flag)
    return seen[0]


def engine_pass(flag: bool) -> tuple[bool, torch.dtype]:
    model, ids = Recorder(), torch.zeros(1, 1, dtype=torch.long)
    KVDecoder(model, bf16_autocast=flag).next_logits(ids, ids, ids, None)
    return model.seen[0]


def test_every_forward_pass_takes_its_precision_from_one_context():
    assert build.autocast is sft.autocast is hf.autocast is autocast
    # scoring's passes take the trainer's own context (TrainerBuild.autocast), not one built again
    assert "autocast" not in vars(step)


@pytest.mark.parametrize("flag", [False, True])
def test_the_trainer_sft_and_engine_passes_run_in_the_same_precision(flag, monkeypatch):
    expected = (True, torch.bfloat16) if flag else (False, torch.float32)
    assert trainer_pass(flag) == sft_pass(flag, monkeypatch) == engine_pass(flag) == expected
    # inside a caller's own bfloat16 region, model.bf16_autocast=false leaves the caller's precision to every pass
    # alike (the engine's decoder used to switch autocast off there, the trainer's and the SFT loop's did not)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert trainer_pass(flag) == sft_pass(flag, monkeypatch) == engine_pass(flag) == (True, torch.bfloat16)
