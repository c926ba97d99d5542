"""The RL step, read top to bottom: collect -> score -> advantages -> update -> after.

The trainer knows the steps of on-policy RL, never the methods: ARMOR, EAPO and SEED reach in
through the hooks of :class:`tether.methods.Method`, which see a :class:`~tether.methods.StepContext`
(:meth:`Trainer.hook_context`), never the trainer.

Every model lives on ``device`` (``train.device``), and so does the batch from scoring on: the collector
builds it on the CPU, :meth:`Trainer.train_step` moves it once.
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
import signal
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

from tether import algos
from tether.advantage_inputs import advantage_inputs
from tether.algos import LossInputs
from tether.checks import run_checks
from tether.checks.components import needs_reference
from tether.config import Config, ConfigError
from tether.distributed import DataParallel, build_strategy, resolve_device
from tether.distributed.strategy import own_micro_batches
from tether.engine.base import Intervention
from tether.engine.registry import build_engine, engine_entry
from tether.errors import RefillShortfall
from tether.health import HealthError, HealthMonitor
from tether.health.degenerate import vocab_size
from tether.methods import MiniBatch, Reference, StepContext, build_methods
from tether.methods.base import Method
from tether.methods.context import step_seed
from tether.models import load_policy
from tether.models.forward import response_log_probs
from tether.models.layers import LayerCheckpointing, activation_bytes, checkpoint_layers
from tether.models.lora import REFERENCE, BaseModelView, add_lora, add_reference_adapter, is_lora, serving_state_dict
from tether.rollout.batch import RolloutBatch
from tether.rollout.collectors import collector_class
from tether.track import Tracker, build_tracker, write_text_atomic
from tether.track.progress import status
from tether.trainer.checkpoint import CheckpointManager, load_state, rng_state, seed_everything, set_rng_state
from tether.trainer.rundir import prepare_run_dir
from tether.trainer.stop import StopSignals, TrainingStopped

# Micro-batch terms normalised by the whole mini-batch's counts: their mini-batch value is the sum over
# micro-batches. Every other micro-batch metric is a local mean, averaged weighted by rows.
SUMMED_METRICS = frozenset({"actor/pg_loss", "actor/kl_loss", "actor/entropy"})


def build_collector(cfg: Config, tokenizer: Any) -> Any:
    """Single-turn groups for a ``task``, the multi-turn agent loop for an ``env`` (:func:`collector_class`)."""
    collector = collector_class(cfg)
    if cfg.task is not None:
        from tether.tasks import make_task

        return collector(make_task(cfg.task.name, **cfg.task.kwargs), tokenizer, cfg)
    return collector(cfg, tokenizer)


class Trainer:
    def __init__(self, cfg: Config, *, policy: Any = None, tokenizer: Any = None) -> None:
        """Build every component in dependency order. ``policy``/``tokenizer`` override ``cfg.model``."""
        self.cfg = cfg
        self.device = resolve_device(cfg.train.device)  # a missing GPU fails now, before any model loads
        run_checks(cfg, policy=policy is None)  # tether.checks: the config, and what it names is here
        self.strategy = build_strategy(cfg.distributed, self.device)  # joins torchrun's group; lays models out
        self.dp = self.strategy.dp  # one process, or this rank's place under torchrun
        if cfg.train.threads:
            torch.set_num_threads(cfg.train.threads)
        seed_everything(cfg.seed)  # Python's, NumPy's and torch's global generators; restored on resume
        self.run_dir = Path(cfg.run_dir)
        self.checkpoints = CheckpointManager(self.run_dir, cfg.train.keep_last, self.dp)
        # the lock, a crash's leftovers, the checkpoint to resume and its settings: settled before any model loads
        resume_from = prepare_run_dir(cfg, self.checkpoints, self.dp)
        self.step = 0
        self.best_value = -math.inf
        self.val_history: list[tuple[int, dict[str, float]]] = []
        self.skipped_updates = self.skipped_in_a_row = 0  # optimiser steps skipped for a non-finite gradient

        # 1. methods first: they may need a reference model
        self.methods: list[Method] = build_methods(cfg.methods)
        # the per-token tensors methods add for the loss, passed to it by name (LossInputs.tokens)
        self.loss_tokens = sorted({name for m in self.methods for name in m.loss_tokens})
        # 2. models
        if policy is None:
            self.status(f"loading the policy {cfg.model.name}")
            policy, tokenizer = load_policy(cfg.model.name)
        self.tokenizer = tokenizer
        if cfg.model.lora is not None:  # only the adapters train (docs/lora.md)
            policy = add_lora(policy, cfg.model.lora, base_name=cfg.model.name)
        policy.eval()  # no dropout: old and new log-probs must come from the same function
        ref = self._build_ref(policy) if needs_reference(cfg) else None  # copied before sharding changes the module
        self.checkpointing = layer_checkpointing(policy, cfg.train.gradient_checkpointing)
        self.policy = self.strategy.prepare(policy)  # on self.device from here on
        # a method may move the reference (ARMOR's resets, Reference.reset_to): then checkpoints save it; a LoRA
        # policy's reference is a view of the policy itself (adapters off, or its reference adapter), wherever the
        # policy is
        self.reference = None if ref is None else Reference(
            ref if isinstance(ref, BaseModelView) else self.strategy.prepare(ref))
        # 3. engine, data, loss functions
        self.make_engine = partial(rollout_engine, strategy=self.strategy, tokenizer=tokenizer, cfg=cfg)
        self.log_probs = partial(score_log_probs, cfg=cfg, device=self.device)  # scoring passes, and ctx.log_probs
        self.status(f"starting the {cfg.rollout.engine} engine and the {'task' if cfg.task else 'environment'}")
        self.engine = self.make_engine(self.policy)
        self.collector = build_collector(cfg, tokenizer)
        a = cfg.algorithm
        self.advantage_fn = algos.get_advantage(a.advantage)
        self.policy_loss_fn = algos.get_policy_loss(a.policy_loss)
        # 4. optimiser and warm-up schedule
        o = cfg.optim
        trainable = [p for p in self.policy.parameters() if p.requires_grad]  # all, or the LoRA adapters
        self.optimizer = torch.optim.AdamW(trainable, lr=o.lr, betas=o.betas, weight_decay=o.weight_decay)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda s: min(1.0, (s + 1) / o.warmup_steps) if o.warmup_steps else 1.0)
        self.tracker = build_tracker(self.run_dir, tensorboard=cfg.logging.tensorboard, wandb=cfg.logging.wandb,
                                     mlflow=cfg.logging.mlflow) if self.dp.is_main else Tracker(self.run_dir, [])
        if self.dp.is_main:  # W&B and MLflow record the run's settings (TensorBoard as text); config.yaml again
            self.tracker.log_config(cfg.model_dump(mode="json"))
        self.health = HealthMonitor(cfg, self.run_dir, tokenizer, is_main=self.dp.is_main,  # docs/health.md
                                    vocab_size=vocab_size(policy))
        for m in self.methods:
            m.setup(self.hook_context())
        if resume_from is not None:
            self.resume(resume_from)

    # -- construction helpers ----------------------------------------------------------------

    def _build_ref(self, policy: Any) -> Any:
        """The frozen reference: ``model.ref_name``, else the initial policy: a copy, or with LoRA the policy with
        its adapters off (no copy; it stays the initial policy since only the adapters train), or with a frozen
        reference adapter of its own when a method resets the reference (docs/lora.md)."""
        if self.cfg.model.ref_name:
            ref, _ = load_policy(self.cfg.model.ref_name)
        elif is_lora(policy):
            if any(m.moves_reference for m in self.methods):
                add_reference_adapter(policy)
                return BaseModelView(policy, adapter=REFERENCE)
            return BaseModelView(policy)
        else:
            ref = copy.deepcopy(policy)
        ref.eval().requires_grad_(False)
        return ref

    @property
    def ref_policy(self) -> Any:
        """The reference model, or None when the run loads none."""
        return None if self.reference is None else self.reference.model

    @property
    def ref_modified(self) -> bool:
        """Whether a method moved the reference (then it is checkpointed)."""
        return self.reference is not None and self.reference.moved

    def seed_for(self, purpose: str, k: int = 0) -> int:
        """A sampling seed that depends only on (run seed, step, purpose, k): resumes replay exactly."""
        return step_seed(self.cfg.seed, self.step, purpose, k)

    def hook_context(self, mini_batch: MiniBatch | None = None) -> StepContext:
        """What a method hook sees of the run now (tether/methods/context.py): the step, settings, models, engine
        and helpers, never the trainer. Built per call, so ``engine`` is the one sampling at that moment (the
        health monitor's recorder while the collector runs)."""
        return StepContext(step=self.step, cfg=self.cfg, device=self.device, run_dir=self.run_dir,
                           tokenizer=self.tokenizer, policy=self.policy, reference=self.reference,
                           engine=self.engine, sampling=self.collector.sampling(),
                           sample_groups=getattr(self.collector, "generate", None), log_probs=self.log_probs,
                           make_engine=self.make_engine, mini_batch=mini_batch)

    def push_weights(self) -> None:
        """Give the engine the policy's current weights: free for the in-process engine, which holds the same
        tensors; one broadcast for engines with their own copy (Ray actors, vLLM), with LoRA adapters merged."""
        if is_lora(self.policy) and engine_entry(self.cfg.rollout.engine).shares_policy:
            return  # the engine runs the policy module, adapters included
        self.engine.load_weights(serving_state_dict(self.policy))

    def autocast(self) -> contextlib.AbstractContextManager:
        """The precision context of every trainer forward pass (scoring and the loss alike)."""
        return autocast(self.cfg, self.device)

    # -- the loop ------------------------------------------------------------------------------

    def fit(self) -> dict[str, float]:
        """Train until ``train.steps``; validate and checkpoint on schedule. Returns the last metrics.

        Raises:
            TrainingStopped: SIGTERM or SIGINT arrived (the step under way was finished and saved first), or
                ``train.max_skipped_updates`` optimiser steps in a row were non-finite.
            HealthError: a health check stopped the run (docs/health.md); its metrics and ``summary.json`` are
                written first, and ``checkpoints/best`` keeps the validation peak.
        """
        try:
            return self._fit()
        except HealthError:
            self._finish()
            raise
        except RefillShortfall as err:  # one line naming where a resume starts and what it may change
            self.tracker.close()
            raise TrainingStopped(refill_stop_message(str(err), self.checkpoints.latest())) from None

    def _finish(self) -> None:
        """Close the metric sinks and write ``summary.json``: at the end, and when a health check stops the run."""
        self.tracker.close()
        if self.dp.is_main:
            write_text_atomic(self.run_dir / "summary.json", json.dumps(self.summary(), indent=2))

    def _fit(self) -> dict[str, float]:
        t = self.cfg.train
        last: dict[str, float] = {}
        if self.step == 0 and self.cfg.val.every:
            last.update(self.validate())
        from tether.track.progress import Progress

        with Progress(t.steps, start=self.step, enabled=self.cfg.logging.progress and self.dp.is_main) as bar, \
                StopSignals() as signals:
            saved_at = time.monotonic()
            while self.step < t.steps:
                metrics = self.train_step()
                if self.cfg.val.every and self.step % self.cfg.val.every == 0:
                    metrics.update(self.validate())
                save, stop = self._save_or_stop(saved_at, signals.signal is not None)
                if save:
                    path = self.save()
                    saved_at = time.monotonic()
                bar.update(self.step, metrics)
                last.update(metrics)
                if stop:
                    self.tracker.close()
                    signum = signals.signal or signal.SIGTERM  # under torchrun another rank may have had it
                    raise TrainingStopped(f"stopped by {signal.Signals(signum).name} after step {self.step}, saved "
                                          f"in {path}; run the same command again to resume", 128 + signum)
        self._finish()
        return last

    def _save_or_stop(self, saved_at: float, signalled: bool) -> tuple[bool, bool]:
        """Whether to checkpoint now (the step schedule, ``train.save_every_s`` or a signal) and whether to stop.
        Every rank takes part in a save, so one rank's clock or signal decides for all."""
        t = self.cfg.train
        scheduled = self.step == t.steps or bool(t.save_every and self.step % t.save_every == 0)
        late = bool(t.save_every_s) and time.monotonic() - saved_at >= t.save_every_s
        votes = self.dp.sum_metrics({"late": float(late), "signalled": float(signalled)})
        return scheduled or votes["late"] > 0 or votes["signalled"] > 0, votes["signalled"] > 0

    def summary(self) -> dict[str, Any]:
        """First and last validation, the best value of ``train.best_metric``, steps done."""
        out: dict[str, Any] = {"steps": self.step, "best": {self.cfg.train.best_metric: self.best_value}}
        if self.val_history:
            out["first_val"] = {"step": self.val_history[0][0], **self.val_history[0][1]}
            out["last_val"] = {"step": self.val_history[-1][0], **self.val_history[-1][1]}
        return out

    def train_step(self) -> dict[str, float]:
        start = time.perf_counter()
        with self.health.recording(self):              # 1-2. generate, reward, method hooks, filters
            batch, metrics = self.collector.collect(self)  # (the engine records what it samples)
        metrics.update(self.health.check_batch(batch, self.step + 1))  # the token round trip; the reward audit
        batch = batch.to(self.device)                  #    the one move of the batch to the models' device
        t_rollout = time.perf_counter() - start
        metrics.update(self.score(batch))              # 3. old / ref / method log-probs
        metrics.update(self.compute_advantages(batch))  # 4. advantages
        t_update = time.perf_counter()
        metrics.update(self.update(batch))             # 5. mini-batch updates
        t_sync = time.perf_counter()
        self.push_weights()                            #    engines with their own weights sample with the new ones
        t_sync = time.perf_counter() - t_sync
        self.step += 1
        for m in self.methods:                         # 6. method bookkeeping (reference resets...)
            metrics.update(m.after_update(self.hook_context()))
        metrics.update(batch_metrics(batch))
        metrics.update(self.health.end_step(metrics, self.dp, self.step))  # parity; a collapsed policy
        n_tokens = float(batch.response_mask.sum())
        now = time.perf_counter()
        metrics.update({"perf/step_s": now - start, "perf/rollout_s": t_rollout,
                        "perf/rollout_tok_s": n_tokens / max(t_rollout, 1e-9),
                        "perf/train_tok_s": n_tokens / max(now - t_update - t_sync, 1e-9),
                        "perf/weight_sync_s": t_sync,
                        "actor/lr": self.scheduler.get_last_lr()[0]})
        self.tracker.log(metrics, self.step)
        self.health.stop_if_unhealthy()                #    after logging: the failing step's numbers are kept
        return metrics

    # -- hooks the collector calls -----------------------------------------------------------

    def intervention(self) -> Intervention | None:
        hooks = [h for m in self.methods if (h := m.intervention(self.hook_context())) is not None]
        if len(hooks) > 1:
            raise RuntimeError("two methods want to intervene in sampling; at most one may")
        return hooks[0] if hooks else None

    def run_generation_hooks(self, batch: RolloutBatch) -> tuple[RolloutBatch, dict[str, float]]:
        metrics: dict[str, float] = {}
        for m in self.methods:
            batch, extra = m.on_generation(batch, self.hook_context())
            metrics.update(extra)
        return batch, metrics

    # -- 3. scoring --------------------------------------------------------------------------

    def _updates_per_step(self) -> int:
        return self.cfg.optim.mini_batches * self.cfg.optim.ppo_epochs

    def score(self, batch: RolloutBatch) -> dict[str, float]:
        # With one optimiser step per RL step the update's own forward, detached, *is* pi_old
        # (same weights, same function), so the separate pass is skipped (as TRL does).
        if self._updates_per_step() > 1:
            batch.token["old_log_probs"] = self.log_probs(self.policy, batch)
        if self.ref_policy is not None:
            batch.token["ref_log_probs"] = self.log_probs(self.ref_policy, batch)
        metrics: dict[str, float] = {}
        for m in self.methods:
            metrics.update(m.on_score(batch, self.hook_context()))
        kl = self.cfg.algorithm.kl
        if kl.in_reward and kl.coef > 0:
            batch.token.setdefault("old_log_probs", self.log_probs(self.policy, batch))
            per_token = algos.kl_estimate(batch.token["old_log_probs"], batch.token["ref_log_probs"], kl.estimator)
            penalty = (per_token * batch.response_mask).sum(1)
            batch.rewards = batch.rewards - kl.coef * penalty
            metrics["reward/kl_penalty"] = penalty.mean().item()
        return metrics

    # -- 4. advantages -----------------------------------------------------------------------

    def compute_advantages(self, batch: RolloutBatch) -> dict[str, float]:
        """The one place advantages are made: the configured estimator over the batch's rewards, group ids and
        tags (GiGPO's step returns, EAPO's injected rows), broadcast to response tokens. Methods then only read
        them."""
        out = self.advantage_fn(advantage_inputs(batch), **self.cfg.algorithm.advantage_kwargs)
        advantages = batch.token["advantages"] = out.advantages[:, None] * batch.response_mask
        metrics = {k: v.item() for k, v in out.metrics.items()}
        for m in self.methods:
            metrics.update(m.on_advantages(batch, self.hook_context()))
            if batch.token["advantages"] is not advantages:
                raise RuntimeError(f"methods.{m.name} replaced the advantages in on_advantages; the trainer makes "
                                   "them (algorithm.advantage), a method may only read them")
        metrics["train/advantage_abs_mean"] = algos.masked_mean(batch.token["advantages"].abs(),
                                                                batch.response_mask).item()
        return metrics

    # -- 5. update ---------------------------------------------------------------------------

    def update(self, batch: RolloutBatch) -> dict[str, float]:
        o = self.cfg.optim
        order = torch.randperm(len(batch), generator=torch.Generator().manual_seed(self.seed_for("shuffle")))
        sums: dict[str, float] = {}
        counts: dict[str, int] = {}
        for _ in range(o.ppo_epochs):
            for rows in order.chunk(o.mini_batches):
                part = batch.select(rows)
                mini = MiniBatch(rows=rows, num_tokens=float(part.response_mask.sum()), num_seqs=len(part), batch=part)
                for key, value in self._mini_batch_step(mini).items():
                    sums[key] = sums.get(key, 0.0) + value
                    counts[key] = counts.get(key, 0) + 1
        return {**{k: sums[k] / counts[k] for k in sums}, "actor/skipped_updates": float(self.skipped_updates)}

    def _mini_batch_step(self, mini: MiniBatch) -> dict[str, float]:
        o = self.cfg.optim
        lengths = mini.batch.row_lengths()
        metrics: dict[str, torch.Tensor] = {}
        self.optimizer.zero_grad(set_to_none=True)
        # this rank's share of the rows, by count or by token budget; normalisers stay the mini-batch's
        activations = []  # (estimated GiB, checkpointed) of each micro-batch
        for mb in self.strategy.micro_batches(lengths, o.micro_batch_size, o.max_tokens_per_micro_batch):
            micro = narrowed(mini.batch, mb.rows, lengths)
            activations.append(self._choose_checkpointing(mb.rows, lengths))
            if mb.padding:
                self._lock_step_pass(micro)
                continue
            loss, micro_metrics = self._micro_batch_loss(micro, mini)
            loss.backward()
            share = len(micro) / mini.num_seqs
            for k, v in micro_metrics.items():
                weight = 1.0 if k in SUMMED_METRICS else share
                metrics[k] = metrics.get(k, 0.0) + weight * v.detach().float()
        metrics = self.dp.sum_metrics(metrics)  # N processes: partial sums -> mini-batch values
        grad_norm = self.strategy.clip_grad_norm(self.policy, o.grad_clip)  # of the gradient summed over ranks
        if torch.isfinite(grad_norm):
            self.optimizer.step()
            self.scheduler.step()  # a skipped update does not advance the warm-up either
            self.skipped_in_a_row = 0
        else:
            self._skip_update()
        metrics["actor/grad_norm"] = grad_norm
        # this rank's (a rank of a replicated run may have no rows of a small mini-batch)
        metrics["perf/activation_gb"] = max((gb for gb, _ in activations), default=0.0)
        metrics["perf/checkpointed_micro_batches"] = sum(on for _, on in activations) / max(1, len(activations))
        return {k: float(v) for k, v in metrics.items()}  # one host sync per mini-batch

    def _choose_checkpointing(self, rows: Sequence[int], lengths: Sequence[tuple[int, int]]) -> tuple[float, bool]:
        """The micro-batch's estimated activation memory in GiB (:func:`~tether.models.layers.activation_bytes` of
        its padded tokens) and whether its decoder layers recompute in backward. Under
        ``train.gradient_checkpointing: auto`` they do when the estimate exceeds
        ``train.activation_memory_budget_gb``: small micro-batches keep the faster forward (and the shared-prompt
        pass), large ones fit the budget."""
        tokens = len(rows) * (max(lengths[r][0] for r in rows) + max(lengths[r][1] for r in rows))
        gb = activation_bytes(self.policy.config, tokens, next(self.policy.parameters()).element_size()) / 2**30
        if self.checkpointing is None:
            return gb, False
        if self.cfg.train.gradient_checkpointing == "auto":
            self.checkpointing.on = gb > self.cfg.train.activation_memory_budget_gb
        return gb, self.checkpointing.on

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
                                              temperature=self.cfg.rollout.temperature)
        (log_probs.sum() * 0.0).backward()

    def _micro_batch_loss(self, micro: RolloutBatch, mini: MiniBatch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The loss of one micro-batch, normalised by its whole mini-batch ``mini``, with every method's term."""
        a = self.cfg.algorithm
        num_tokens, num_seqs = mini.num_tokens, mini.num_seqs
        with self.autocast():
            log_probs, entropy = response_log_probs(self.policy, micro.prompt_ids, micro.response_ids,
                                                    micro.response_mask, temperature=self.cfg.rollout.temperature,
                                                    with_entropy=True)
        old = micro.token.get("old_log_probs", log_probs.detach())
        self.health.observe(micro, old)  # pi_old under the weights the engine sampled with: parity, free
        inputs = LossInputs(
            log_probs=log_probs, old_log_probs=old, advantages=micro.token["advantages"],
            response_mask=micro.response_mask, behaviour_log_probs=micro.sample_log_probs, source=micro.source,
            ref_log_probs=micro.token.get("ref_log_probs"), num_tokens=num_tokens, num_seqs=num_seqs,
            max_response_len=self.cfg.rollout.max_new_tokens,
            tokens={k: micro.token[k] for k in self.loss_tokens if k in micro.token})
        out = self.policy_loss_fn(inputs, agg=a.loss_agg, **a.loss_kwargs)
        loss = out.loss
        metrics = {**out.metrics, "actor/pg_loss": out.loss.detach()}
        agg = dict(num_tokens=num_tokens, num_seqs=num_seqs, max_response_len=self.cfg.rollout.max_new_tokens)
        ent = algos.aggregate(entropy, micro.response_mask, "token-mean", num_tokens=num_tokens)
        metrics["actor/entropy"] = ent.detach()
        if a.entropy_coef:
            loss = loss - a.entropy_coef * algos.aggregate(entropy, micro.response_mask, a.loss_agg, **agg)
        if a.kl.coef > 0 and not a.kl.in_reward:
            kl = algos.aggregate(algos.kl_estimate(log_probs, inputs.require("ref_log_probs", "kl"), a.kl.estimator),
                                 micro.response_mask, a.loss_agg, **agg)
            loss = loss + a.kl.coef * kl
            metrics["actor/kl_loss"] = kl.detach()
        ctx = self.hook_context(mini)
        for m in self.methods:
            extra = m.extra_loss(inputs, micro, ctx)
            if extra is not None:
                loss = loss + extra.loss
                metrics.update(extra.metrics)
        return loss, metrics

    # -- validation and checkpoints ----------------------------------------------------------

    def status(self, message: str) -> None:
        """A phase's one line on stderr (``logging.progress``), so the minutes before the first step are not silent."""
        if self.cfg.logging.progress:
            status(message)

    def validate(self) -> dict[str, float]:
        v, start = self.cfg.val, time.monotonic()
        self.status(f"validating at step {self.step} on split {v.split!r} ({v.max_prompts or 'all'} prompts x "
                    f"{1 if v.greedy else v.samples} samples)")
        metrics = self.collector.validate(self)
        self.status(f"validation at step {self.step}: {self.cfg.train.best_metric}="
                    f"{metrics.get(self.cfg.train.best_metric, float('nan')):.4f} ({time.monotonic() - start:.0f} s)")
        metrics.update(self.health.on_validation(self.step, metrics))  # the over-optimisation guard
        self.tracker.log(metrics, self.step)
        self.val_history.append((self.step, metrics))
        value = metrics.get(self.cfg.train.best_metric)
        if value is not None and value > self.best_value:
            self.best_value = value
            self.checkpoints.save_best(self._best_writer({"step": self.step, "metric": value,
                                                          "name": self.cfg.train.best_metric}))
            if self.dp.is_main:
                write_text_atomic(self.run_dir / "best.txt",
                                  f"{self.cfg.train.best_metric}={value} step={self.step}\n")
        self.health.stop_if_unhealthy()
        return metrics

    def _best_writer(self, state: dict[str, Any]) -> Callable[[Path], None]:
        def write(directory: Path) -> None:  # every rank: a sharded policy is gathered to rank 0 first
            self.strategy.save_pretrained(directory, self.policy)
            if self.dp.is_main:
                self.tokenizer.save_pretrained(directory)
                torch.save(state, directory / "trainer_state.pt")

        return write

    def state_dict(self) -> dict[str, Any]:
        """The trainer's own state; weights and optimiser state go through the distributed strategy."""
        return {
            "step": self.step, "best_value": self.best_value, "val_history": self.val_history, "rng": rng_state(),
            "scheduler": self.scheduler.state_dict(), "collector": self.collector.state_dict(),
            "methods": {m.name: m.state_dict() for m in self.methods}, "strategy": self.strategy.name,
            "health": self.health.state_dict(),
            "skipped_updates": self.skipped_updates,
        }

    def save(self) -> Path:
        """Every rank writes its part of ``step_<step>/`` (rank 0 alone for a replicated model)."""

        def write(directory: Path) -> None:
            ref = self.ref_policy if self.ref_modified else None
            extra = self.strategy.save_training_state(directory, self.policy, self.optimizer, ref)
            if self.dp.is_main:
                self.tokenizer.save_pretrained(directory)
                torch.save({**self.state_dict(), **extra}, directory / "trainer_state.pt")

        return self.checkpoints.save(self.step, write)

    def resume(self, path: Path) -> None:
        """Continue exactly where the checkpoint left off: weights, optimiser, schedule, data, RNG."""
        state = load_state(path)
        written_by = state.get("strategy", "replicate")  # checkpoints before sharding existed were replicated
        if written_by != self.strategy.name:
            raise ConfigError(f"{path} was written with distributed.strategy={written_by}; resume with that "
                              "strategy, or another run_dir (or train.resume=never train.overwrite=true: deletes this "
                              "run)")
        moved = self.strategy.load_training_state(path, state, self.policy, self.optimizer, self.ref_policy)
        if self.reference is not None:
            self.reference.moved = moved
        self.scheduler.load_state_dict(state["scheduler"])
        self.collector.load_state_dict(state["collector"])
        for m in self.methods:
            m.load_state_dict(state["methods"].get(m.name, {}))
        set_rng_state(state["rng"])
        self.health.load_state_dict(state.get("health", {}))  # checkpoints from before the checks have none
        self.step, self.best_value, self.val_history = state["step"], state["best_value"], state["val_history"]
        self.skipped_updates = state.get("skipped_updates", 0)  # absent from checkpoints before it was counted
        self.push_weights()


def refill_stop_message(shortfall: str, latest: Path | None) -> str:
    """The stop of a DAPO refill shortfall: what fell short, where the same command resumes, the settings a resume
    may change (neither is a setting that changes what the run means)."""
    change = "rollout.partial_batches=true (train on the groups that survived) or a larger rollout.max_gen_batches"
    if latest is None:
        return (f"{shortfall}; no checkpoint was written yet: run again with {change}, and train.overwrite=true (the "
                "run starts again at step 0)")
    return f"{shortfall}; the last checkpoint is {latest}: the same command with {change} resumes from it"


def autocast(cfg: Config, device: torch.device) -> contextlib.AbstractContextManager:
    """bfloat16 autocast on ``device`` when ``model.bf16_autocast``, else nothing: every trainer forward's precision."""
    if not cfg.model.bf16_autocast:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=torch.bfloat16)


def rollout_engine(model: Any, *, strategy: Any, tokenizer: Any, cfg: Config) -> Any:
    """The configured engine (``rollout.engine``) over ``model``; under data parallelism each rank samples its share
    of the prompts."""
    r = cfg.rollout
    return strategy.rollout_engine(build_engine(r.engine, model, tokenizer, cfg.model, r.engine_kwargs))


@torch.no_grad()
def score_log_probs(model: Any, batch: RolloutBatch, prompt_ids: list[list[int]] | None = None, *, cfg: Config,
                    device: torch.device) -> torch.Tensor:
    """log-probs of the batch's response tokens under ``model`` (optionally after other prompts), no grad: in the
    trainer's micro-batches, precision and sampling temperature. [N, T], 0 on padding."""
    prompts = batch.prompt_ids if prompt_ids is None else prompt_ids
    lengths = [(len(p), t) for p, (_, t) in zip(prompts, batch.row_lengths(), strict=True)]
    o = cfg.optim
    out = None
    for rows in own_micro_batches(DataParallel(), lengths, o.micro_batch_size, o.max_tokens_per_micro_batch):
        micro = narrowed(batch, rows, lengths)
        with autocast(cfg, device):
            lp, _ = response_log_probs(model, [prompts[r] for r in rows], micro.response_ids, micro.response_mask,
                                       temperature=cfg.rollout.temperature)
        out = lp.new_zeros(batch.response_mask.shape) if out is None else out
        out[torch.as_tensor(rows, device=out.device), :lp.shape[1]] = lp
    return out * batch.response_mask


def layer_checkpointing(policy: Any, mode: bool | str) -> LayerCheckpointing | None:
    """The switch of the policy's checkpointed decoder layers (``train.gradient_checkpointing``): on for true,
    off until the trainer's first large micro-batch for auto, None for false and for auto on a model whose
    decoder layers cannot be found (it never checkpoints)."""
    if mode is False:
        return None
    if mode == "auto":
        try:
            return checkpoint_layers(policy, on=False)
        except ValueError:
            return None
    return checkpoint_layers(policy)


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


def evaluate(cfg: Config) -> dict[str, float]:
    """Validation metrics of ``cfg.model.name`` (a checkpoint directory, say) on the held-out set."""
    if cfg.train.threads:
        torch.set_num_threads(cfg.train.threads)
    device = resolve_device(cfg.train.device)
    run_checks(cfg)
    status(f"loading {cfg.model.name}")
    policy, tokenizer = load_policy(cfg.model.name)
    policy.to(device).eval()
    status(f"evaluating on split {cfg.val.split!r} ({cfg.val.max_prompts or 'all'} prompts x "
           f"{1 if cfg.val.greedy else cfg.val.samples} samples)")
    engine = build_engine(cfg.rollout.engine, policy, tokenizer, cfg.model, cfg.rollout.engine_kwargs)
    evaluator = SimpleNamespace(cfg=cfg, engine=engine, step=0,
                                seed_for=lambda purpose, k=0: cfg.seed * 1_000_003 + k)
    return build_collector(cfg, tokenizer).validate(evaluator)
