"""Register tether's advantage estimators and policy losses into verl's registries.

After ``register_into_verl()``, a verl config selects them by name, e.g.
``algorithm.adv_estimator=tether_qae`` and ``actor_rollout_ref.actor.policy_loss.loss_mode=tether_armor``.
Names carry a ``tether_`` prefix because verl already owns ``grpo`` and ``rloo`` (its advantage
registry refuses a second function under a taken name).

Signatures bridged (verl 0.9.1, ``verl/trainer/ppo/core_algos.py``):

* advantage: ``fn(token_level_rewards [B, T], response_mask [B, T], index (uid per row), config=None,
  **kw) -> (advantages [B, T], returns [B, T])`` -> tether ``fn(AdvantageInputs(rewards [B], group_ids [B]),
  **hparams)`` with ``rewards = token_level_rewards.sum(-1)`` and the advantage broadcast over response tokens
  (the estimators that need no per-row tag: verl passes none);
* policy loss: ``fn(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config,
  rollout_is_weights) -> (loss, metrics)`` -> tether ``fn(LossInputs, agg=..., **hparams)``. verl's
  normalisers (``config.global_batch_info``: ``batch_num_tokens``, ``global_batch_size``, ``dp_size``,
  ``loss_scale_factor``) become ``num_tokens`` / ``num_seqs`` / ``max_response_len``, and the loss is
  multiplied by ``dp_size`` because verl's FSDP averages gradients over ranks (as its ``agg_loss`` does).

Metrics. verl appends each micro-batch's loss metrics to a list and logs its plain mean (``reduce_metrics``: the
largest or smallest where the key holds ``max`` / ``min``), over micro-batches, ranks, mini-batches and epochs alike.
A tether mean over a subset (``LossOutput.counts``: ARMOR's anchor tokens, EAPO's weights...) is then an average of
the micro-batches' means, each micro-batch counted once, an empty one with its 0. So the adapter gives verl, for each
such mean, ``<key>_wsum`` (value x units) and ``<key>_units`` beside ``<key>`` (left out where the micro-batch has
no units): verl averages the first two over the same micro-batches, so their ratio is the mean over every unit of
the step, which :func:`exact_metrics` computes from verl's reduced metrics, with the ratios tether computes once per
step (``LossOutput.derived``: ``eapo/is_ess``; the adapter gives verl no micro-batch value of those).

What runs inside verl as it is, and what needs tether's trainer, is in docs/scaling.md ("verl").
In short: the advantage estimators run as they are. ``armor``, ``eapo`` and ``seed_opd`` need per-token
tensors verl's loss call does not pass (``ref_log_prob``, ``source``, ``rollout_log_probs``,
``gate_mask``, ``injected_mask``, ``teacher_log_probs``); the adapters accept them as keyword arguments
(a worker that passes them works; the last three reach ``LossInputs.tokens``) and otherwise raise tether's
"needs LossInputs..." error.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch
from torch import Tensor

from tether import algos
from tether.algos import LossInputs, LossOutput

ADVANTAGES = ("grpo", "dr_grpo", "rloo", "qae", "episode")
POLICY_LOSSES = ("armor", "eapo", "seed_opd")
PREFIX = "tether_"
# verl keyword -> LossInputs field, for tensors a worker may pass beyond verl's standard arguments
EXTRA_TENSORS = {"ref_log_prob": "ref_log_probs", "rollout_log_probs": "behaviour_log_probs", "source": "source"}
# per-token tensors of tether's methods, passed under their own names into LossInputs.tokens
METHOD_TENSORS = ("gate_mask", "injected_mask", "teacher_log_probs")
# suffixes of a subset mean's two parts, which verl's plain mean over micro-batches folds exactly (module docstring)
WSUM, UNITS = "_wsum", "_units"


def group_ids_from_index(index: Any) -> Tensor:
    """verl's per-row ``uid`` array (strings or ints) -> ``[B]`` long group ids ``0..G-1``."""
    _, inverse = np.unique(np.asarray(index), return_inverse=True)
    return torch.as_tensor(inverse.reshape(-1), dtype=torch.long)


def make_advantage_adapter(name: str, hparams: Mapping[str, Any] | None = None) -> Callable:
    """A verl advantage estimator calling tether's ``name`` with ``hparams``."""
    fn = algos.get_advantage(name)
    kw = dict(hparams or {})

    def adapter(token_level_rewards: Tensor, response_mask: Tensor, index: Any, config: Any = None,
                **_: Any) -> tuple[Tensor, Tensor]:
        scores = token_level_rewards.sum(-1)
        inputs = algos.AdvantageInputs(scores.float(), group_ids_from_index(index).to(scores.device))
        adv = fn(inputs, **kw).advantages[:, None].to(token_level_rewards.dtype) * response_mask
        return adv, adv

    adapter.__name__ = f"{PREFIX}{name}_advantage"
    return adapter


def _seed_opd(inputs: LossInputs, *, agg: str = "token-mean", beta: float = 5.0) -> LossOutput:
    """SEED's gated distillation term as a whole loss (mask = response mask; ``agg`` is token-mean)."""
    return algos.seed_opd_loss(inputs.log_probs, inputs.require("teacher_log_probs", "seed_opd"),
                               inputs.response_mask, beta=beta, num_active_tokens=inputs.num_tokens)


def _policy_loss(name: str) -> Callable:
    return _seed_opd if name == "seed_opd" else algos.get_policy_loss(name)


def make_policy_loss_adapter(name: str, hparams: Mapping[str, Any] | None = None) -> Callable:
    """A verl policy loss calling tether's ``name`` (``armor``, ``eapo``, ``seed_opd``) with ``hparams``."""
    fn = _policy_loss(name)
    kw = dict(hparams or {})

    def adapter(old_log_prob: Tensor, log_prob: Tensor, advantages: Tensor, response_mask: Tensor,
                loss_agg_mode: str = "token-mean", config: Any = None, rollout_is_weights: Tensor | None = None,
                **extra: Tensor) -> tuple[Tensor, dict[str, Any]]:
        info = dict(getattr(config, "global_batch_info", None) or {}) if config is not None else {}
        dp_size = int(info.get("dp_size") or 1)
        mask = response_mask.to(log_prob.dtype)
        unknown = set(extra) - set(EXTRA_TENSORS) - set(METHOD_TENSORS)
        if unknown:
            raise TypeError(f"{PREFIX}{name}: unexpected arguments {sorted(unknown)}; known: "
                            f"{sorted([*EXTRA_TENSORS, *METHOD_TENSORS])}")
        tensors = {EXTRA_TENSORS[k]: v for k, v in extra.items() if v is not None and k in EXTRA_TENSORS}
        inputs = LossInputs(log_probs=log_prob, old_log_probs=old_log_prob, advantages=advantages,
                            response_mask=mask, num_tokens=info.get("batch_num_tokens"),
                            num_seqs=info.get("global_batch_size"),
                            max_response_len=info.get("loss_scale_factor") or mask.shape[-1], **tensors,
                            tokens={k: v for k, v in extra.items() if v is not None and k in METHOD_TENSORS})
        if rollout_is_weights is not None:
            raise NotImplementedError(f"{PREFIX}{name}: verl's rollout importance weights are not supported; "
                                      "tether's losses take their own behaviour correction (eapo)")
        out = fn(inputs, agg=loss_agg_mode, **kw)
        adapter.names.update({verl_key(k): k for k in out.metrics})
        adapter.derived.update(out.derived)
        return out.loss * dp_size, verl_metrics(out)

    adapter.__name__ = f"{PREFIX}{name}_policy_loss"
    adapter.names, adapter.derived = {}, {}  # verl key -> tether name; tether's ratios (exact_metrics reads both)
    return adapter


def verl_key(name: str) -> str:
    """A tether metric's name in verl's log: under ``actor/``, one level deep (``eapo/is_ess`` ->
    ``actor/eapo_is_ess``)."""
    return name if name.startswith("actor/") else f"actor/{name.replace('/', '_')}"


def verl_metrics(out: LossOutput) -> dict[str, float]:
    """One call's metrics as verl folds them (module docstring): each subset mean also as its two parts, and no
    micro-batch value of a metric tether computes once per step (``LossOutput.derived``)."""
    metrics = {}
    for name, value in out.metrics.items():
        key = verl_key(name)
        if name in out.derived:
            continue
        if name in out.counts:
            units = float(out.counts[name])
            metrics[key + WSUM], metrics[key + UNITS] = float(value) * units, units
            if units == 0:  # an empty micro-batch: verl's mean of <key> would count its 0
                continue
        metrics[key] = float(value)
    return metrics


def exact_metrics(reduced: Mapping[str, float], adapter: Callable) -> dict[str, float]:
    """The step's subset means and ratios from verl's ``reduced`` metrics (after ``reduce_metrics``): each
    ``<key>_wsum / <key>_units`` (0 without units), then each of ``adapter``'s ratios over those, under verl's keys."""
    out = {}
    for key in (k.removesuffix(WSUM) for k in reduced if k.endswith(WSUM)):
        units = reduced[key + UNITS]
        out[key] = reduced[key + WSUM] / units if units else 0.0
    means = {adapter.names[key]: value for key, value in out.items() if key in adapter.names}
    out.update({verl_key(name): formula(means) for name, formula in adapter.derived.items()})
    return out


def register_into_verl(core_algos: Any = None, *, hparams: Mapping[str, Mapping[str, Any]] | None = None) -> list[str]:
    """Register every adapter into verl's registries; returns the names registered.

    Args:
        core_algos: the module holding ``register_adv_est`` and ``register_policy_loss``; default
            ``verl.trainer.ppo.core_algos`` (imported here).
        hparams: tether hyperparameters per tether name, e.g. ``{"armor": {"alpha": 0.875}}``; checked
            against the function's keyword arguments.

    Raises:
        ImportError: verl is not installed and no module was given.
        ValueError: an ``hparams`` key is not a known name or setting.
    """
    if core_algos is None:
        from verl.trainer.ppo import core_algos
    from tether.checks import check_kwargs

    hparams = dict(hparams or {})
    for name, kw in hparams.items():
        if name in ADVANTAGES:
            check_kwargs(algos.get_advantage(name), kw, f"hparams.{name}")
        elif name in POLICY_LOSSES:
            check_kwargs(_policy_loss(name), kw, f"hparams.{name}", skip=("agg",))
        else:
            raise ValueError(f"hparams.{name}: not a tether name; known: {', '.join(ADVANTAGES + POLICY_LOSSES)}")
    # a second call replaces our own earlier adapters (verl's advantage registry refuses a different function)
    stale = getattr(core_algos, "ADV_ESTIMATOR_REGISTRY", {})
    for name in ADVANTAGES:
        if getattr(stale.get(PREFIX + name), "__module__", None) == __name__:
            del stale[PREFIX + name]
    names = []
    for name in ADVANTAGES:
        core_algos.register_adv_est(PREFIX + name)(make_advantage_adapter(name, hparams.get(name)))
        names.append(PREFIX + name)
    for name in POLICY_LOSSES:
        core_algos.register_policy_loss(PREFIX + name)(make_policy_loss_adapter(name, hparams.get(name)))
        names.append(PREFIX + name)
    return names
