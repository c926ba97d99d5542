"""The metric names every trainer logs, so runs and plots line up. Formulas: docs/metrics.md.

``k`` in ``val/avg@k`` and ``val/pass@k`` is literal (the number of samples per val prompt is in the
run's config), so the headline metric keeps one name; numbered extras like ``val/pass@1`` may be
logged too. Method-specific metrics go under their own namespace (:data:`METHOD_NAMESPACES`), e.g.
``armor/anchor_frac``.
"""

from __future__ import annotations

METRICS: dict[str, str] = {
    "train/reward_mean": "mean reward of the step's on-policy rollout rows, shaping included",
    "train/accuracy": "fraction of the step's on-policy rollout rows the verifier judged correct",
    "train/response_length": "mean number of response tokens per rollout row",
    "train/masked_truncated_frac": "algorithm.mask_truncated: share of the step's rows left out of the loss for "
                                   "hitting rollout.max_new_tokens",
    "actor/pg_loss": "policy-gradient loss, as minimised (aggregated like the loss)",
    "actor/pg_clipfrac": "fraction of response tokens whose gradient the clip removes",
    "actor/ppo_kl": "mean of log pi_old - log pi_theta over response tokens (k1 estimate of KL(old||new))",
    "actor/kept_advantage_abs_mean": "with a rollout correction or algorithm.mask_truncated: mean |advantage| over "
                                     "the response tokens the loss keeps (what reaches the gradient)",
    "actor/entropy": "mean per-token entropy of pi_theta over response tokens",
    "actor/grad_norm": "global L2 norm of the gradient before clipping",
    "actor/skipped_updates": "optimiser steps skipped for a non-finite loss or gradient, counted since the run "
                             "started",
    "actor/kl_loss": "KL penalty to the reference policy over on-policy rows' tokens, as added to the loss (before "
                     "its coefficient)",
    "rollout/num_gen_batches": "generation rounds needed to fill the batch (dynamic sampling)",
    "rollout/kept_groups_frac": "fraction of prompt groups kept after filtering zero-variance groups",
    "rollout/accuracy_all": "fraction of all rows sampled this step, before any filter, the verifier judged correct",
    "val/avg@k": "mean over val prompts of the fraction correct among k samples",
    "val/pass@k": "mean over val prompts of the unbiased pass@k, 1 - C(n-c,k)/C(n,k)",
    "val/reward_mean": "mean reward of the val samples",
    "val/reward_faults": "val rows whose scorer raised, timed out or gave a non-finite reward (this validation)",
    "val/response_length": "mean val response length in tokens",
    "perf/step_s": "wall-clock seconds of the whole training step",
    "perf/rollout_tok_s": "generated tokens per second during rollout",
    "perf/train_tok_s": "tokens (prompt + response) per second through forward+backward",
    "perf/weight_sync_s": "seconds to give the rollout engine the updated weights",
    "reward/faults": "training rows whose scorer raised or timed out (scored as wrong) or gave a non-finite reward "
                     "(given the lowest finite reward of its group), counted since the run started",
    "reward/no_answer_frac": "share of the step's on-policy rows with no extractable answer (not a wrong answer)",
    "reward/wrong_answer_frac": "share of the step's on-policy rows with an extracted answer judged wrong",
    "reward/fault_frac": "share of the step's on-policy rows whose scorer raised or timed out",
    "reward/zero_adv_group_frac": "share of the step's groups whose rewards are all equal (zero advantage)",
    "reward/component/<name>": "composite rewards: term <name>'s share of the reward's absolute mass over the "
                               "step's on-policy rows (Score.components, the overlong penalty)",
    "val/no_answer_frac": "share of the val samples with no extractable answer (single-turn tasks)",
    "val/wrong_answer_frac": "share of the val samples with an extracted answer judged wrong",
    "val/fault_frac": "share of the val samples whose scorer raised or timed out",
    "val/component/<name>": "reward/component/<name> over the val samples",
    "health/logprob_diff_mean": "mean |log mu - log pi_old| over compared tokens: engine against trainer, same weights",
    "health/logprob_diff_max": "largest such difference",
    "health/logprob_mismatch_frac": "share of compared tokens outside what the sampling settings explain, by tolerance",
    "health/val_peak": "highest train.best_metric so far",
    "health/no_signal_steps": "steps in a row whose every advantage was 0, or whose loss kept none (health.no_signal)",
    "health/val_below_peak": "the peak minus the current validation value",
    "health/val_drops": "validations in a row more than health.collapse.drop below the peak",
    "health/degenerate_steps": "steps since the start whose policy looked collapsed (health.degenerate)",
}

# Prefixes reserved for method-specific metrics (the methods own their names inside them).
METHOD_NAMESPACES: tuple[str, ...] = ("armor/", "eapo/", "seed/")
