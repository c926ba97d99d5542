"""Shared builders for the tether.algos tests: random LossInputs with every optional field and method tensor filled."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from tether.algos import ADVANTAGES, POLICY_LOSSES, LossInputs


def random_inputs(batch: int = 6, length: int = 7, *, seed: int = 0, dtype: torch.dtype = torch.float64,
                  drift: float = 0.3) -> LossInputs:
    """A micro-batch with ragged lengths (one row empty), all optional fields and the methods' per-token tensors,
    log_probs a leaf."""
    g = torch.Generator().manual_seed(seed)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g, dtype=dtype)

    old = -rand(batch, length).abs() - 0.05  # log-probs are < 0
    lengths = torch.randint(1, length + 1, (batch,), generator=g)
    lengths[batch // 2] = 0  # a fully padded row must not disturb anything
    mask = (torch.arange(length)[None, :] < lengths[:, None]).to(dtype)
    return LossInputs(
        log_probs=(old + drift * rand(batch, length)).requires_grad_(),
        old_log_probs=old,
        advantages=rand(batch, 1).expand(batch, length).contiguous(),
        response_mask=mask,
        ref_log_probs=old + 0.5 * rand(batch, length),
        behaviour_log_probs=old + 0.5 * rand(batch, length),
        source=(torch.arange(batch) % 3 == 2).long(),
        num_tokens=float(mask.sum()),
        num_seqs=float((mask.sum(-1) > 0).sum()),
        max_response_len=length + 3,
        tokens={"gate_mask": (torch.rand(batch, length, generator=g) < 0.3).to(dtype),
                "injected_mask": (torch.rand(batch, length, generator=g) < 0.3).to(dtype),
                "teacher_log_probs": old + 0.5 * rand(batch, length)},
    )


def select_rows(inputs: LossInputs, rows: slice, log_probs: torch.Tensor) -> LossInputs:
    """Rows of ``inputs`` as a micro-batch (keeping the global normalisers), with the given log_probs."""
    fields = {}
    for f in dataclasses.fields(inputs):
        value = getattr(inputs, f.name)
        fields[f.name] = value[rows] if isinstance(value, torch.Tensor) else value
    fields["tokens"] = {name: value[rows] for name, value in inputs.tokens.items()}
    fields["log_probs"] = log_probs[rows]
    return LossInputs(**fields)


@pytest.fixture
def restore_registries():
    """Snapshot both registries and put them back, whatever the test registers or removes."""
    with ADVANTAGES.restored(), POLICY_LOSSES.restored():
        yield


@pytest.fixture
def make_inputs():
    """:func:`random_inputs`, as a fixture."""
    return random_inputs


@pytest.fixture
def micro_batch():
    """:func:`select_rows`, as a fixture."""
    return select_rows
