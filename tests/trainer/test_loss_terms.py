"""The trainer's loss terms against references written out here, in float64, from the models' own logits: the KL
penalty in the reward (each estimator), the rollout correction's weights in the micro-batch loss (pi_old / mu, not
its inverse, truncated or dropped), and the entropy bonus and KL loss term under every ``algorithm.loss_agg``.

Every reference reruns the model row by row on the unpadded ``prompt + response`` (no packing, no padding, no
chunking) and takes the log-softmax itself; the estimators, the PPO clip, the correction weights and the
aggregations are the published formulas, typed out rather than imported from :mod:`tether.algos`.

The batch is fixed: sampled by the in-process engine on the ``parity`` task, then given response lengths that
differ per row (every sampled row has ``max_new_tokens`` tokens, which would make the aggregation modes agree),
fixed per-token advantages and, where the case needs them, old and behaviour log-probs of its own.
"""

from __future__ import annotations

import typing
from collections.abc import Callable

import pytest
import torch

from tests.distributed.helpers import fixed_batch as update_batch
from tests.trainer.helpers import ANCHORS, tiny_config, update_with_anchors
from tether import algos
from tether.config import AlgorithmConfig
from tether.methods import MiniBatch
from tether.rollout.batch import RolloutBatch
from tether.seeding import StepSeeds
from tether.trainer import Trainer, step
from tether.trainer.step import narrowed

LENGTHS = [6, 2, 5, 1, 4, 3, 6, 2]  # response tokens of the 8 rows (2 prompts x 4 samples, max_new_tokens 6)
MICRO_ROWS = [1, 3, 5, 7]  # lengths 2, 1, 3, 2: a micro-batch whose token and row shares of the batch differ
LOSS_AGG_MODES = typing.get_args(AlgorithmConfig.model_fields["loss_agg"].annotation)


def trainer_for(tiny_policy, tmp_path, *overrides: str, ref_noise: float = 0.05) -> Trainer:
    """A trainer on the tiny random model; its reference (when it loads one) moved off the policy by ``ref_noise``
    so the KL between them is not 0."""
    model, tok = tiny_policy
    trainer = Trainer(tiny_config(tmp_path, *overrides), policy=model, tokenizer=tok)
    if trainer.ref_policy is not None:
        gen = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for p in trainer.ref_policy.parameters():
                p.add_(ref_noise * torch.randn(p.shape, generator=gen))
    return trainer


def fixed_batch(trainer: Trainer) -> RolloutBatch:
    """One collected batch with the response lengths of :data:`LENGTHS` (prefix masks)."""
    batch, _ = trainer.collect()
    assert batch.response_mask.shape == (len(LENGTHS), 6) and (batch.response_mask == 1).all()
    for i, n in enumerate(LENGTHS):
        batch.response_mask[i, n:] = 0
    return batch


def whole(batch: RolloutBatch) -> MiniBatch:
    return MiniBatch(rows=torch.arange(len(batch)), num_tokens=float(batch.response_mask.sum()), num_seqs=len(batch),
                     batch=batch)


@torch.no_grad()
def direct_log_probs(model, batch: RolloutBatch, temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 ``(log pi(y_t), entropy_t)`` [N, T], 0 off the mask: one unpadded forward per row, the logits at the
    positions before each response token, divided by the temperature, log-softmaxed here."""
    n, width = batch.response_mask.shape
    lp = torch.zeros(n, width, dtype=torch.float64)
    ent = torch.zeros(n, width, dtype=torch.float64)
    for i in range(n):
        length = int(batch.response_mask[i].sum())
        assert (batch.response_mask[i, :length] == 1).all() and (batch.response_mask[i, length:] == 0).all()
        prompt = list(batch.prompt_ids[i])
        response = batch.response_ids[i, :length].tolist()
        logits = model(input_ids=torch.tensor([prompt + response])).logits[0].double()
        logits = logits[len(prompt) - 1:len(prompt) - 1 + length] / temperature
        log_soft = logits - logits.logsumexp(-1, keepdim=True)
        lp[i, :length] = log_soft.gather(1, torch.tensor(response)[:, None])[:, 0]
        ent[i, :length] = -(log_soft.exp() * log_soft).sum(-1)
    return lp, ent


def kl_reference(x: torch.Tensor, estimator: str) -> torch.Tensor:
    """Schulman's estimators of KL(pi || ref) from ``x = log pi(y) - log ref(y)``, y ~ pi."""
    return {"k1": x, "k2": x ** 2 / 2, "k3": torch.exp(-x) + x - 1}[estimator]


def aggregate_reference(per_token: torch.Tensor, mask: torch.Tensor, mode: str, *, num_tokens: float, num_seqs: int,
                        max_len: int) -> torch.Tensor:
    """The aggregation modes, normalised by the mini-batch (``num_tokens``, ``num_seqs``) and written out row by row:
    token-mean (DAPO), the GRPO sequence mean of token means, the sequence mean of token sums, and Dr.GRPO's
    sequence mean of token sums over the constant ``max_len``."""
    rows = []
    for values, m in zip(per_token, mask, strict=True):
        total, count = float((values * m).sum()), float(m.sum())
        rows.append({"token-mean": total, "seq-mean-token-mean": total / count, "seq-mean-token-sum": total,
                     "seq-mean-token-sum-norm": total / max_len}[mode])
    return torch.tensor(sum(rows) / (num_tokens if mode == "token-mean" else num_seqs), dtype=torch.float64)


def ppo_reference(lp: torch.Tensor, old: torch.Tensor, adv: torch.Tensor, eps: float = 0.2) -> torch.Tensor:
    """PPO's clipped loss per token: max(-A r, -A clip(r, 1 - eps, 1 + eps)), r = pi / pi_old."""
    r = torch.exp(lp - old)
    return torch.maximum(-adv * r, -adv * r.clamp(1 - eps, 1 + eps))


def fixed_advantages(batch: RolloutBatch) -> torch.Tensor:
    """Per-token advantages of both signs, 0 off the mask (the estimator's output is replaced: this is a loss test)."""
    adv = torch.randn(batch.response_mask.shape, generator=torch.Generator().manual_seed(2))
    return adv * batch.response_mask


def old_log_probs_off_the_policy(lp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """pi_old away from pi_theta by up to 0.3 nats, both ways, so that some ratios leave the clip range [0.8, 1.2]."""
    shift = torch.tensor([0.3, -0.1, 0.05, -0.3, 0.15, -0.25])
    return ((lp - shift) * mask).float()


# -- 1. the KL penalty in the reward ---------------------------------------------------------------------------


@pytest.mark.parametrize("estimator", ["k1", "k2", "k3"])
def test_kl_penalty_in_the_reward_subtracts_coef_times_the_summed_estimate(tiny_policy, tmp_path, estimator):
    coef = 0.05
    trainer = trainer_for(tiny_policy, tmp_path, f"algorithm.kl.coef={coef}", "algorithm.kl.in_reward=true",
                          f"algorithm.kl.estimator={estimator}")
    batch = fixed_batch(trainer)
    before = batch.rewards.clone().double()
    metrics = trainer.score(batch)

    temperature = trainer.cfg.rollout.temperature
    old, _ = direct_log_probs(trainer.policy, batch, temperature)
    ref, _ = direct_log_probs(trainer.ref_policy, batch, temperature)
    mask = batch.response_mask.double()
    penalty = (kl_reference(old - ref, estimator) * mask).sum(1)
    assert (coef * penalty).abs().max() > 1e-2  # the penalty moves rewards by far more than the tolerance
    torch.testing.assert_close(batch.token["old_log_probs"].double(), old, atol=2e-5, rtol=0)
    torch.testing.assert_close(batch.rewards.double(), before - coef * penalty, atol=2e-5, rtol=0)
    assert metrics["reward/kl_penalty"] == pytest.approx(penalty.mean().item(), abs=2e-5)


def test_kl_penalty_in_the_reward_leaves_anchor_rows_out(tiny_policy, tmp_path):
    """An anchor (source 1, ARMOR's: sampled by the reference) is no sample of pi, so k1/k3 do not estimate
    KL(pi || ref) on it: its reward is left as it was, and the metric is the on-policy rows' mean."""
    coef = 0.05
    trainer = trainer_for(tiny_policy, tmp_path, f"algorithm.kl.coef={coef}", "algorithm.kl.in_reward=true",
                          "algorithm.kl.estimator=k1")
    batch = fixed_batch(trainer)
    anchors = torch.tensor([2, 5])
    batch.source[anchors] = 1
    before = batch.rewards.clone().double()
    metrics = trainer.score(batch)

    temperature = trainer.cfg.rollout.temperature
    old, _ = direct_log_probs(trainer.policy, batch, temperature)
    ref, _ = direct_log_probs(trainer.ref_policy, batch, temperature)
    penalty = (kl_reference(old - ref, "k1") * batch.response_mask.double()).sum(1)
    on_policy = torch.ones(len(batch), dtype=torch.bool)
    on_policy[anchors] = False
    assert (coef * penalty[anchors]).abs().min() > 1e-3  # counted, the anchors' rewards would move
    expected = before - coef * penalty * on_policy
    torch.testing.assert_close(batch.rewards.double(), expected, atol=2e-5, rtol=0)
    assert metrics["reward/kl_penalty"] == pytest.approx(penalty[on_policy].mean().item(), abs=2e-5)


def test_kl_penalty_in_the_reward_scores_each_policy_once(tiny_policy, tmp_path, monkeypatch):
    """With two mini-batches pi_old is scored for the update anyway: the penalty reuses it (a second policy pass over
    the whole batch was computed and thrown away), so each of the policy and the reference is scored once."""
    trainer = trainer_for(tiny_policy, tmp_path, "algorithm.kl.coef=0.05", "algorithm.kl.in_reward=true",
                          "optim.mini_batches=2")
    batch = fixed_batch(trainer)
    scored = []
    score_log_probs = step.score_log_probs

    def counting(model, *args, **kwargs):
        scored.append("policy" if model is trainer.policy else "reference")
        return score_log_probs(model, *args, **kwargs)

    monkeypatch.setattr(step, "score_log_probs", counting)  # what trainer.log_probs binds each time it is read
    trainer.score(batch)
    assert sorted(scored) == ["policy", "reference"]


# -- 2+3. the rollout correction's weights in the loss ---------------------------------------------------------

# mu's log-prob minus pi_old's, per response column: mostly mu above pi_old (the engine sampled these tokens), so the
# k1 estimate of KL(mu || pi_old), mean(log mu - log pi_old), is positive (0.26 on the micro-batch's tokens, which
# lie in the first 3 columns); the ratios pi_old / mu = exp(-gap) are 0.41, 2.01, 0.55, 0.82, 1.11, 0.67: the
# first below icepop's lower bound 0.5 (dropped), the second above tis's cap 1.5 (truncated).
ENGINE_GAP = torch.tensor([0.9, -0.7, 0.6, 0.2, -0.1, 0.4])


def tis_reference(ratio: torch.Tensor) -> torch.Tensor:
    return ratio.clamp(max=1.5)


def icepop_reference(ratio: torch.Tensor) -> torch.Tensor:
    return torch.where((ratio >= 0.5) & (ratio <= 5.0), ratio, torch.zeros_like(ratio))


@pytest.mark.parametrize(("overrides", "weight_of"), [
    (("rollout.correction.mode=tis", "rollout.correction.cap=1.5"), tis_reference),
    (("rollout.correction.mode=icepop",), icepop_reference),
], ids=["tis", "icepop"])
def test_the_correction_weights_pi_old_over_mu_reach_the_loss(tiny_policy, tmp_path, overrides,
                                                               weight_of: Callable[[torch.Tensor], torch.Tensor]):
    trainer = trainer_for(tiny_policy, tmp_path, *overrides)
    batch = fixed_batch(trainer)
    temperature = trainer.cfg.rollout.temperature
    lp, _ = direct_log_probs(trainer.policy, batch, temperature)
    mask = batch.response_mask.double()
    old = old_log_probs_off_the_policy(lp, mask)
    batch.token["old_log_probs"] = old
    batch.token["advantages"] = fixed_advantages(batch)
    batch.sample_log_probs = (old + ENGINE_GAP) * batch.response_mask  # log mu, asymmetric around pi_old

    lengths = batch.row_lengths()
    micro = narrowed(batch, MICRO_ROWS, lengths)
    mini = whole(batch)
    out = trainer._micro_batch_loss(micro, mini)
    loss, metrics = out.loss, out.metrics

    m = mask[MICRO_ROWS, :micro.width]
    lp_m, old_m = lp[MICRO_ROWS, :micro.width], old.double()[MICRO_ROWS, :micro.width]
    mu_m = batch.sample_log_probs.double()[MICRO_ROWS, :micro.width]
    weights = weight_of(torch.exp(old_m - mu_m))  # pi_old / mu, truncated or dropped
    per_token = ppo_reference(lp_m, old_m, batch.token["advantages"].double()[MICRO_ROWS, :micro.width])
    expected = (per_token * weights * m).sum() / mini.num_tokens  # token-mean: dropped tokens count in the normaliser
    unweighted = (per_token * m).sum() / mini.num_tokens
    assert (expected - unweighted).abs() > 1e-2  # the weights change the loss by far more than the tolerance
    torch.testing.assert_close(loss.double(), expected, atol=1e-5, rtol=0)

    gap = (mu_m - old_m) * m  # log mu - log pi_old on the corrected tokens
    kl_k1 = gap.sum() / m.sum()
    assert kl_k1 > 0.1
    assert metrics["rollout_corr/kl_k1"].item() == pytest.approx(kl_k1.item(), abs=1e-5)
    k3 = (torch.exp(-gap) - 1 + gap) * m  # exp(l) - 1 - l with l = log pi_old - log mu
    assert metrics["rollout_corr/kl_k3"].item() == pytest.approx((k3.sum() / m.sum()).item(), abs=1e-5)
    assert metrics["rollout_corr/weight_mean"].item() == pytest.approx(((weights * m).sum() / m.sum()).item(),
                                                                       abs=1e-5)
    kept_abs_advantage = (batch.token["advantages"].double()[MICRO_ROWS, :micro.width].abs() * (weights > 0) * m)
    assert metrics["actor/kept_advantage_abs_mean"].item() == pytest.approx(
        (kept_abs_advantage.sum() / m.sum()).item(), abs=1e-6)


# -- 5. entropy bonus and KL loss term under every aggregation ---------------------------------------------------


@pytest.mark.parametrize("loss_agg", LOSS_AGG_MODES)
def test_total_loss_is_ppo_minus_entropy_plus_kl_under_every_aggregation(tiny_policy, tmp_path, loss_agg):
    entropy_coef, kl_coef = 0.01, 0.5
    trainer = trainer_for(tiny_policy, tmp_path, f"algorithm.loss_agg={loss_agg}",
                          f"algorithm.entropy_coef={entropy_coef}", f"algorithm.kl.coef={kl_coef}")
    assert trainer.cfg.algorithm.kl.estimator == "k3"
    batch = fixed_batch(trainer)
    temperature = trainer.cfg.rollout.temperature
    lp, ent = direct_log_probs(trainer.policy, batch, temperature)
    ref, _ = direct_log_probs(trainer.ref_policy, batch, temperature)
    mask = batch.response_mask.double()
    batch.token["old_log_probs"] = old_log_probs_off_the_policy(lp, mask)
    batch.token["advantages"] = fixed_advantages(batch)
    batch.token["ref_log_probs"] = (ref * mask).float()

    lengths = batch.row_lengths()
    micro = narrowed(batch, MICRO_ROWS, lengths)
    mini = whole(batch)
    assert micro.width < trainer.cfg.rollout.max_new_tokens  # Dr.GRPO's constant is not the micro-batch's width
    out = trainer._micro_batch_loss(micro, mini)
    loss, metrics = out.loss, out.metrics

    cols = slice(0, micro.width)
    m, lp_m, ent_m = mask[MICRO_ROWS, cols], lp[MICRO_ROWS, cols], ent[MICRO_ROWS, cols]
    old_m = batch.token["old_log_probs"].double()[MICRO_ROWS, cols]
    adv_m = batch.token["advantages"].double()[MICRO_ROWS, cols]
    kl_tok = kl_reference(lp_m - ref[MICRO_ROWS, cols], "k3")

    def agg(per_token: torch.Tensor, mode: str = loss_agg) -> torch.Tensor:
        return aggregate_reference(per_token, m, mode, num_tokens=mini.num_tokens, num_seqs=mini.num_seqs,
                                   max_len=trainer.cfg.rollout.max_new_tokens)

    pg, entropy, kl = agg(ppo_reference(lp_m, old_m, adv_m)), agg(ent_m), agg(kl_tok)
    torch.testing.assert_close(loss.double(), pg - entropy_coef * entropy + kl_coef * kl, atol=1e-5, rtol=0)
    assert metrics["actor/kl_loss"].item() == pytest.approx(kl.item(), abs=1e-6)
    assert metrics["actor/entropy"].item() == pytest.approx(agg(ent_m, "token-mean").item(), abs=1e-5)  # always
    if loss_agg != "token-mean":  # each term under token-mean would be off by far more than the tolerance
        assert (entropy_coef * (entropy - agg(ent_m, "token-mean"))).abs() > 1e-3
        assert (kl_coef * (kl - agg(kl_tok, "token-mean"))).abs() > 1e-4


@pytest.mark.parametrize("loss_agg", ["token-mean", "seq-mean-token-mean"])
def test_the_kl_loss_term_leaves_anchor_rows_out_whatever_the_micro_batches(tiny_policy, tmp_path, loss_agg):
    """k1/k3 estimate KL(pi || ref) only on samples of pi, so ARMOR's anchors (source 1, sampled by the reference)
    add nothing to the KL term's numerator and nothing to its normalisers: each mini-batch's term is loss_agg over
    its on-policy tokens, and actor/kl_loss the mean of the two mini-batches' terms, with micro-batches of one row
    and of the whole mini-batch alike. The learning rate moves no float32 weight, so both mini-batches see the
    policy the reference runs."""
    model, _ = tiny_policy
    batch = update_batch()
    lp, _ = direct_log_probs(model, batch, temperature=1.0)
    g = torch.Generator().manual_seed(3)
    ref = lp + torch.rand(lp.shape, generator=g, dtype=torch.float64) - 0.5  # within the k3 clamp
    kl_tok = kl_reference(lp - ref, "k3")  # the configured estimator (algorithm.kl.estimator's default)
    on_policy = torch.ones(len(batch), dtype=torch.bool)
    on_policy[ANCHORS] = False
    terms = []
    for rows in step.update_mini_batches(len(batch), StepSeeds(0, 0)("shuffle"), 2):
        on = rows[on_policy[rows]]
        mask = batch.response_mask.double()[on]
        terms.append(aggregate_reference(kl_tok[on], mask, loss_agg, num_tokens=float(mask.sum()), num_seqs=len(on),
                                         max_len=6))
    want = torch.stack(terms).mean().item()
    for micro in (1, 5):
        got = update_with_anchors(tiny_policy, tmp_path / str(micro), micro, f"algorithm.loss_agg={loss_agg}",
                                  "optim.lr=1e-30", ref_log_probs=ref)
        assert got["actor/kl_loss"] == pytest.approx(want, abs=1e-5), micro


@pytest.mark.parametrize("loss_agg", LOSS_AGG_MODES)
def test_without_anchors_the_kl_loss_term_is_unchanged_bit_for_bit(tiny_policy, tmp_path, monkeypatch, loss_agg):
    """Leaving the anchors out changes nothing where there are none: the term is the estimate aggregated over the
    loss mask with the mini-batch's own normalisers, bit for bit, in a micro-batch smaller than its mini-batch."""
    trainer = trainer_for(tiny_policy, tmp_path, f"algorithm.loss_agg={loss_agg}", "algorithm.kl.coef=0.5")
    batch = fixed_batch(trainer)
    trainer.score(batch)
    batch.token["advantages"] = fixed_advantages(batch)
    estimates = []
    kl_estimate = algos.kl_estimate

    def recorded(*args: typing.Any) -> torch.Tensor:  # the per-token estimate the loss aggregates
        estimates.append(kl_estimate(*args))
        return estimates[-1]

    monkeypatch.setattr(algos, "kl_estimate", recorded)
    micro = narrowed(batch, MICRO_ROWS, batch.row_lengths())
    mini = whole(batch)
    kl = trainer._micro_batch_loss(micro, mini).metrics["actor/kl_loss"]
    (estimate,) = estimates
    before = algos.aggregate(estimate, micro.response_mask, loss_agg, num_tokens=mini.num_tokens,
                             num_seqs=mini.num_seqs, max_response_len=trainer.cfg.rollout.max_new_tokens)
    assert kl.abs() > 1e-4 and torch.equal(kl, before.detach())


# -- 6. a row without response tokens ------------------------------------------------------------------------------


SEQUENCE_MEANS = [("ppo", "seq-mean-token-mean"), ("ppo", "seq-mean-token-sum"), ("ppo", "seq-mean-token-sum-norm"),
                  ("gspo", "seq-mean-token-mean")]  # GRPO's, verl's, Dr.GRPO's; GSPO's sequence-level ratio


@pytest.mark.parametrize(("policy_loss", "loss_agg"), SEQUENCE_MEANS)
def test_a_row_without_response_tokens_changes_no_sequence_mean(tiny_policy, tmp_path, policy_loss, loss_agg):
    """An empty response (an agent turn or a user engine's row with no token) adds nothing to any term, so the loss
    of the mini-batch with it is the loss of the mini-batch without it: it is no sequence of the sequence means."""
    trainer = trainer_for(tiny_policy, tmp_path, f"algorithm.policy_loss={policy_loss}",
                          f"algorithm.loss_agg={loss_agg}", "algorithm.entropy_coef=0.01", "algorithm.kl.coef=0.5")
    batch = fixed_batch(trainer)
    batch.response_mask[3] = 0
    temperature = trainer.cfg.rollout.temperature
    lp, _ = direct_log_probs(trainer.policy, batch, temperature)
    ref, _ = direct_log_probs(trainer.ref_policy, batch, temperature)
    mask = batch.response_mask.double()
    batch.token["old_log_probs"] = old_log_probs_off_the_policy(lp, mask)
    batch.token["advantages"] = fixed_advantages(batch)
    batch.token["ref_log_probs"] = (ref * mask).float()

    def mini_batch_loss(part: RolloutBatch) -> tuple[torch.Tensor, MiniBatch]:
        rows = torch.arange(len(part))
        mini = step.loss_mini_batch(part, rows, mask_truncated=False)
        return trainer._micro_batch_loss(narrowed(part, rows.tolist(), part.row_lengths()), mini).loss, mini

    loss, mini = mini_batch_loss(batch)
    without, _ = mini_batch_loss(batch.select(torch.tensor([0, 1, 2, 4, 5, 6, 7])))
    assert without.abs() > 1e-2  # 1/8 of it would be far outside the tolerance
    torch.testing.assert_close(loss.double(), without.double(), atol=1e-6, rtol=0)
    assert mini.num_seqs == 7 and mini.num_tokens == sum(LENGTHS) - LENGTHS[3]
