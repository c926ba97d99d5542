"""rollout.correction in the trainer: refused before any model loads when it cannot apply, logged every step, and read
by health parity (the gap left after correction; dropped tokens count as mismatches)."""

from __future__ import annotations

import copy

import pytest
import torch

from tests.distributed.helpers import fixed_batch
from tests.engine.helpers import CopyEngine
from tests.trainer.helpers import ANCHORS, tiny_config, update_with_anchors
from tether.algos import LossOutput, register_policy_loss
from tether.algos.registry import POLICY_LOSSES
from tether.config import ConfigError, ParityConfig, RolloutConfig
from tether.distributed.data_parallel import DataParallel
from tether.health import ParityCheck
from tether.rollout.batch import RolloutBatch
from tether.trainer import Trainer

CORR_KEYS = ("rollout_corr/weight_mean", "rollout_corr/weight_max", "rollout_corr/masked_frac",
             "rollout_corr/kl_k1", "rollout_corr/kl_k3")


@pytest.mark.parametrize(("overrides", "match"), [
    (("rollout.correction.mode=tiss",), r"rollout.correction.mode: unknown rollout correction 'tiss'; known: icepop"),
    (("rollout.correction.mode=tis", "rollout.correction.lower=0.5"),
     r"rollout.correction.lower: mode tis does not take it; it takes: cap"),
    (("rollout.correction.mode=mask_seq_mean", "rollout.correction.cap=3"),
     r"rollout.correction.cap: mode mask_seq_mean does not take it; it takes: max_kl"),
    (("rollout.correction.mode=icepop", "rollout.correction.upper=0.9"),
     r"rollout.correction \(icepop\): the bounds must satisfy 0 <= lower < 1 < upper"),
    (("rollout.correction.mode=tis", "rollout.correction.cap=0.5"), r"rollout.correction \(tis\): cap must be >= 1"),
    (("rollout.correction.cap=2",), r"rollout.correction.cap: mode none does not take it; it takes: \(no bound\)"),
])
def test_a_correction_that_cannot_apply_is_refused_before_any_model_loads(tmp_path, overrides, match):
    with pytest.raises(ConfigError, match=match):
        tiny_config(tmp_path, *overrides)


@pytest.fixture
def loss_ignoring_weights():
    @register_policy_loss("ignores_weights")
    def ignores_weights(inputs, *, agg: str = "token-mean") -> LossOutput:
        return LossOutput(-(inputs.advantages * inputs.log_probs * inputs.response_mask).sum())

    yield
    POLICY_LOSSES.unregister("ignores_weights")


def test_a_loss_that_does_not_apply_the_weights_is_refused(tmp_path, loss_ignoring_weights):
    tiny_config(tmp_path, "algorithm.policy_loss=ignores_weights")  # fine without a correction
    with pytest.raises(ConfigError, match=r"algorithm.policy_loss=ignores_weights does not apply the correction's "
                                          "weights"):
        tiny_config(tmp_path, "algorithm.policy_loss=ignores_weights", "rollout.correction.mode=tis")


@pytest.mark.parametrize("mode", ["tis", "seq_is", "mask_token", "mask_seq_mean", "mask_geo_mean", "icepop"])
def test_every_mode_trains_and_logs_its_metrics(tmp_path, tiny_policy, mode):
    model, tok = tiny_policy
    trainer = Trainer(tiny_config(tmp_path, f"rollout.correction.mode={mode}", "train.steps=2"), policy=model,
                      tokenizer=tok)
    for _ in range(2):
        metrics = trainer.train_step()
        # the in-process engine samples with the trainer's own weights: every ratio is 1 up to float32 rounding
        assert metrics["rollout_corr/weight_mean"] == pytest.approx(1.0, abs=1e-4)
        assert metrics["rollout_corr/masked_frac"] == 0.0
        assert abs(metrics["rollout_corr/kl_k1"]) < 1e-4 and 0.0 <= metrics["rollout_corr/kl_k3"] < 1e-6
        assert metrics["health/logprob_mismatch_frac"] == 0.0
        assert metrics["health/logprob_residual_mean"] < 1e-4


def test_tis_keeps_the_loss_of_an_on_policy_batch(tmp_path, tiny_policy):
    """Weights within float32 rounding of 1: the corrected loss equals the uncorrected one to that rounding."""
    losses = []
    for mode in ("none", "tis"):
        model, tok = tiny_policy
        trainer = Trainer(tiny_config(tmp_path / mode, f"rollout.correction.mode={mode}"), policy=copy.deepcopy(model),
                          tokenizer=tok)
        losses.append(trainer.train_step()["actor/pg_loss"])
    assert losses[1] == pytest.approx(losses[0], abs=1e-5)


def _rows(sample_lp: list[list[float]]) -> RolloutBatch:
    lp = torch.tensor(sample_lp)
    n, t = lp.shape
    return RolloutBatch(prompt_ids=[[1]] * n, response_ids=torch.zeros(n, t, dtype=torch.long),
                        response_mask=torch.ones(n, t), sample_log_probs=lp, group_ids=torch.zeros(n, dtype=torch.long),
                        rewards=torch.zeros(n), correct=torch.zeros(n, dtype=torch.bool),
                        source=torch.zeros(n, dtype=torch.long))


def test_parity_judges_the_gap_left_after_correction():
    from tether.algos import rollout_correction

    trainer_lp = torch.full((2, 2), -1.0)
    # a bfloat16-like engine: gaps of 0.3 and -0.2 nats, above the 0.1 tolerance, inside tis's cap of 2
    micro = _rows([[-1.3, -0.8], [-1.0, -1.0]])
    dp = DataParallel()
    plain = ParityCheck(ParityConfig(tolerance=0.1), RolloutConfig())
    plain.observe(micro, trainer_lp)
    assert plain.finish(dp)["health/logprob_mismatch_frac"] == pytest.approx(0.5)
    check = ParityCheck(ParityConfig(tolerance=0.1), RolloutConfig())
    mask = micro.response_mask > 0
    tis = rollout_correction("tis", trainer_lp, micro.sample_log_probs, micro.response_mask, mask)
    check.observe(micro, trainer_lp, tis)
    metrics = check.finish(dp)
    assert metrics["health/logprob_mismatch_frac"] == 0.0  # each token's weight removes its gap
    assert metrics["health/logprob_diff_mean"] == pytest.approx(0.5 / 4)  # the raw gap is still reported
    assert metrics["health/logprob_residual_mean"] < 1e-6
    masked = rollout_correction("mask_token", trainer_lp, micro.sample_log_probs, micro.response_mask, mask,
                                upper=1.3)
    # ratio exp(0.3) = 1.35 > 1.3: dropped (a mismatch); exp(-0.2) = 0.82 >= 1/1.3: kept with its gap 0.2 > 0.1
    check.observe(micro, trainer_lp, masked)
    metrics = check.finish(dp)
    assert metrics["health/logprob_mismatch_frac"] == pytest.approx(0.5)
    assert metrics["health/logprob_residual_mean"] == pytest.approx(0.2 / 3)


def test_a_stale_engine_under_a_mask_still_stops_the_run(tmp_path, tiny_policy):
    """The dropped tokens count as mismatches: a mask cannot hide an engine that never gets the weights."""

    class Stale(CopyEngine):
        def load_weights(self, state_dict: dict[str, torch.Tensor]) -> None:
            self.loads += 1

    model, tok = tiny_policy
    cfg = tiny_config(tmp_path, "train.steps=4", "optim.lr=0.05", "health.parity.patience=0",
                      "rollout.correction.mode=mask_token", "rollout.correction.upper=1.01")
    trainer = Trainer(cfg, policy=model, tokenizer=tok)
    trainer.use_engine(Stale(trainer.policy, trainer.tokenizer))
    trainer.train_step()
    metrics = trainer.train_step()
    assert metrics["rollout_corr/masked_frac"] > 0.05
    assert metrics["health/logprob_mismatch_frac"] > 0.05


def test_the_corrected_share_is_of_every_response_token_whatever_the_micro_batches(tmp_path, tiny_policy):
    """rollout_corr/corrected_frac (corrected tokens / response tokens) was folded over micro-batches weighted by the
    loss's tokens: with algorithm.mask_truncated a micro-batch of one truncated row weighed nothing, and the share
    moved with optim.micro_batch_size (0.5 against 0.71 on two micro-batches)."""
    batch = fixed_batch()
    anchors = torch.zeros(len(batch), dtype=torch.bool)
    anchors[ANCHORS] = True
    response = batch.response_mask > 0
    want = (response & ~anchors[:, None]).sum() / response.sum()
    old = -torch.rand(batch.response_mask.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    for micro in (1, 5):
        got = update_with_anchors(tiny_policy, tmp_path / str(micro), micro, "rollout.correction.mode=tis",
                                  "algorithm.mask_truncated=true", old_log_probs=old, sample_log_probs=old - 0.1,
                                  truncated=(0, 4))
        assert got["rollout_corr/corrected_frac"] == pytest.approx(want.item(), abs=1e-6), micro


def test_corrected_token_means_are_over_every_corrected_token_whatever_the_micro_batches(tmp_path, tiny_policy):
    """The corrected tokens exclude anchors (rows the reference sampled): here rows 1, 3 and 7 of the fixed batch.
    rollout_corr/weight_mean, masked_frac, kl_k1 and kl_k3 are means over corrected tokens; they were folded over
    micro-batches weighted by response tokens and over mini-batches equally, so a micro-batch of one anchor, whose
    means are 0, pulled them toward 0: with one row per micro-batch weight_mean was 0.81 against 1.10 over the
    corrected tokens (masked_frac 0.28 against 0.39), and 1.12 with one micro-batch per mini-batch."""
    batch = fixed_batch()
    anchors = torch.zeros(len(batch), dtype=torch.bool)
    anchors[ANCHORS] = True
    g = torch.Generator().manual_seed(1)
    old = -torch.rand(batch.response_mask.shape, generator=g, dtype=torch.float64) * 3
    log_ratio = torch.rand(old.shape, generator=g, dtype=torch.float64) * 3.5 - 1.5  # exp: 0.22 to 7.4
    corrected = (batch.response_mask > 0) & ~anchors[:, None]
    ratio = log_ratio.exp()
    weight = torch.where((ratio >= 0.5) & (ratio <= 5.0), ratio, torch.zeros_like(ratio))  # icepop's defaults
    want = {"rollout_corr/weight_mean": weight[corrected].mean(), "rollout_corr/masked_frac": (weight == 0)[corrected]
            .double().mean(), "rollout_corr/kl_k1": -log_ratio[corrected].mean(),
            "rollout_corr/kl_k3": (ratio - 1 - log_ratio)[corrected].mean()}
    assert 0.05 < want["rollout_corr/masked_frac"] < 0.5
    for micro in (1, 5):
        got = update_with_anchors(tiny_policy, tmp_path / str(micro), micro, "rollout.correction.mode=icepop",
                                  old_log_probs=old, sample_log_probs=old - log_ratio)
        for key, value in want.items():
            assert got[key] == pytest.approx(value.item(), abs=1e-5), (micro, key)
