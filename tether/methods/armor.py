"""ARMOR: Anchor Rollout and Mixed Optimisation (Huang et al., arXiv:2607.10481; github.com/Hesse73/ARMOR).

Continual RL from a peak checkpoint, with the reference policy ``pi_ref`` set to that checkpoint.
This plug-in owns the parts of ARMOR that are not loss math (docs/methods/armor.md has the formulas):

* **Anchor Rollout** (paper Eq. 3, Algo. 1 lines 3-19; code ``dapo_ray_trainer.py``), in
  :meth:`Armor.on_generation`: a prompt is kept iff ``1 <= #correct(on-policy) <= n_on - 1`` (the verifier's
  ``correct``, never the shaped reward) and at least one of ``ref_n`` samples from ``pi_ref`` is correct; the
  first correct reference sample joins the group as its anchor (``source = 1``, same group id).
* **Reference reset** (Algo. 1 lines 24-27; code ``fsdp_workers._sync_actor_to_ref``), in
  :meth:`Armor.after_update`: ``theta_ref <- theta`` every ``tau`` steps, or every ``tau`` steps until step K
  (:meth:`tether.methods.Reference.reset_to`, which also makes the trainer checkpoint the reference).
* **Drift and split metrics** under ``armor/`` (the code's ``mix_kl/*``).

Mixed Optimisation is the ``armor`` policy loss of :mod:`tether.algos` (``algorithm.policy_loss: armor``,
``loss_kwargs.alpha``); the paper's off-policy IS ablation is :func:`anchor_offpolicy_is`, registered here.
:func:`tether.recipes.armor.run_two_stage` runs the whole recipe: DAPO to the validation peak, then stage 2 from
it.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Literal

import torch
from pydantic import Field, ValidationInfo, field_validator
from torch import Tensor

from tether import algos
from tether.algos import LossInputs, LossOutput, ppo, register_policy_loss
from tether.config import ConfigError
from tether.methods.base import Method, MethodSettings, register_method
from tether.rollout.batch import RolloutBatch

if TYPE_CHECKING:
    from tether.config import Config
    from tether.methods.context import StepContext

ON_POLICY, ANCHOR = 0, 1  # RolloutBatch.source tags


class ArmorSettings(MethodSettings):
    """``methods.armor`` of a config. The on-policy group size is ``rollout.group_size`` (15 in the paper)."""

    anchors: bool = Field(True, description="Anchor Rollout; false keeps only reference resets and metrics")
    ref_n: int = Field(4, ge=1, description="samples from pi_ref per prompt; the first correct one anchors")
    reset: Literal["none", "every", "until"] = Field(
        "none", description="reference reset: never; every tau steps; every tau steps until until_step")
    tau: int | None = Field(None, ge=1, validate_default=True,
                            description="reset period in steps (paper: 160 for 7B, 1 for 8B); until: 1")
    until_step: int | None = Field(None, ge=1, validate_default=True,
                                   description="'until': last step that resets; frozen after (paper 8B: 180)")
    kl_metrics: bool = Field(True, description="log armor/kl_on_old and armor/kl_on_ref (free: from pi_old)")

    @field_validator("tau")
    @classmethod
    def _tau_fits_reset(cls, tau: int | None, info: ValidationInfo) -> int | None:
        reset = info.data.get("reset")
        if reset == "every" and tau is None:
            raise ValueError("reset: every needs tau, the reset period in steps (the paper's 7B runs: 160)")
        if reset == "none" and tau is not None:
            raise ValueError("tau has no effect with reset: none; set reset: every (or until), or remove tau")
        return tau

    @field_validator("until_step")
    @classmethod
    def _until_fits_reset(cls, until_step: int | None, info: ValidationInfo) -> int | None:
        reset = info.data.get("reset")
        if reset == "until" and until_step is None:
            raise ValueError("reset: until needs until_step, the last step that resets (paper's 8B run: 180)")
        if reset != "until" and until_step is not None:
            raise ValueError(f"until_step has no effect with reset: {reset}; set reset: until, or remove it")
        return until_step

    def resets_at(self, step: int) -> bool:
        """Whether the reference is reset after the update of ``step`` (counted from 1)."""
        if self.reset == "none" or (self.reset == "until" and step > self.until_step):
            return False
        return step % (self.tau or 1) == 0


# -- Anchor Rollout, as pure functions of batches ----------------------------------------------


def on_policy_verdicts(correct: Tensor, group_ids: Tensor, source: Tensor) -> dict[int, str]:
    """Per group id (in order of first appearance): ``"keep"``, ``"all_correct"`` or ``"all_wrong"``.

    ``keep`` iff ``1 <= c <= n - 1`` with ``c`` correct among the group's ``n`` on-policy rows: the paper's
    Var(R_on | x) > 0, on the verifier's ``correct``, not on the shaped reward (armor.md Sec. 1.2).
    """
    on = source == ON_POLICY
    verdicts = {}
    for gid in dict.fromkeys(group_ids.tolist()):
        rows = on & (group_ids == gid)
        n, c = int(rows.sum()), int(correct[rows].sum())
        verdicts[gid] = "all_wrong" if c == 0 else "all_correct" if c == n else "keep"
    return verdicts


def first_correct_rows(ref: RolloutBatch) -> dict[int, int]:
    """Group id -> row of its first correct reference sample, in generation order (the code's choice)."""
    out: dict[int, int] = {}
    for row, (gid, ok) in enumerate(zip(ref.group_ids.tolist(), ref.correct.tolist(), strict=True)):
        if ok and gid not in out:
            out[gid] = row
    return out


def attach_anchors(batch: RolloutBatch, ref: RolloutBatch | None,
                   verdicts: dict[int, str]) -> tuple[RolloutBatch, Counter]:
    """Kept groups with their anchors appended: each group's on-policy rows, then its anchor row.

    Args:
        batch: one generation batch of on-policy groups.
        ref: reference samples of the groups whose verdict is ``keep`` (or None if there are none).
        verdicts: :func:`on_policy_verdicts` of ``batch``.

    Returns:
        (the hybrid groups, counts: ``groups``, ``accepted``, ``all_correct``, ``all_wrong``,
        ``no_correct_ref``, ``ref_samples``, ``ref_correct``).
    """
    anchor_row = first_correct_rows(ref) if ref is not None else {}
    rows: dict[int, list[int]] = {}
    for i, gid in enumerate(batch.group_ids.tolist()):
        rows.setdefault(gid, []).append(i)
    stats = Counter(groups=len(verdicts), ref_samples=len(ref) if ref is not None else 0,
                    ref_correct=int(ref.correct.sum()) if ref is not None else 0)
    index: list[int] = []
    for gid, verdict in verdicts.items():
        if verdict == "keep" and gid not in anchor_row:
            verdict = "no_correct_ref"
        if verdict == "keep":
            index += rows[gid] + [len(batch) + anchor_row[gid]]  # ref rows follow batch rows below
            verdict = "accepted"
        stats[verdict] += 1
    combined = RolloutBatch.concat([batch, like(ref, batch)]) if ref is not None else batch
    return combined.select(index), stats


def like(ref: RolloutBatch, batch: RolloutBatch) -> RolloutBatch:
    """``ref`` with the token/info keys of ``batch`` it lacks: zeros and None.

    On-policy rows may carry what a sampling intervention recorded (EAPO's ``gate_mask``, ``injected_mask``);
    anchors are sampled without one, so for them those masks are 0 (nothing gated, nothing injected).
    """
    for key, value in batch.token.items():
        if key not in ref.token:
            ref.token[key] = value.new_zeros(len(ref), ref.width)
    for key in batch.info:
        ref.info.setdefault(key, [None] * len(ref))
    return ref


def acceptance_metrics(counts: Counter) -> dict[str, float]:
    """The acceptance metrics of one generation batch, from its :func:`attach_anchors` counts; the step folds them
    over its generation batches (``Armor.generation_totals``, ``Armor.generation_units``)."""
    seen = max(counts["groups"], 1)
    return {
        "armor/acceptance_rate": counts["accepted"] / seen,
        "armor/drop_all_correct": counts["all_correct"] / seen,
        "armor/drop_all_wrong": counts["all_wrong"] / seen,
        "armor/drop_no_correct_ref": counts["no_correct_ref"] / seen,
        "armor/ref_accuracy": counts["ref_correct"] / max(counts["ref_samples"], 1),
        "armor/ref_samples": float(counts["ref_samples"]),
    }


# -- the plug-in ------------------------------------------------------------------------------


@register_method
class Armor(Method):
    """ARMOR's Anchor Rollout, reference resets and metrics; pair it with ``algorithm.policy_loss: armor``."""

    name = "armor"
    Settings = ArmorSettings
    needs_ref = True
    # per generation batch; the step folds them (tether.methods.hooks.GenerationFold): the acceptance and drop
    # rates are shares of the batch's groups, all of group_size rows, so weighting them by rows pools the groups
    generation_totals = frozenset({"armor/ref_samples"})
    generation_units = MappingProxyType({"armor/ref_accuracy": "armor/ref_samples"})

    def __init__(self, settings: ArmorSettings) -> None:
        super().__init__(settings)
        self.settings: ArmorSettings = settings
        self.ref_engine: Any = None
        self._ref_policy: Any = None
        self.resets, self.last_reset = 0, 0
        self._step, self._gen_batches = -1, 0  # generation batches of the step so far: each samples its own seed
        self._update_drift: tuple[str, ...] = ()  # drift metrics the update's pass logs (on_score decides)

    @classmethod
    def check_config(cls, settings: ArmorSettings, cfg: Config) -> list[str]:
        """Anchor Rollout needs a task's verifier and groups that have a correct and a wrong answer; the reference
        is the checkpoint the policy starts from (the paper's footnote 1), and resets must fall within the run."""
        warnings = []
        if cfg.model.ref_name not in (None, cfg.model.name):
            warnings.append(f"methods.armor with model.ref_name={cfg.model.ref_name!r}: ARMOR's reference is the "
                            f"checkpoint the policy starts from ({cfg.model.name!r}, the default), not another model")
        if settings.reset != "none" and (settings.tau or 1) > cfg.train.steps:
            warnings.append(f"methods.armor.tau={settings.tau} exceeds train.steps={cfg.train.steps}: the reference "
                            f"is never reset (reset: {settings.reset})")
        if not settings.anchors:
            return warnings
        if cfg.task is None:
            raise ConfigError("methods.armor.anchors=true needs a single-turn task (task: ...), not an env; "
                              "set methods.armor.anchors=false to keep only resets and metrics")
        if cfg.rollout.group_size < 2:
            raise ConfigError(f"methods.armor.anchors: rollout.group_size={cfg.rollout.group_size}; it must be >= 2, "
                              "or no group has 1 <= #correct <= group_size - 1 (the paper uses 15)")
        return warnings

    @property
    def moves_reference(self) -> bool:
        return self.settings.reset != "none"

    def setup(self, ctx: StepContext) -> None:
        if not self.settings.anchors:
            return
        if ctx.sample_groups is None:  # check_config refuses env:, the one collector without it; a new one may lack it
            raise ConfigError("methods.armor.anchors=true samples the reference's groups with the collector's "
                              "generate (tether.rollout.base.GroupSampler), and this run's collector has none; use "
                              "a single-turn task (task: ...), or set methods.armor.anchors=false")
        self._ref_policy = ctx.reference.model
        self.ref_engine = ctx.make_engine(self._ref_policy)  # same sampler, reference weights

    def on_generation(self, batch: RolloutBatch, ctx: StepContext) -> tuple[RolloutBatch, dict[str, Any]]:
        if not self.settings.anchors or len(batch) == 0:
            return batch, {}
        if ctx.step != self._step:
            self._step, self._gen_batches = ctx.step, 0
        verdicts = on_policy_verdicts(batch.correct, batch.group_ids, batch.source)
        passing = [gid for gid, v in verdicts.items() if v == "keep"]
        ref = None
        if passing:  # reference samples only where the on-policy test passed: same outcome, less work
            first = {gid: i for i, gid in reversed(list(enumerate(batch.group_ids.tolist())))}
            items = [batch.info["item"][first[gid]] for gid in passing]
            seed = ctx.seed_for("armor/ref", self._gen_batches)
            ref = ctx.sample_groups(self.ref_engine, items, self.settings.ref_n, ctx.sampling, seed,
                                    group_ids=passing, source=ANCHOR)
        out, stats = attach_anchors(batch, ref, verdicts)
        self._gen_batches += 1
        return out, acceptance_metrics(stats)

    def on_score(self, batch: RolloutBatch, ctx: StepContext) -> dict[str, Any]:
        metrics = source_metrics(batch)
        self._update_drift = ()
        if not self.settings.kl_metrics:
            return metrics
        old, ref = batch.token.get("old_log_probs"), batch.token["ref_log_probs"]
        if old is not None:
            metrics.update(drift_metrics(old, ref, batch.response_mask, batch.source))
        else:  # one optimiser step per RL step: pi_old is the update's detached forward, read in extra_loss
            _, counts = drift_terms(ref, ref, batch.response_mask, batch.source)
            self._update_drift = tuple(k for k, n in counts.items() if n > 0)
        return metrics

    def extra_loss(self, inputs: LossInputs, micro: RolloutBatch, ctx: StepContext) -> LossOutput | None:
        """No term: the drift metrics where the trainer did not score pi_old, from the update's pass, which is
        pi_old (a separate pass in on_score cost one more no-grad forward of the policy over the batch)."""
        if not self._update_drift:
            return None
        metrics, counts = drift_terms(inputs.old_log_probs, inputs.require("ref_log_probs", "armor"),
                                      inputs.response_mask, inputs.source)
        return LossOutput(inputs.log_probs.new_zeros(()), {k: metrics[k] for k in self._update_drift},
                          {k: counts[k] for k in self._update_drift})

    def on_advantages(self, batch: RolloutBatch, ctx: StepContext) -> dict[str, Any]:
        anchor = batch.source == ANCHOR
        if not bool(anchor.any()):
            return {}
        adv = batch.token["advantages"].sum(1) / batch.response_mask.sum(1).clamp(min=1)
        return {"armor/anchor_advantage": adv[anchor].mean().item(),
                "armor/anchor_zero_adv_frac": (adv[anchor] == 0).float().mean().item()}

    def after_update(self, ctx: StepContext) -> dict[str, Any]:
        reset = self.settings.resets_at(ctx.step)
        if reset:
            ctx.reference.reset_to(ctx.policy)  # the trainer now checkpoints the reference too
            self._push_ref_weights()
            self.resets, self.last_reset = self.resets + 1, ctx.step
        return {"armor/ref_reset": float(reset), "armor/ref_age": float(ctx.step - self.last_reset)}

    def state_dict(self) -> dict[str, Any]:
        return {"resets": self.resets, "last_reset": self.last_reset}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the reset counters; the trainer has restored the reference weights just before."""
        self.resets, self.last_reset = state.get("resets", 0), state.get("last_reset", 0)
        self._push_ref_weights()

    def _push_ref_weights(self) -> None:
        """Anchor sampling uses the reference's current weights (free for the in-process engine, which shares
        them; a broadcast for engines with their own copy)."""
        if self.ref_engine is not None:
            self.ref_engine.load_weights(self._ref_policy.state_dict())


def source_metrics(batch: RolloutBatch) -> dict[str, float]:
    """Reward, verifier accuracy and response length of on-policy rows and of anchors, separately."""
    out: dict[str, float] = {"armor/anchor_rows": float((batch.source == ANCHOR).sum())}
    lengths = batch.response_mask.sum(1)
    for tag, name in ((ON_POLICY, "on"), (ANCHOR, "anchor")):
        rows = batch.source == tag
        if bool(rows.any()):
            out[f"armor/reward_{name}"] = batch.rewards[rows].mean().item()
            out[f"armor/accuracy_{name}"] = batch.correct[rows].float().mean().item()
            out[f"armor/length_{name}"] = lengths[rows].float().mean().item()
    return out


def drift_terms(old_log_probs: Tensor, ref_log_probs: Tensor, mask: Tensor,
                source: Tensor) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """The code's ``mix_kl/kl_on_old`` and ``mix_kl/kl_on_ref``: k1 estimates, token means over these rows, with
    their token counts (0 where there is no such token), as tensors (no host sync).

    ``kl_on_old = mean_t (log pi_old - log pi_ref)`` over on-policy tokens (reverse KL, tokens from pi_old);
    ``kl_on_ref = mean_t (log pi_ref - log pi_old)`` over anchor tokens (forward KL, tokens from pi_ref,
    biased: anchors are rejection-filtered to be correct).
    """
    anchor = (source == ANCHOR).to(mask.dtype)[:, None] * mask
    on = mask - anchor
    metrics = {"armor/kl_on_old": algos.reverse_kl_estimate(old_log_probs, ref_log_probs, on),
               "armor/kl_on_ref": algos.forward_kl_estimate(old_log_probs, ref_log_probs, anchor)}
    return metrics, {"armor/kl_on_old": on.sum(), "armor/kl_on_ref": anchor.sum()}


def drift_metrics(old_log_probs: Tensor, ref_log_probs: Tensor, mask: Tensor,
                  source: Tensor) -> dict[str, float]:
    """:func:`drift_terms` over the batch, each only present when such tokens exist."""
    metrics, counts = drift_terms(old_log_probs, ref_log_probs, mask, source)
    return {k: v.item() for k, v in metrics.items() if counts[k] > 0}


# -- the paper's off-policy IS ablation (Fig. 3b) ----------------------------------------------


@register_policy_loss("anchor_offpolicy_is")
def anchor_offpolicy_is(inputs: LossInputs, *, agg: str = "token-mean", clip_low: float = 0.2,
                        clip_high: float = 0.28, dual_clip: float | None = 10.0) -> LossOutput:
    """Anchors with plain off-policy IS: ``r = pi_theta / pi_ref`` on anchor rows, ``pi_theta / pi_old`` else.

    ARMOR's "Anchor Rollout + off-policy IS" ablation (paper Sec. 5.2, Fig. 3b). The released scripts do not
    set it; it is the code's ``replace_old_probs=True, replace_method='ref', replace_on_ref_only=True,
    mix_probs=False`` (armor.md Sec. 6): ``old_log_prob`` replaced by ``ref_log_prob`` on anchors, then
    :func:`tether.algos.ppo` (clip and dual clip as the DAPO loss).

    Args:
        inputs: needs ``ref_log_probs`` and ``source`` (1 = anchor).
        agg, clip_low, clip_high, dual_clip: as in :func:`tether.algos.ppo`.
    """
    ref = inputs.require("ref_log_probs", "anchor_offpolicy_is")
    anchor = (inputs.require("source", "anchor_offpolicy_is") == ANCHOR)[:, None]
    old = torch.where(anchor, ref, inputs.old_log_probs)
    return ppo(dataclasses.replace(inputs, old_log_probs=old), agg=agg, clip_low=clip_low,
               clip_high=clip_high, dual_clip=dual_clip)
