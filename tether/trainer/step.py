"""One RL step, read top to bottom: collect -> score -> advantages -> update -> after.

The trainer knows the steps of on-policy RL, never the methods: ARMOR, EAPO and SEED reach in through the hooks of
:class:`tether.methods.Method`, called by the run's :class:`~tether.methods.hooks.MethodSet` with a
:class:`~tether.methods.StepContext`, never the trainer. The collector gets the engine, the step's seeds and the
methods' generation hooks, never the trainer.

Every model lives on ``device`` (``train.device``), and so does the batch from scoring on: the collector builds it
on the CPU, :meth:`StepPhases.train_step` moves it once.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch

from tether import algos
from tether.advantage_inputs import advantage_inputs
from tether.algos import LossInputs, LossOutput
from tether.config import Config
from tether.distributed.data_parallel import extremum
from tether.errors import TrainingStopped
from tether.health.parity import compared_tokens
from tether.methods import MiniBatch
from tether.models.forward import decoder_tokens, head_logits_can_be_kept, response_log_probs
from tether.models.layers import activation_bytes, head_logit_bytes
from tether.rollout.batch import RolloutBatch
from tether.trainer.micro_batches import every_rank_micro_batches, micro_batches

if TYPE_CHECKING:
    from tether.health import HealthMonitor
    from tether.methods.hooks import MethodSet
    from tether.rollout.base import Collector

# Micro-batch terms normalised by the whole mini-batch's counts: their mini-batch value is the sum over
# micro-batches, and the step's is the mean over its mini-batches.
SUMMED_METRICS = frozenset({"actor/pg_loss", "actor/kl_loss", "actor/entropy"})
# A ``*_max`` / ``*_min`` is the largest / smallest micro-batch's (tether.distributed.data_parallel.extremum). Every
# other one is a mean over some units of the micro-batch: its response tokens, or those LossOutput.counts gives
# (rows, corrected tokens...). It is folded as the sum of value x units and the sum of units, over micro-batches,
# ranks and mini-batches, and divided once (step_values): the mean over every unit of the step. Weighted by rows, a
# micro-batch of short responses counted as much as one of long ones; weighted by response tokens, one without a
# corrected token pulled rollout_corr/weight_mean toward 0; either way the value moved with optim.micro_batch_size.
UNITS = "#units"  # the key suffix under which the fold keeps a mean's units (no metric name holds a '#')
LOSS_MASK = "loss_mask"  # the mini-batch's per-token tensor of the tokens its loss counts (loss_mini_batch)


class StepPhases:
    """The phases of :meth:`train_step`, in the order it calls them."""

    # what the phases read and update, built by tether.trainer.build.TrainerBuild
    cfg: Config
    device: torch.device
    step: int
    skipped_updates: int
    skipped_in_a_row: int
    policy: Any
    collector: Collector
    methods: MethodSet
    health: HealthMonitor
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler

    def train_step(self) -> dict[str, float]:
        start = time.perf_counter()
        batch, metrics = self.collect()                # 1. collect: generate, reward, method hooks, filters
        metrics.update(self.health.check_batch(batch, self.step + 1))  # the token round trip; the reward audit
        batch = batch.to(self.device)                  #    the one move of the batch to the models' device
        t_rollout = time.perf_counter() - start
        metrics.update(self.score(batch))              # 2. score: old / ref / method log-probs
        metrics.update(self.compute_advantages(batch))  # 3. advantages
        t_update = time.perf_counter()
        metrics.update(self.update(batch))             # 4. update: the mini-batches' optimiser steps
        t_sync = time.perf_counter()
        self.push_weights()                            #    engines with their own weights sample with the new ones
        t_sync = time.perf_counter() - t_sync
        self.step += 1
        metrics.update(self.methods.after_update(self.hook_context()))  # 5. after: reference resets...
        metrics.update(batch_metrics(batch))
        metrics.update(self.health.end_step(metrics, self.dp, self.step))  # parity; a collapsed policy
        n_tokens = float(batch.response_mask.sum())
        now = time.perf_counter()
        metrics.update({"perf/step_s": now - start, "perf/rollout_s": t_rollout,
                        "perf/rollout_tok_s": n_tokens / max(t_rollout, 1e-9),
                        "perf/train_tok_s": n_tokens / max(now - t_update - t_sync, 1e-9),
                        "perf/weight_sync_s": t_sync})
        self.tracker.log(metrics, self.step)
        self.health.stop_if_unhealthy()                #    after logging: the failing step's numbers are kept
        return metrics

    # -- 1. collection -----------------------------------------------------------------------

    def collect(self) -> tuple[RolloutBatch, dict[str, float]]:
        """The step's batch, from the collector: it gets the engine, the step's seeds and the methods' generation
        hooks, never the trainer."""
        self.health.start_collection()  # the round trip checks what the engine samples from here on
        hooks = self.methods.generation_hooks(self.hook_context())
        return self.collector.collect(self.sampling_engine, self.seeds(), hooks)

    # -- 2. scoring --------------------------------------------------------------------------

    def _updates_per_step(self) -> int:
        return self.cfg.optim.mini_batches * self.cfg.optim.ppo_epochs

    @property
    def log_probs(self) -> Callable[..., torch.Tensor]:
        """The step's scoring, ``log_probs(model, batch, prompt_ids=None)``: old and reference log-probs, and
        ``ctx.log_probs`` (:func:`score_log_probs` in this step's update groups; it holds no trainer)."""
        return functools.partial(score_log_probs, cfg=self.cfg, precision=self.autocast, world_size=self.dp.world_size,
                                 shuffle_seed=self.seed_for("shuffle"))

    def score(self, batch: RolloutBatch) -> dict[str, float]:
        # With one optimiser step per RL step the update's own forward, detached, *is* pi_old
        # (same weights, same function), so the separate pass is skipped (as TRL does).
        if self._updates_per_step() > 1:
            batch.token["old_log_probs"] = self.log_probs(self.policy, batch)
        if self.ref_policy is not None:
            batch.token["ref_log_probs"] = self.log_probs(self.ref_policy, batch)
        metrics = self.methods.on_score(batch, self.hook_context())
        kl = self.cfg.algorithm.kl
        if kl.in_reward and kl.coef > 0:
            if "old_log_probs" not in batch.token:  # not setdefault: its argument, a whole policy pass, always runs
                batch.token["old_log_probs"] = self.log_probs(self.policy, batch)
            per_token = algos.kl_estimate(batch.token["old_log_probs"], batch.token["ref_log_probs"], kl.estimator)
            # k1/k3 estimate KL(pi || ref) only on samples of pi: an anchor (ARMOR, sampled by the reference) would
            # get minus an estimate of KL(ref || pi), a bonus, so it keeps its reward and leaves the metric
            on_policy = batch.source == 0
            penalty = (per_token * batch.response_mask).sum(1) * on_policy
            batch.rewards = batch.rewards - kl.coef * penalty
            metrics["reward/kl_penalty"] = penalty[on_policy].mean().item()
        return metrics

    # -- 3. advantages -----------------------------------------------------------------------

    def compute_advantages(self, batch: RolloutBatch) -> dict[str, float]:
        """The one place advantages are made: the configured estimator over the batch's rewards, group ids and
        tags (GiGPO's step returns, EAPO's injected rows), broadcast to response tokens. Methods then only read
        them."""
        out = self.advantage_fn(advantage_inputs(batch), **self.cfg.algorithm.advantage_kwargs)
        batch.token["advantages"] = out.advantages[:, None] * batch.response_mask
        metrics = {k: v.item() for k, v in out.metrics.items()}
        metrics.update(self.methods.on_advantages(batch, self.hook_context()))  # read only (MethodSet checks)
        metrics["train/advantage_abs_mean"] = algos.masked_mean(batch.token["advantages"].abs(),
                                                                batch.response_mask).item()
        return metrics

    # -- 4. update ---------------------------------------------------------------------------

    def update(self, batch: RolloutBatch) -> dict[str, float]:
        o = self.cfg.optim
        mini_batches = update_mini_batches(len(batch), self.seed_for("shuffle"), o.mini_batches)
        sums: dict[str, float] = {}
        counts: dict[str, int] = {}
        derived: dict[str, Callable[[dict[str, float]], float]] = {}  # LossOutput.derived of every micro-batch
        for _ in range(o.ppo_epochs):
            for rows in mini_batches:
                mini = loss_mini_batch(batch, rows, mask_truncated=self.cfg.algorithm.mask_truncated)
                for key, value in self._mini_batch_step(mini, derived).items():
                    pick = extremum(key)  # the step's largest / smallest, not a mean of the mini-batches' ones
                    if pick is not None:
                        sums[key], counts[key] = pick(sums.get(key, value), value), 1
                    else:
                        sums[key], counts[key] = sums.get(key, 0.0) + value, counts.get(key, 0) + 1
        metrics = {**step_values(sums, counts, derived), "actor/skipped_updates": float(self.skipped_updates)}
        if self.cfg.algorithm.mask_truncated:
            metrics["train/masked_truncated_frac"] = sum(map(bool, batch.info["truncated"])) / len(batch)
        return metrics

    def _mini_batch_step(self, mini: MiniBatch,
                         derived: dict[str, Callable[[dict[str, float]], float]]) -> dict[str, float]:
        o = self.cfg.optim
        lengths = mini.batch.row_lengths()
        metrics: dict[str, torch.Tensor] = {}
        self.optimizer.zero_grad(set_to_none=True)
        # this rank's share of the rows (one process: all), by count or by token budget; normalisers stay the
        # mini-batch's
        plan = micro_batches(lengths, o.micro_batch_size, o.max_tokens_per_micro_batch, rank=self.dp.rank,
                             world_size=self.dp.world_size, lock_step=self.strategy.lock_step)
        activations = []  # (estimated GiB, layers recomputed, head logits kept) of each micro-batch
        for mb in plan:
            micro = narrowed(mini.batch, mb.rows, lengths)
            # response columns: the tokens, or an upper bound where a row's mask has holes
            gb, layers, keep_head = self._choose_checkpointing(micro, sum(lengths[r][1] for r in mb.rows))
            if mb.padding:
                activations.append((gb, layers, False))  # the lock-step pass recomputes its head's logits
                self._lock_step_pass(micro)
                continue
            activations.append((gb, layers, keep_head))
            out = self._micro_batch_loss(micro, mini, keep_head_logits=keep_head)
            out.loss.backward()
            add_micro_metrics(metrics, out, tokens=loss_mask(micro).sum(), derived=derived)  # no host sync
        metrics = self.dp.sum_metrics(metrics)  # N processes: partial sums -> the mini-batch's sums
        grad_norm = self.strategy.clip_grad_norm(self.policy, o.grad_clip)  # of the gradient summed over ranks
        metrics["actor/lr"] = self.scheduler.get_last_lr()[0]  # this update's, read before the schedule moves on
        if torch.isfinite(grad_norm):
            self.optimizer.step()
            self.scheduler.step()  # a skipped update does not advance the warm-up either
            self.skipped_in_a_row = 0
        else:
            self._skip_update()
        metrics["actor/grad_norm"] = grad_norm
        # this rank's (a rank of a replicated run may have no rows of a small mini-batch)
        metrics["perf/activation_gb"] = max((gb for gb, _, _ in activations), default=0.0)
        metrics["perf/checkpointed_micro_batches"] = sum(on for _, on, _ in activations) / max(1, len(activations))
        metrics["perf/head_logits_kept"] = sum(kept for _, _, kept in activations) / max(1, len(activations))
        return {k: float(v) for k, v in metrics.items()}  # one host sync per mini-batch

    def _choose_checkpointing(self, micro: RolloutBatch, response_tokens: int) -> tuple[float, bool, bool]:
        """The micro-batch's estimated decoder activations in GiB (:func:`~tether.models.layers.activation_bytes` of
        the tokens its forward runs, :func:`~tether.models.forward.decoder_tokens`), whether its decoder layers
        recompute in backward, and whether its LM head keeps its logits for backward rather than recomputing them.

        The layers: ``train.gradient_checkpointing`` true recomputes them (a benchmark may flip the switch), false
        keeps them, auto recomputes them when their estimate exceeds ``train.activation_memory_budget_gb`` (small
        micro-batches keep the faster forward, large ones fit the budget). The head keeps its logits
        (:func:`~tether.models.layers.head_logit_bytes` more, one matmul less) where the layers are kept and both
        estimates together fit the budget: a micro-batch that the head alone takes over it recomputes one matmul,
        not every layer. Heads that the pass calls as modules recompute
        (:func:`~tether.models.forward.head_logits_can_be_kept`)."""
        tokens = decoder_tokens(self.policy, micro.prompt_ids, micro.response_mask)
        element_size = next(self.policy.parameters()).element_size()
        budget = self.cfg.train.activation_memory_budget_gb
        decoder_gb = activation_bytes(self.policy.config, tokens, element_size) / 2**30
        switch = self.activation_checkpointing  # None: false, or no layers found
        if self.cfg.train.gradient_checkpointing == "auto" and switch is not None:
            switch.on = decoder_gb > budget
        layers = switch is not None and switch.on
        if layers or not head_logits_can_be_kept(self.policy, micro.prompt_ids):
            return decoder_gb, layers, False
        vocab = self.policy.get_output_embeddings().weight.shape[0]
        head_gb = head_logit_bytes(vocab, response_tokens, element_size) / 2**30
        return decoder_gb, False, decoder_gb + head_gb <= budget

    def _skip_update(self) -> None:
        """A non-finite loss or gradient: no optimiser step (weights and optimiser state stay finite); a run where
        that keeps happening stops rather than spending its budget standing still."""
        self.skipped_updates += 1
        self.skipped_in_a_row += 1
        limit = self.cfg.train.max_skipped_updates
        if self.skipped_in_a_row >= limit:
            raise TrainingStopped(f"{limit} optimiser steps in a row had a non-finite loss or gradient "
                                  f"(train.max_skipped_updates={limit}) at step {self.step}; the checkpoints hold "
                                  "finite weights; check the rewards or lower optim.lr")

    def _lock_step_pass(self, micro: RolloutBatch) -> None:
        """A forward and backward that add nothing: a sharded model gathers and reduces inside them, so a rank
        with fewer rows than the others still makes the same calls. Method hooks do not see it."""
        with self.autocast():
            log_probs, _ = response_log_probs(self.policy, micro.prompt_ids, micro.response_ids, micro.response_mask,
                                              temperature=self.cfg.rollout.temperature,
                                              chunk_size=self.cfg.train.logprob_chunk_tokens)
        (log_probs.sum() * 0.0).backward()

    def _micro_batch_loss(self, micro: RolloutBatch, mini: MiniBatch, keep_head_logits: bool = False) -> LossOutput:
        """The loss of one micro-batch, normalised by its whole mini-batch ``mini``, with every method's term, its
        metrics and their counts (:class:`~tether.algos.LossOutput`); ``keep_head_logits``: as
        :meth:`_choose_checkpointing` chose for it."""
        a = self.cfg.algorithm
        num_tokens, num_seqs = mini.num_tokens, mini.num_seqs
        mask = loss_mask(micro)
        with self.autocast():
            log_probs, entropy = response_log_probs(
                self.policy, micro.prompt_ids, micro.response_ids, micro.response_mask,
                temperature=self.cfg.rollout.temperature, with_entropy=True,
                chunk_size=self.cfg.train.logprob_chunk_tokens, keep_head_logits=keep_head_logits)
        old = micro.token.get("old_log_probs", log_probs.detach())
        c = self.cfg.rollout.correction  # the engine's mu against pi_old, on the tokens parity compares
        corr = None if c.mode == "none" else algos.rollout_correction(
            c.mode, old, micro.sample_log_probs, micro.response_mask, compared_tokens(micro), **c.bounds())
        self.health.observe(micro, old, corr)  # pi_old under the weights the engine sampled with: parity, free
        inputs = LossInputs(
            log_probs=log_probs, old_log_probs=old, advantages=micro.token["advantages"],
            response_mask=mask, behaviour_log_probs=micro.sample_log_probs, source=micro.source,
            ref_log_probs=micro.token.get("ref_log_probs"), num_tokens=num_tokens, num_seqs=num_seqs,
            max_response_len=self.cfg.rollout.max_new_tokens,
            tokens=self.methods.loss_token_inputs(micro),
            token_weights=None if corr is None else corr.weights)
        out = self.policy_loss_fn(inputs, agg=a.loss_agg, **a.loss_kwargs)
        loss = out.loss
        metrics = {**out.metrics, **({} if corr is None else corr.metrics), "actor/pg_loss": out.loss.detach()}
        counts = {**out.counts, **({} if corr is None else corr.counts)}
        if corr is not None or LOSS_MASK in micro.token:
            # health.no_signal: a correction that drops every token, or a loss mask without a row (every row
            # truncated), trains nothing whatever the advantages; this is the advantage that reaches the gradient
            kept = mask if corr is None else (corr.weights > 0).to(mask.dtype) * mask
            metrics["actor/kept_advantage_abs_mean"] = algos.masked_mean(micro.token["advantages"].abs() * kept, mask)
        agg = dict(num_tokens=num_tokens, num_seqs=num_seqs, max_response_len=self.cfg.rollout.max_new_tokens)
        ent = algos.aggregate(entropy, mask, "token-mean", num_tokens=num_tokens)
        metrics["actor/entropy"] = ent.detach()
        if a.entropy_coef:
            loss = loss - a.entropy_coef * algos.aggregate(entropy, mask, a.loss_agg, **agg)
        if a.kl.coef > 0 and not a.kl.in_reward:
            kl = self._kl_term(log_probs, inputs.require("ref_log_probs", "kl"), micro, mini)
            loss = loss + a.kl.coef * kl
            metrics["actor/kl_loss"] = kl.detach()
        extra = self.methods.extra_loss(loss, inputs, micro, self.hook_context(mini))
        return LossOutput(extra.loss, {**metrics, **extra.metrics}, {**counts, **extra.counts},
                          {**out.derived, **extra.derived})

    def _kl_term(self, log_probs: torch.Tensor, ref_log_probs: torch.Tensor, micro: RolloutBatch,
                 mini: MiniBatch) -> torch.Tensor:
        """The micro-batch's share of its mini-batch's KL loss term: ``algorithm.loss_agg`` of the estimate over the
        on-policy rows' loss tokens (:func:`policy_loss_mask`), normalised by the mini-batch's. k1/k3 estimate
        KL(pi || ref) only on samples of pi; an anchor (ARMOR's, sampled by the reference) would pull the term toward
        an estimate of another divergence, so it adds to neither its numerator nor its normalisers, as it leaves the
        KL penalty in the reward. Without anchors the masks and normalisers are the loss's own, bit for bit."""
        a = self.cfg.algorithm
        on_policy = policy_loss_mask(mini.batch)
        return algos.aggregate(algos.kl_estimate(log_probs, ref_log_probs, a.kl.estimator), policy_loss_mask(micro),
                               a.loss_agg, num_tokens=on_policy.sum(), num_seqs=(on_policy.sum(1) > 0).sum(),
                               max_response_len=self.cfg.rollout.max_new_tokens)


def add_micro_metrics(total: dict[str, torch.Tensor], micro: LossOutput, *, tokens: torch.Tensor,
                      derived: dict[str, Callable[[dict[str, float]], float]] | None = None) -> None:
    """Fold one micro-batch's metrics into its mini-batch's ``total``, in place (see :data:`SUMMED_METRICS`): a mean
    adds its value times its units to ``total[k]``, and its units to ``total[k + UNITS]``.

    Args:
        micro: the micro-batch's metrics, and the units of those that are not means over its response tokens.
        tokens: the micro-batch's response tokens, the units of every other mean.
        derived: collects the formulas of the metrics that are no mean (``LossOutput.derived``); those are not
            folded, :func:`step_values` computes them.
    """
    if derived is not None:
        derived.update(micro.derived)
    for k, v in micro.metrics.items():
        if k in micro.derived:
            continue
        v = v.float()
        pick = extremum(k)
        if pick is not None:
            total[k] = pick(total[k], v) if k in total else v
        elif k in SUMMED_METRICS:
            total[k] = total.get(k, 0.0) + v
        else:
            units = micro.counts.get(k, tokens)
            total[k] = total.get(k, 0.0) + units * v
            total[k + UNITS] = total.get(k + UNITS, 0.0) + units


def step_values(sums: dict[str, float], counts: dict[str, int],
                derived: dict[str, Callable[[dict[str, float]], float]] | None = None) -> dict[str, float]:
    """The step's metrics from its mini-batches' ``sums`` (each summed over the ``counts[k]`` mini-batches that
    logged it): a mean is its summed value over its summed units (0 where it had none, as ``masked_mean``), any
    other metric the mean over its mini-batches; then each ``derived`` metric, by its formula over those."""
    out = {}
    for k, v in sums.items():
        if k.endswith(UNITS):
            continue
        units = sums.get(k + UNITS)
        out[k] = v / counts[k] if units is None else v / units if units else 0.0
    for k, formula in (derived or {}).items():
        out[k] = formula(out)
    return out


def loss_mini_batch(batch: RolloutBatch, rows: torch.Tensor, *, mask_truncated: bool) -> MiniBatch:
    """The mini-batch of ``batch``'s ``rows`` and the normalisers of its loss.

    With ``algorithm.mask_truncated`` (DAPO's overlong filtering, arXiv:2503.14476 Sec. 3.4) a row that hit
    ``rollout.max_new_tokens`` (``info["truncated"]``: a single-turn response, or one turn of an episode) leaves the
    loss: its tokens leave the loss mask (``token[LOSS_MASK]``, which the policy loss, the entropy bonus and the KL
    term count) and the normalisers, so every aggregation mode gives the loss of the mini-batch without it. Its
    advantage, made before, kept it in its group's mean and std, as TRL's ``mask_truncated_completions`` does. The
    forward passes and scoring still see every row, so pi_old stays the update's first pass bit for bit.

    The sequence count is the rows with at least one token in the loss, as :func:`tether.algos.aggregate` counts
    them: a row without response tokens (an agent turn or a user engine's empty response, a truncated row) adds
    nothing to a sequence mean's numerator and nothing to its denominator.
    """
    part = batch.select(rows)
    if mask_truncated:
        if "truncated" not in part.info:
            raise ValueError("algorithm.mask_truncated=true needs info['truncated'] on the batch's rows, and this "
                             "collector records none")
        kept = torch.tensor([not truncated for truncated in part.info["truncated"]], dtype=part.response_mask.dtype,
                            device=part.response_mask.device)
        part.token[LOSS_MASK] = part.response_mask * kept[:, None]
    mask = loss_mask(part)
    return MiniBatch(rows=rows, num_tokens=float(mask.sum()), num_seqs=int((mask.sum(1) > 0).sum()), batch=part)


def loss_mask(batch: RolloutBatch) -> torch.Tensor:
    """The response tokens the loss counts: the mask :func:`loss_mini_batch` set, else every response token. [N, T]"""
    return batch.token.get(LOSS_MASK, batch.response_mask)


def policy_loss_mask(batch: RolloutBatch) -> torch.Tensor:
    """The loss tokens (:func:`loss_mask`) of the rows the policy sampled (``source`` 0), those the KL loss term
    counts. [N, T]"""
    mask = loss_mask(batch)
    return mask * (batch.source == 0).to(mask.dtype)[:, None]


def update_mini_batches(n_rows: int, seed: int, mini_batches: int) -> tuple[torch.Tensor, ...]:
    """The rows of the update's mini-batches of an ``n_rows``-row batch: one shuffle seeded ``seed`` (the step's
    ``"shuffle"``), cut into ``mini_batches`` parts, which every ppo epoch reuses and scoring runs in."""
    order = torch.randperm(n_rows, generator=torch.Generator().manual_seed(seed))
    return order.chunk(mini_batches)


@torch.no_grad()
def score_log_probs(model: Any, batch: RolloutBatch, prompt_ids: list[list[int]] | None = None, *, cfg: Config,
                    precision: Callable[[], contextlib.AbstractContextManager], world_size: int,
                    shuffle_seed: int) -> torch.Tensor:
    """log-probs of the batch's response tokens under ``model`` (optionally after other prompts), no grad: in the
    trainer's precision and sampling temperature, and in the micro-batches of the update's first pass. [N, T], 0
    on padding.

    Its mini-batches (:func:`update_mini_batches`), each cut as the update cuts it on every rank
    (:func:`~tether.trainer.micro_batches.every_rank_micro_batches`), so each row shares its forward with the same
    rows, padded to the same width, as in the update. Under bf16 autocast a row's log-probs move by up to about
    1e-2 with the rows beside it (1e-6 in float32): scored in contiguous chunks, pi_old made the first ratio of an
    on-policy batch 1 only to that, with a nonzero ``actor/ppo_kl`` and clip fraction, and a reference equal to the
    policy gave a nonzero KL term. Now both are exact. verl (``dp_actor.compute_log_prob`` and ``update_policy``)
    scores in row order with a micro-batch size of its own and is exact only with one optimiser step, where it takes
    the update's own forward as pi_old, as :meth:`StepPhases.score` does.

    Args:
        precision: the trainer's precision context (``TrainerBuild.autocast``), the update's.
        world_size: data-parallel ranks; each scores every rank's rows (a sharded model: the same calls on each).
        shuffle_seed: the step's ``seed_for("shuffle")``, the update's.
    """
    prompts = batch.prompt_ids if prompt_ids is None else prompt_ids
    lengths = [(len(p), t) for p, (_, t) in zip(prompts, batch.row_lengths(), strict=True)]
    o = cfg.optim
    out = None
    for part in update_mini_batches(len(batch), shuffle_seed, o.mini_batches):
        mini = part.tolist()
        for group in every_rank_micro_batches(world_size, [lengths[r] for r in mini], o.micro_batch_size,
                                              o.max_tokens_per_micro_batch):
            rows = [mini[i] for i in group]
            micro = narrowed(batch, rows, lengths)
            with precision():
                lp, _ = response_log_probs(model, [prompts[r] for r in rows], micro.response_ids,
                                           micro.response_mask, temperature=cfg.rollout.temperature,
                                           chunk_size=cfg.train.logprob_chunk_tokens)
            out = lp.new_zeros(batch.response_mask.shape) if out is None else out
            out[torch.as_tensor(rows, device=out.device), :lp.shape[1]] = lp
    return out * batch.response_mask


def narrowed(batch: RolloutBatch, rows: Sequence[int], lengths: Sequence[tuple[int, int]]) -> RolloutBatch:
    """``rows`` of ``batch``, cut to the longest response among them: a micro-batch of short rows does not run
    the padding columns of the batch's longest one (masked out, they change no log-prob)."""
    return batch.select(rows).narrow(max(1, *(lengths[r][1] for r in rows)))


def batch_metrics(batch: RolloutBatch) -> dict[str, float]:
    lengths = batch.response_mask.sum(1)
    on_policy = batch.source == 0
    return {
        "train/reward_mean": batch.rewards[on_policy].mean().item(),
        "train/accuracy": batch.correct[on_policy].float().mean().item(),
        "train/response_length": lengths[on_policy].mean().item(),
        "train/rows": float(len(batch)),
    }

