"""The value types of the two registered families: :class:`AdvantageInputs` in, :class:`AdvantageOutput` out for
advantage estimators; :class:`LossInputs` in, :class:`LossOutput` out for policy losses.

Advantage inputs are per row (``[N]``), one entry per training sequence of the whole RL step. Loss inputs are
per token: ``[B, T]`` over *response* tokens only (prompt positions never appear), aligned so that
``log_probs[i, t]`` is the log-probability of response token ``t`` of row ``i``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import torch
from torch import Tensor

# The optional per-row fields of AdvantageInputs: an estimator declares which it needs when it is registered, and
# a config whose collector and methods produce none of them cannot choose it.
ADVANTAGE_TAGS = ("injected", "step_returns", "obs_keys")


@dataclass(frozen=True)
class AdvantageInputs:
    """Per-row values of one RL step's batch, from which an estimator makes one advantage per row.

    Attributes:
        rewards: scalar reward per row, shaping included. [N] float
        group_ids: rows with the same id share a baseline (the samples of one prompt, the rows of one task). [N]
        injected: rows with at least one token drawn from a prior's branch (EAPO's intervention). [N] bool
        step_returns: discounted env return from the row's turn on (the agent loop, ``env.step_gamma``). [N] float
        obs_keys: the observation each row acted on (the agent loop); rows of a group with equal keys form a
            GiGPO step group. N strings
        source: who sampled each row (``RolloutBatch.source``): 0 the policy, 1 the reference (ARMOR's anchors);
            None: the policy, every row. [N] long
    """

    rewards: Tensor
    group_ids: Tensor
    injected: Tensor | None = None
    step_returns: Tensor | None = None
    obs_keys: Sequence[str] | None = None
    source: Tensor | None = None

    def __post_init__(self) -> None:
        n = self.rewards.shape[0]
        for name in ("group_ids", "source", *ADVANTAGE_TAGS):
            value = getattr(self, name)
            if value is not None and len(value) != n:
                raise ValueError(f"AdvantageInputs.{name} has {len(value)} rows, expected {n} (the rows of rewards)")

    def require(self, name: str, estimator: str) -> Any:
        """Return an optional tag, or raise naming the estimator that needs it."""
        value = getattr(self, name)
        if value is None:
            raise ValueError(f"advantage '{estimator}' needs AdvantageInputs.{name}, which is None")
        return value


@dataclass
class AdvantageOutput:
    """One advantage per row, plus detached scalar metrics (tensors: no host sync happens here)."""

    advantages: Tensor
    metrics: dict[str, Tensor] = field(default_factory=dict)


# Per-token tensor name -> the methods that add it to LossInputs.tokens ("methods.eapo"), so that a loss missing one
# is told where it comes from. Methods declare theirs (Method.loss_tokens); tether.methods.register_method records
# them here, which keeps this module free of any method's name.
TOKEN_PRODUCERS: dict[str, list[str]] = {}


def record_token_producer(name: str, producer: str) -> None:
    """Note that ``producer`` (e.g. ``methods.seed``) adds the per-token tensor ``name`` to ``LossInputs.tokens``."""
    producers = TOKEN_PRODUCERS.setdefault(name, [])
    if producer not in producers:
        producers.append(producer)


@dataclass
class LossInputs:
    """Per-token tensors of one (micro-)batch, plus the normalisers of the whole mini-batch.

    Attributes:
        log_probs: log pi_theta(y_t), with gradient. [B, T]
        old_log_probs: log pi_theta_old(y_t), the policy that the update starts from. [B, T]
        advantages: advantage broadcast to tokens. [B, T]
        response_mask: 1.0 on the response tokens the loss counts, 0.0 on padding (and on the rows the trainer
            leaves out of the loss: ``algorithm.mask_truncated``). [B, T]
        ref_log_probs: log pi_ref(y_t) (KL terms, ARMOR's mixture). [B, T]
        behaviour_log_probs: log mu(y_t), the distribution the token was actually sampled from (EAPO). [B, T]
        source: per-row origin, 0 = on-policy, 1 = anchor (ARMOR). [B]
        num_tokens: number of response tokens the loss counts in the whole mini-batch (token-mean normaliser).
        num_seqs: number of sequences the loss counts in the whole mini-batch (seq-mean normaliser).
        max_response_len: the constant of seq-mean-token-sum-norm (Dr.GRPO), usually the generation limit.
        tokens: the per-token tensors that methods add, by name, each [B, T]: ``gate_mask`` (1.0 where EAPO's gate
            fired) and ``injected_mask`` (1.0 where the token came from EAPO's prior), ``teacher_log_probs`` (the same
            tokens under a teacher context: SEED, OPSD). Read them with :meth:`require`.
        token_weights: a detached factor of each token's policy loss, the rollout correction's weights
            (:mod:`tether.algos.rollout_correction`; 0 drops a token); None: 1 everywhere. Every policy loss applies
            it with :meth:`weighted` before aggregating. [B, T]
    """

    log_probs: Tensor
    old_log_probs: Tensor
    advantages: Tensor
    response_mask: Tensor
    ref_log_probs: Tensor | None = None
    behaviour_log_probs: Tensor | None = None
    source: Tensor | None = None
    num_tokens: float | None = None
    num_seqs: float | None = None
    max_response_len: int | None = None
    tokens: Mapping[str, Tensor] = field(default_factory=dict)
    token_weights: Tensor | None = None

    def __post_init__(self) -> None:
        shape = self.log_probs.shape
        per_token = {name: getattr(self, name) for name in ("old_log_probs", "advantages", "response_mask",
                                                            "ref_log_probs", "behaviour_log_probs",
                                                            "token_weights")}
        per_token.update({f"tokens[{name!r}]": value for name, value in self.tokens.items()})
        for name, value in per_token.items():
            if value is not None and value.shape != shape:
                raise ValueError(f"LossInputs.{name} has shape {tuple(value.shape)}, expected {tuple(shape)} "
                                 "(the shape of log_probs)")
        if self.source is not None and self.source.shape != shape[:1]:
            raise ValueError(f"LossInputs.source has shape {tuple(self.source.shape)}, "
                             f"expected {(shape[0],)}")

    def weighted(self, loss_mat: Tensor) -> Tensor:
        """``loss_mat`` times :attr:`token_weights` (itself when there are none, so no correction changes no bit)."""
        return loss_mat if self.token_weights is None else loss_mat * self.token_weights

    def require(self, name: str, loss: str) -> Tensor:
        """An optional field, or a tensor of :attr:`tokens`; raise naming the loss that needs it (and, for a tensor
        of ``tokens``, the methods that add it)."""
        if name in self.tokens:
            return self.tokens[name]
        if not any(f.name == name for f in fields(self)):
            producers = " or ".join(TOKEN_PRODUCERS.get(name, [])) or "no registered method"
            raise ValueError(f"policy loss '{loss}' needs the per-token tensor LossInputs.tokens['{name}'], which this "
                             f"batch does not have; it is added by {producers}")
        value = getattr(self, name)
        if value is None:
            raise ValueError(f"policy loss '{loss}' needs LossInputs.{name}, which is None")
        return value


@dataclass
class LossOutput:
    """A scalar to minimise plus detached scalar metrics (tensors, so no host sync happens here).

    A metric is a mean over the micro-batch's response tokens, unless it ends in ``_max`` / ``_min`` (an extreme) or
    ``counts`` names it: then it is a mean over other units (rows, corrected tokens, anchor tokens...), and
    ``counts[name]`` is how many of them this micro-batch has. The trainer folds each mean over micro-batches, ranks
    and mini-batches weighted by its units, so the logged value is the mean over every unit of the step whatever
    ``optim.micro_batch_size`` (a micro-batch without any counts for nothing; docs/metrics.md).

    A metric that is no mean (a ratio of means, as EAPO's effective sample size ``(sum w)^2 / (n sum w^2)``) is named
    in ``derived`` with its formula over the folded metrics: its value in ``metrics`` is this call's own, and the
    trainer computes the step's once, from the step's means, rather than averaging the calls' ratios.
    """

    loss: Tensor
    metrics: dict[str, Tensor] = field(default_factory=dict)
    counts: dict[str, Tensor] = field(default_factory=dict)
    derived: dict[str, Callable[[Mapping[str, float]], float]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.metrics, self.counts = _detached(self.metrics), _detached(self.counts)


def _detached(values: dict[str, Tensor | float]) -> dict[str, Tensor]:
    return {k: v.detach() if isinstance(v, torch.Tensor) else torch.tensor(float(v)) for k, v in values.items()}
