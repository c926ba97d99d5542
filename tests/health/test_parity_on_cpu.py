"""Engine-trainer parity: exact on a healthy run (temperature and top-p included), loud on stale engine weights."""

from __future__ import annotations

import json
import math

import pytest
import torch

from tests.engine.helpers import CopyEngine
from tests.trainer.helpers import tiny_config
from tether.config import ParityConfig, RolloutConfig
from tether.distributed.data_parallel import DataParallel
from tether.health import HealthError, ParityCheck, allowed_gap, parity_excess
from tether.rollout.batch import RolloutBatch
from tether.trainer import Trainer

KEYS = ("health/logprob_diff_mean", "health/logprob_diff_max", "health/logprob_mismatch_frac")


class StaleEngine(CopyEngine):
    """Holds its own copy of the weights and ignores every push: verl #7495's engine."""

    def load_weights(self, state_dict: dict[str, torch.Tensor]) -> None:
        self.loads += 1


def rows(sample_lp: list[list[float]], source: list[int] | None = None, gate: list[list[float]] | None = None):
    lp = torch.tensor(sample_lp)
    n, t = lp.shape
    token = {} if gate is None else {"gate_mask": torch.tensor(gate)}
    return RolloutBatch(prompt_ids=[[1]] * n, response_ids=torch.zeros(n, t, dtype=torch.long),
                        response_mask=torch.ones(n, t), sample_log_probs=lp, group_ids=torch.zeros(n, dtype=torch.long),
                        rewards=torch.zeros(n), correct=torch.zeros(n, dtype=torch.bool),
                        source=torch.tensor(source or [0] * n), token=token)


def test_the_allowed_gap_follows_the_truncation_of_the_sampling_distribution():
    assert allowed_gap(1.0, 0) == (0.0, 0.0)
    assert allowed_gap(0.25, 0) == pytest.approx((0.0, math.log(4)))
    assert allowed_gap(1.0, 5) == (0.0, math.inf)
    trainer_lp = torch.tensor([-1.0, -1.0, -1.0, -1.0])
    sample_lp = torch.tensor([-1.0, -0.5, -1.3, 0.5])  # gaps 0, 0.5, -0.3, 1.5
    torch.testing.assert_close(parity_excess(sample_lp, trainer_lp, 0.0, 0.0), torch.tensor([0.0, 0.5, 0.3, 1.5]))
    # top-p 0.25: renormalising raises a kept token's log-prob by up to log 4 = 1.386, never lowers it
    torch.testing.assert_close(parity_excess(sample_lp, trainer_lp, 0.0, math.log(4)),
                               torch.tensor([0.0, 0.0, 0.3, 1.5 - math.log(4)]))


def test_check_counts_only_on_policy_tokens_no_intervention_reweighted_and_stops_after_patience():
    check = ParityCheck(ParityConfig(tolerance=0.1, max_mismatch_frac=0.2, patience=2), RolloutConfig())
    dp = DataParallel()
    trainer_lp = torch.full((3, 2), -1.0)
    # row 0 matches; row 1 is an anchor (source 1, from the reference); row 2's first token was gated (EAPO)
    healthy = rows([[-1.0, -1.05], [-3.0, -3.0], [-4.0, -1.0]], source=[0, 1, 0],
                   gate=[[0, 0], [0, 0], [1, 0]])
    check.observe(healthy, trainer_lp)
    metrics = check.finish(dp)
    assert metrics["health/logprob_mismatch_frac"] == 0.0
    assert metrics["health/logprob_diff_mean"] == pytest.approx(0.05 / 3)  # over the 3 compared tokens
    assert metrics["health/logprob_diff_max"] == pytest.approx(0.05)
    stale = rows([[-1.5, -1.0], [-1.0, -1.0], [-1.0, -1.0]])  # 1 of 6 tokens off: under the bound
    check.observe(stale, trainer_lp)
    assert check.finish(dp)["health/logprob_mismatch_frac"] == pytest.approx(1 / 6)
    assert check.bad_steps == 0
    very_stale = rows([[-1.5, -1.5], [-1.0, -1.0], [-1.0, -1.0]])
    for step in range(2):
        check.observe(very_stale, trainer_lp[:, :1].expand(3, 2))
        assert check.finish(dp)["health/logprob_mismatch_frac"] == pytest.approx(2 / 6)
        assert (check.failure is None) == (step == 0)
    assert "weights" in check.failure and "2 steps in a row" in check.failure
    assert check.finish(dp) == {}  # nothing observed: nothing to judge


def make_trainer(tmp_path, tiny_policy, *overrides):
    model, tok = tiny_policy
    cfg = tiny_config(tmp_path, "train.steps=3", "optim.lr=0.05", *overrides)
    return Trainer(cfg, policy=model, tokenizer=tok)


@pytest.mark.parametrize("sampling", [("rollout.temperature=1.0",),
                                      ("rollout.temperature=0.7", "rollout.top_p=0.8", "optim.mini_batches=2")])
def test_a_healthy_run_has_parity(tmp_path, tiny_policy, sampling):
    """Temperature and top-p are compared like with like; with two mini-batches pi_old is the separate pass."""
    trainer = make_trainer(tmp_path, tiny_policy, *sampling)
    for _ in range(3):
        metrics = trainer.train_step()
        assert metrics["health/logprob_mismatch_frac"] == 0.0
        if "rollout.top_p=0.8" in sampling:  # renormalised over the nucleus: a raw gap above the tolerance...
            assert metrics["health/logprob_diff_mean"] > trainer.cfg.health.parity.tolerance
            assert metrics["health/logprob_diff_max"] <= -math.log(0.8) + 1e-4  # ...inside [0, -log top_p]
        else:
            assert metrics["health/logprob_diff_max"] < 1e-4  # float32, KV cache vs one full pass
    logged = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert all(key in logged[-1] for key in KEYS)


def test_an_engine_that_never_receives_the_weights_stops_the_run(tmp_path, tiny_policy):
    trainer = make_trainer(tmp_path, tiny_policy, "health.parity.patience=2")
    trainer.use_engine(StaleEngine(trainer.policy, trainer.tokenizer))
    first = trainer.train_step()  # the copy still equals the policy: nothing is wrong yet
    assert first["health/logprob_mismatch_frac"] == 0.0
    second = trainer.train_step()  # the policy has moved, the engine has not
    assert second["health/logprob_mismatch_frac"] > 0.05
    with pytest.raises(HealthError, match="never received the new weights"):
        trainer.train_step()
    assert trainer.engine.loads == 3  # it was asked every step
    logged = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in logged] == [1, 2, 3]  # the failing step's numbers were logged first


def test_patience_zero_only_logs(tmp_path, tiny_policy):
    trainer = make_trainer(tmp_path, tiny_policy, "health.parity.patience=0")
    trainer.use_engine(StaleEngine(trainer.policy, trainer.tokenizer))
    for _ in range(3):
        metrics = trainer.train_step()
    assert metrics["health/logprob_mismatch_frac"] > 0.05


def test_a_good_step_resets_the_bad_count_and_both_thresholds_are_strict():
    """A token mismatches when its excess is *above* ``tolerance``, a step is bad when its mismatch share is *above*
    ``max_mismatch_frac``, and ``patience`` counts bad steps *in a row* (gaps exact in binary: the boundaries are
    hit exactly)."""
    check = ParityCheck(ParityConfig(tolerance=0.5, max_mismatch_frac=0.25, patience=2), RolloutConfig())
    dp, trainer_lp = DataParallel(), torch.full((1, 4), -1.0)
    at_tolerance = rows([[-0.5, -1.0, -1.0, -1.0]])  # gap 0.5 = tolerance: not a mismatch
    one_in_four = rows([[-0.25, -1.0, -1.0, -1.0]])  # one gap of 0.75: a share of 0.25 = max_mismatch_frac
    bad = rows([[-0.25, -1.75, -1.0, -1.0]])  # gaps 0.75 and -0.75: a share of 0.5
    seen = []
    for step in (at_tolerance, one_in_four, bad, one_in_four, bad):
        check.observe(step, trainer_lp)
        metrics = check.finish(dp)
        seen.append((metrics["health/logprob_mismatch_frac"], check.bad_steps))
    assert seen == [(0.0, 0), (0.25, 0), (0.5, 1), (0.25, 0), (0.5, 1)] and check.failure is None
    assert metrics["health/logprob_diff_mean"] == 1.5 / 4 and metrics["health/logprob_diff_max"] == 0.75
    check.observe(bad, trainer_lp)
    check.finish(dp)
    assert check.bad_steps == 2 and "2 steps in a row: 50.0% of the sampled tokens" in check.failure
