"""RolloutBatch select/concat/to: padding, key handling, row order, device moves."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from tether.rollout.batch import RolloutBatch


def make(n: int, width: int, start: int, **token: torch.Tensor) -> RolloutBatch:
    return RolloutBatch(
        prompt_ids=[[start + i] for i in range(n)],
        response_ids=torch.arange(start, start + n * width).view(n, width),
        response_mask=torch.ones(n, width), sample_log_probs=-torch.ones(n, width),
        group_ids=torch.arange(start, start + n), rewards=torch.arange(n).float(),
        correct=torch.zeros(n, dtype=torch.bool), source=torch.zeros(n, dtype=torch.long),
        token=dict(token), info={"text": [f"r{start + i}" for i in range(n)]})


def test_concat_pads_to_the_widest_and_keeps_row_order():
    out = RolloutBatch.concat([make(2, 3, 0), make(1, 5, 10)])
    assert out.response_ids.shape == (3, 5)
    assert out.response_mask.sum(1).tolist() == [3, 3, 5]
    assert out.response_ids[0, 3:].tolist() == [0, 0]
    assert out.info["text"] == ["r0", "r1", "r10"] and out.prompt_ids == [[0], [1], [10]]


def test_concat_zero_fills_token_tensors_a_batch_lacks():
    gated = make(1, 2, 0, gate_mask=torch.ones(1, 2))
    out = RolloutBatch.concat([gated, make(2, 4, 5)])
    assert out.token["gate_mask"].tolist() == [[1, 1, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0]]


def test_concat_refuses_different_info_keys_and_empty_input():
    other = make(1, 2, 0)
    other.info = {"answer": ["x"]}
    with pytest.raises(ValueError, match="info keys"):
        RolloutBatch.concat([make(1, 2, 0), other])
    with pytest.raises(ValueError, match="non-empty"):
        RolloutBatch.concat([])


def test_select_reorders_every_field_consistently():
    b = make(3, 2, 0, old_log_probs=torch.arange(6.0).view(3, 2))
    s = b.select([2, 0])
    assert s.group_ids.tolist() == [2, 0] and s.info["text"] == ["r2", "r0"]
    assert s.token["old_log_probs"].tolist() == [[4, 5], [0, 1]] and s.prompt_ids == [[2], [0]]


def tensors_of(batch: RolloutBatch) -> dict[str, torch.Tensor]:
    """Every tensor the batch holds, by field name (``token.<key>`` for per-token extras), found by iterating
    the dataclass fields: a tensor field added later is covered without editing this test."""
    out = {}
    for f in dataclasses.fields(batch):
        value = getattr(batch, f.name)
        if isinstance(value, torch.Tensor):
            out[f.name] = value
        elif isinstance(value, dict):
            out.update({f"{f.name}.{k}": v for k, v in value.items() if isinstance(v, torch.Tensor)})
    return out


def test_to_moves_every_tensor_and_shares_the_python_fields():
    b = make(3, 2, 0, old_log_probs=torch.zeros(3, 2), gate_mask=torch.ones(3, 2))
    moved = b.to(torch.device("meta"))  # a second device on any machine: tensors keep shape and dtype only
    before, after = tensors_of(b), tensors_of(moved)
    assert set(after) == set(before) and len(before) == 9  # 7 fields + 2 token entries
    for name, t in after.items():
        assert t.device.type == "meta", name
        assert (t.dtype, t.shape) == (before[name].dtype, before[name].shape), name
        assert before[name].device.type == "cpu", name  # the source batch is untouched
    assert moved.prompt_ids is b.prompt_ids and moved.info is b.info
    assert moved.token is not b.token  # a new dict: adding a key to one batch leaves the other alone


def test_to_the_device_it_is_on_is_the_batch_itself():
    b = make(2, 3, 0, old_log_probs=torch.zeros(2, 3))
    before = tensors_of(b)
    assert b.to("cpu") is b and b.to(torch.device("cpu")) is b
    assert all(t is before[name] for name, t in tensors_of(b).items())


def test_to_moves_a_batch_only_partly_on_the_device():
    b = make(2, 3, 0, old_log_probs=torch.zeros(2, 3)).to(torch.device("meta"))
    b.token["ref_log_probs"] = torch.zeros(2, 3)  # added on the wrong device
    moved = b.to(torch.device("meta"))
    assert moved is not b and {t.device.type for t in tensors_of(moved).values()} == {"meta"}


def test_row_lengths_end_at_the_last_response_token_and_narrow_cuts_every_per_token_tensor():
    batch = make(3, 5, 0, gate_mask=torch.ones(3, 5))
    batch.prompt_ids[1] = [7, 8, 9]
    batch.response_mask = torch.tensor([[1.0, 1, 0, 0, 0], [1, 0, 1, 0, 0], [0, 0, 0, 0, 0]])  # a hole, an empty row
    assert batch.row_lengths() == [(1, 2), (3, 3), (1, 0)]
    cut = batch.narrow(3)
    for t in (cut.response_ids, cut.response_mask, cut.sample_log_probs, cut.token["gate_mask"]):
        assert t.shape == (3, 3)
    assert torch.equal(cut.response_ids, batch.response_ids[:, :3]) and cut.rewards is batch.rewards
    assert batch.narrow(5) is batch
