"""Pure tensor math of RL for language models: advantages, policy losses, aggregation, KL, distillation, rollout
correction.

No I/O, no config objects, no device logic, no host syncs (but in the two advantage estimators whose reference
code groups rows in Python: ``gigpo`` and ``clean_baseline``). Advantage estimators and policy losses
are looked up by name (``get_advantage``, ``get_policy_loss``); formulas and sources are listed in
docs/algorithms.md.
"""

from tether.algos.advantages import clean_baseline, dr_grpo, episode, gigpo, grpo, qae, rloo, step_advantages
from tether.algos.aggregation import AGG_MODES, aggregate, masked_max, masked_mean, masked_min, masked_sum
from tether.algos.armor_loss import armor, mix_log_probs
from tether.algos.distillation import opd_advantages, opd_loss, seed_opd_loss
from tether.algos.eapo_loss import eapo
from tether.algos.kl import KL_KINDS, forward_kl_estimate, kl_estimate, reverse_kl_estimate
from tether.algos.logprobs import token_log_probs
from tether.algos.policy_losses import clipped_surrogate, gspo, ppo
from tether.algos.registry import (
    ADVANTAGES,
    POLICY_LOSSES,
    AdvantageFn,
    PolicyLossFn,
    Registry,
    UnknownNameError,
    get_advantage,
    get_policy_loss,
    register_advantage,
    register_policy_loss,
)
from tether.algos.rollout_correction import (
    ROLLOUT_CORRECTIONS,
    RolloutCorrection,
    register_rollout_correction,
    rollout_correction,
)
from tether.algos.types import (
    ADVANTAGE_TAGS,
    TOKEN_PRODUCERS,
    AdvantageInputs,
    AdvantageOutput,
    LossInputs,
    LossOutput,
    record_token_producer,
)

__all__ = [
    "ADVANTAGES",
    "ADVANTAGE_TAGS",
    "AGG_MODES",
    "KL_KINDS",
    "POLICY_LOSSES",
    "ROLLOUT_CORRECTIONS",
    "TOKEN_PRODUCERS",
    "AdvantageFn",
    "AdvantageInputs",
    "AdvantageOutput",
    "LossInputs",
    "LossOutput",
    "PolicyLossFn",
    "Registry",
    "RolloutCorrection",
    "UnknownNameError",
    "aggregate",
    "armor",
    "clean_baseline",
    "clipped_surrogate",
    "dr_grpo",
    "eapo",
    "episode",
    "forward_kl_estimate",
    "get_advantage",
    "get_policy_loss",
    "gigpo",
    "grpo",
    "gspo",
    "kl_estimate",
    "masked_max",
    "masked_mean",
    "masked_min",
    "masked_sum",
    "mix_log_probs",
    "opd_advantages",
    "opd_loss",
    "ppo",
    "qae",
    "record_token_producer",
    "register_advantage",
    "register_policy_loss",
    "register_rollout_correction",
    "reverse_kl_estimate",
    "rloo",
    "rollout_correction",
    "seed_opd_loss",
    "step_advantages",
    "token_log_probs",
]
