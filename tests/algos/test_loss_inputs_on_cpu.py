"""LossInputs: methods' per-token tensors travel in one mapping; `require` says which method adds a missing one."""

from __future__ import annotations

import pytest
import torch

from tether.algos import LossInputs


def inputs(**tokens: torch.Tensor) -> LossInputs:
    lp = torch.zeros(2, 3)
    return LossInputs(log_probs=lp, old_log_probs=lp, advantages=lp, response_mask=torch.ones(2, 3), tokens=tokens)


def test_require_returns_a_present_tensor_or_field():
    teacher = torch.full((2, 3), -1.0)
    with_teacher = inputs(teacher_log_probs=teacher)
    assert with_teacher.require("teacher_log_probs", "seed_opd") is teacher
    assert with_teacher.require("response_mask", "ppo") is with_teacher.response_mask


def test_require_names_the_missing_tensor_and_the_methods_that_add_it():
    import tether.methods  # noqa: F401  (registers the methods, which declare what they add)

    with pytest.raises(ValueError, match=r"'seed_opd' needs .*tokens\['teacher_log_probs'\].*"
                                         r"added by methods\.seed or methods\.opsd"):
        inputs().require("teacher_log_probs", "seed_opd")
    with pytest.raises(ValueError, match=r"tokens\['gate_mask'\].*added by methods\.eapo"):
        inputs(teacher_log_probs=torch.zeros(2, 3)).require("gate_mask", "eapo")
    with pytest.raises(ValueError, match=r"tokens\['nothing_adds_this'\].*no registered method"):
        inputs().require("nothing_adds_this", "mine")


def test_require_of_a_missing_optional_field_names_the_field():
    with pytest.raises(ValueError, match=r"policy loss 'kl' needs LossInputs\.ref_log_probs, which is None"):
        inputs().require("ref_log_probs", "kl")


def test_a_tensor_of_the_wrong_shape_is_refused():
    with pytest.raises(ValueError, match=r"LossInputs\.tokens\['gate_mask'\] has shape \(2, 4\)"):
        inputs(gate_mask=torch.zeros(2, 4))
