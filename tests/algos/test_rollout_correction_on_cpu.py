"""Rollout correction: every mode against a float64 re-derivation of its definition (verl's rollout_corr_helper for
tis / seq_is / mask_token / mask_geo_mean / seq_mean_k3, IcePop's double-sided mask), its metrics, and every
registered policy loss applying the weights (mode none: the loss tensors unchanged)."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from tether.algos import POLICY_LOSSES, ROLLOUT_CORRECTIONS, aggregate, clipped_surrogate, ppo, rollout_correction
from tether.algos.policy_losses import agg_kwargs

BOUND = 20.0  # verl's SAFETY_BOUND


def _exp(x: float) -> float:
    return math.exp(max(-BOUND, min(BOUND, x)))


def reference_weights(mode: str, rows: list[list[float]], bounds: dict[str, float]) -> list[list[float]]:
    """The weight of each token of each row, from the definitions, one float64 number at a time."""
    out = []
    for lr in rows:
        if mode == "tis":
            out.append([min(_exp(x), bounds.get("cap", 2.0)) for x in lr])
        elif mode == "seq_is":
            out.append([min(_exp(sum(lr)), bounds.get("cap", 2.0))] * len(lr))
        elif mode in ("mask_token", "mask_geo_mean"):
            upper = bounds.get("upper", 2.0)
            lower = bounds.get("lower", 1.0 / upper)
            if mode == "mask_token":
                out.append([1.0 if lower <= _exp(x) <= upper else 0.0 for x in lr])
            else:
                geo = _exp(sum(lr) / len(lr)) if lr else 1.0
                out.append([1.0 if lower <= geo <= upper else 0.0] * len(lr))
        elif mode == "mask_seq_mean":
            k3 = [_exp(x) - 1.0 - max(-BOUND, min(BOUND, x)) for x in lr]
            keep = (sum(k3) / len(k3) if k3 else 0.0) <= bounds.get("max_kl", 0.01)
            out.append([1.0 if keep else 0.0] * len(lr))
        elif mode == "icepop":
            lower, upper = bounds.get("lower", 0.5), bounds.get("upper", 5.0)
            out.append([_exp(x) if lower <= _exp(x) <= upper else 0.0 for x in lr])
        else:
            out.append([1.0] * len(lr))
    return out


def batch(rows: list[list[float]], width: int, seed: int = 0):
    """(old, behaviour, response_mask) with ``log pi_old - log mu`` equal to ``rows``; behaviour is -inf on padding,
    which must not leak into any weight."""
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(len(rows), width, generator=g, dtype=torch.float64) - 0.1
    mask = torch.zeros(len(rows), width, dtype=torch.float64)
    behaviour = torch.full_like(old, -math.inf)
    for i, lr in enumerate(rows):
        mask[i, :len(lr)] = 1.0
        behaviour[i, :len(lr)] = old[i, :len(lr)] - torch.tensor(lr, dtype=torch.float64)
    return old, behaviour, mask


# a shared case: ratios 3, 0.4 and e^0.1 on row 0, near 1 on row 1, an empty row, and a ratio beyond exp(20)
SHARED = [[math.log(3.0), math.log(0.4), 0.1], [0.05, -0.02], [], [25.0, -0.3, 0.2, 0.0]]
CASES = [("tis", {}), ("tis", {"cap": 5.0}), ("seq_is", {}), ("seq_is", {"cap": 1.2}), ("mask_token", {}),
         ("mask_token", {"lower": 0.3, "upper": 4.0}), ("mask_seq_mean", {}), ("mask_seq_mean", {"max_kl": 0.2}),
         ("mask_geo_mean", {}), ("mask_geo_mean", {"lower": 0.9, "upper": 1.05}), ("icepop", {}),
         ("icepop", {"lower": 0.35, "upper": 2.5}), ("none", {})]


def random_rows(seed: int, n: int = 6, width: int = 9) -> list[list[float]]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, width + 1, (n,), generator=g).tolist()
    return [(0.6 * torch.randn(k, generator=g, dtype=torch.float64)).tolist() for k in lengths]


@pytest.mark.parametrize(("mode", "bounds"), CASES)
@pytest.mark.parametrize("rows", [SHARED, random_rows(1), random_rows(2)], ids=["shared", "random1", "random2"])
def test_weights_and_metrics_equal_the_float64_definitions(mode, bounds, rows):
    width = max(len(r) for r in rows)
    old, behaviour, mask = batch(rows, width)
    out = rollout_correction(mode, old, behaviour, mask, mask > 0, **bounds)
    want = reference_weights(mode, rows, bounds)
    for i, row in enumerate(want):
        torch.testing.assert_close(out.weights[i, :len(row)], torch.tensor(row, dtype=torch.float64), rtol=1e-12,
                                   atol=0)
        assert torch.all(out.weights[i, len(row):] == 1.0)  # padding is not corrected
    flat_w = [w for row in want for w in row]
    flat_lr = [x for row in rows for x in row]
    m = out.metrics
    assert m["rollout_corr/weight_mean"].item() == pytest.approx(sum(flat_w) / len(flat_w), rel=1e-12)
    assert m["rollout_corr/weight_max"].item() == pytest.approx(max(flat_w), rel=1e-12)
    assert m["rollout_corr/masked_frac"].item() == pytest.approx(sum(w == 0 for w in flat_w) / len(flat_w))
    # KL(mu || pi_old) from tokens sampled from mu: k1 = E[log mu - log pi_old], k3 = E[r - 1 - log r], r = pi_old/mu
    assert m["rollout_corr/kl_k1"].item() == pytest.approx(-sum(flat_lr) / len(flat_lr), rel=1e-12)
    k3 = [_exp(x) - 1.0 - max(-BOUND, min(BOUND, x)) for x in flat_lr]
    assert m["rollout_corr/kl_k3"].item() == pytest.approx(sum(k3) / len(k3), rel=1e-12)
    assert torch.equal(out.dropped, (out.weights == 0) & (mask > 0))


def test_the_shared_case_by_hand():
    """Row 0 of the shared case, read off the definitions: ratios 3, 0.4, e^0.1 ~ 1.105."""
    old, behaviour, mask = batch(SHARED[:1], 3)
    weights = {mode: rollout_correction(mode, old, behaviour, mask, mask > 0).weights[0].tolist()
               for mode in ROLLOUT_CORRECTIONS}
    e = math.exp(0.1)
    assert weights["tis"] == pytest.approx([2.0, 0.4, e])  # the 3 truncated at the cap 2
    assert weights["seq_is"] == pytest.approx([1.2 * e] * 3)  # 3 * 0.4 * e^0.1 = 1.326 < 2
    assert weights["mask_token"] == [0.0, 0.0, 1.0]  # 3 > 2 and 0.4 < 1/2 are dropped
    assert weights["mask_geo_mean"] == [1.0] * 3  # (1.2 e^0.1)^(1/3) = 1.099 inside [0.5, 2]
    assert weights["mask_seq_mean"] == [0.0] * 3  # mean k3 = (0.901 + 0.316 + 0.005) / 3 = 0.407 > 0.01
    assert weights["icepop"] == pytest.approx([3.0, 0.0, e])  # 0.4 < 0.5 dropped, 3 kept untruncated
    assert weights["none"] == [1.0] * 3


def test_only_the_marked_tokens_are_corrected_and_log_mu_elsewhere_is_never_read():
    old, behaviour, mask = batch([[2.0, -3.0], [2.0, -3.0]], 2)
    corrected = torch.tensor([[True, True], [False, False]])  # row 1: an anchor (or gated tokens)
    behaviour[1] = -math.inf  # what a row sampled elsewhere may carry
    out = rollout_correction("mask_token", old, behaviour, mask, corrected)
    assert out.weights.tolist() == [[0.0, 0.0], [1.0, 1.0]]
    assert out.metrics["rollout_corr/corrected_frac"].item() == pytest.approx(0.5)
    assert all(torch.isfinite(v) for v in out.metrics.values())


def test_per_token_modes_correct_each_tokens_gap_for_parity():
    old, behaviour, mask = batch([[math.log(3.0), math.log(0.4), 0.1]], 3)
    tis = rollout_correction("tis", old, behaviour, mask, mask > 0)
    # untruncated tokens are moved onto pi_old; the truncated one keeps log(3 / 2) of its gap
    torch.testing.assert_close(tis.effective_log_probs - old,
                               torch.tensor([[-math.log(1.5), 0.0, 0.0]], dtype=torch.float64))
    masked = rollout_correction("mask_token", old, behaviour, mask, mask > 0)
    assert torch.equal(masked.effective_log_probs, behaviour)  # a mask leaves the kept tokens' gap as it was
    assert masked.dropped.tolist() == [[True, True, False]]


@pytest.mark.parametrize(("mode", "bounds", "match"), [
    ("tis", {"cap": 0.5}, "cap must be >= 1"), ("seq_is", {"cap": 0.9}, "cap must be >= 1"),
    ("mask_token", {"upper": 0.8}, "0 <= lower < 1 < upper"), ("icepop", {"lower": 1.5}, "0 <= lower < 1 < upper"),
    ("mask_geo_mean", {"lower": -0.1}, "0 <= lower"), ("mask_seq_mean", {"max_kl": 0.0}, "max_kl must be > 0")])
def test_bounds_that_do_not_hold_the_on_policy_ratio_are_refused(mode, bounds, match):
    old, behaviour, mask = batch([[0.1]], 1)
    with pytest.raises(ValueError, match=match):
        rollout_correction(mode, old, behaviour, mask, mask > 0, **bounds)


@pytest.mark.parametrize("name", sorted(POLICY_LOSSES))
def test_every_policy_loss_applies_the_token_weights(name, make_inputs):
    inputs = make_inputs(seed=3)
    fn = POLICY_LOSSES[name]
    base = fn(inputs).loss
    doubled = fn(dataclasses.replace(inputs, token_weights=torch.full_like(inputs.log_probs, 2.0))).loss
    torch.testing.assert_close(doubled, 2.0 * base, rtol=1e-12, atol=1e-15)
    # weight 0 on rows 0-1: their tokens give no gradient; the others' gradient is unchanged
    weights = torch.ones_like(inputs.log_probs)
    weights[:2] = 0.0
    grad_all, = torch.autograd.grad(fn(inputs).loss, inputs.log_probs)
    grad_some, = torch.autograd.grad(fn(dataclasses.replace(inputs, token_weights=weights)).loss, inputs.log_probs)
    assert torch.all(grad_some[:2] == 0)
    torch.testing.assert_close(grad_some[2:], grad_all[2:], rtol=1e-12, atol=1e-15)


def test_without_weights_the_loss_is_bit_identical_to_the_uncorrected_formula(make_inputs):
    """mode none: the trainer passes no weights, and the loss is the same tensor computation as before."""
    inputs = make_inputs(seed=4, dtype=torch.float32)
    assert inputs.weighted(inputs.log_probs) is inputs.log_probs
    log_ratio = inputs.log_probs - inputs.old_log_probs
    s = clipped_surrogate(log_ratio, inputs.advantages, clip_low=0.2, clip_high=0.28)
    want = aggregate(s.loss, inputs.response_mask, "token-mean", **agg_kwargs(inputs))
    assert torch.equal(ppo(inputs, clip_high=0.28).loss, want)
