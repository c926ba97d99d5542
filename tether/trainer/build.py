"""Construction of a :class:`~tether.trainer.Trainer`: every component in dependency order, before the first step.

What is checked before any model loads (the device, the config and what it names, the run directory's lock and
the checkpoint to resume) comes first; then the methods, the models, the engine (wrapped once by the health
checks), the collector, the loss functions, the optimiser and the metric sinks; then the methods' ``setup`` and,
when there is one, the resume.
"""

from __future__ import annotations

import contextlib
import copy
import math
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import torch

from tether import algos
from tether.checks.components import needs_reference
from tether.config import Config
from tether.distributed import build_strategy
from tether.engine.base import sampling_params
from tether.engine.registry import build_engine, engine_entry
from tether.health import HealthMonitor
from tether.health.degenerate import vocab_size
from tether.methods import MiniBatch, Reference, StepContext
from tether.methods.hooks import MethodSet
from tether.models import autocast, load_policy
from tether.models.chat_template import apply_chat_template
from tether.models.layers import LayerCheckpointing, checkpoint_layers
from tether.models.lora import REFERENCE, BaseModelView, add_lora, add_reference_adapter, is_lora, serving_state_dict
from tether.models.policy import REFERENCE_TOKENIZER_WHY, check_vocabulary, model_load_errors
from tether.optimizer import adamw
from tether.rollout.asynchronous import asynchronous
from tether.rollout.base import Collector, group_sampler
from tether.rollout.collectors import collector_class
from tether.seeding import StepSeeds
from tether.start import run_tracker, start_run
from tether.track import Tracker
from tether.track.progress import status
from tether.trainer.checkpoint import CheckpointManager, dir_step
from tether.trainer.rundir import prepare_run_dir


def build_collector(cfg: Config, tokenizer: Any) -> Collector:
    """The collector of ``cfg``'s workload (:func:`collector_class`), built as it says (``from_config``)."""
    collector = collector_class(cfg)
    apply_chat_template(tokenizer, cfg.model.chat_template)  # before any prompt is encoded
    return collector.from_config(cfg, tokenizer)


class TrainerBuild:
    """The trainer's construction and the handles every phase reads (engine, seeds, hook context)."""

    def __init__(self, cfg: Config, *, policy: Any = None, tokenizer: Any = None) -> None:
        """Build every component in dependency order. ``policy``/``tokenizer`` override ``cfg.model``."""
        self.cfg = cfg
        # a missing GPU fails first; then tether.checks (the config, and what it names is here); threads; the seed of
        # Python's, NumPy's and torch's global generators (restored from the checkpoint on resume)
        self.device = start_run(cfg, policy=policy is None)
        self.strategy = build_strategy(cfg.distributed, self.device)  # joins torchrun's group; lays models out
        self.dp = self.strategy.dp  # one process, or this rank's place under torchrun
        self.run_dir = Path(cfg.run_dir)
        self.checkpoints = CheckpointManager(self.run_dir, cfg.train.keep_last, self.dp)
        # the lock, a crash's leftovers, the checkpoint to resume and its settings: settled before any model loads
        resume_from = prepare_run_dir(cfg, self.checkpoints, self.dp)
        self.step = 0
        self.best_value = -math.inf
        self.val_history: list[tuple[int, dict[str, float]]] = []
        self.skipped_updates = self.skipped_in_a_row = 0  # optimiser steps skipped for a non-finite gradient

        # 1. methods first: they may need a reference model
        self.methods = MethodSet.from_config(cfg.methods)
        # 2. models
        if policy is None:
            self.status(f"loading the policy {cfg.model.name}")
            with model_load_errors("model.name", cfg.model.name):
                policy, tokenizer = load_policy(cfg.model.name)
        self.tokenizer = tokenizer
        if cfg.model.lora is not None:  # only the adapters train (docs/lora.md)
            policy = add_lora(policy, cfg.model.lora, base_name=cfg.model.name)
        policy.eval()  # no dropout: old and new log-probs must come from the same function
        ref = self._build_ref(policy) if needs_reference(cfg) else None  # copied before sharding changes the module
        self.activation_checkpointing = layer_checkpointing(policy, cfg.train.gradient_checkpointing)
        self.policy = self.strategy.prepare(policy)  # on self.device from here on
        # a method may move the reference (ARMOR's resets, Reference.reset_to): then checkpoints save it; a LoRA
        # policy's reference is a view of the policy itself (adapters off, or its reference adapter), wherever the
        # policy is
        self.reference = None if ref is None else Reference(
            ref if isinstance(ref, BaseModelView) else self.strategy.prepare(ref))
        # 3. engine, data, loss functions
        self.make_engine = partial(rollout_engine, strategy=self.strategy, tokenizer=tokenizer, cfg=cfg)
        self.health = HealthMonitor(cfg, self.run_dir, tokenizer, is_main=self.dp.is_main,  # docs/health.md
                                    vocab_size=vocab_size(policy))
        self.status(f"starting the {cfg.rollout.engine} engine and the {'task' if cfg.task else 'environment'}")
        # rollout.max_staleness > 0: batches sampled ahead in a thread, by an engine over weights of its own
        self.collector, engine = asynchronous(cfg, build_collector(cfg, tokenizer), self.make_engine(self.policy),
                                              self.policy, self.make_engine)
        self.use_engine(engine)
        a = cfg.algorithm
        self.advantage_fn = algos.get_advantage(a.advantage)
        self.policy_loss_fn = algos.get_policy_loss(a.policy_loss)
        # 4. optimiser and warm-up schedule
        o = cfg.optim
        trainable = [p for p in self.policy.parameters() if p.requires_grad]  # all, or the LoRA adapters
        self.optimizer = adamw(trainable, lr=o.lr, betas=o.betas, weight_decay=o.weight_decay)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda s: min(1.0, (s + 1) / o.warmup_steps) if o.warmup_steps else 1.0)
        self.tracker = run_tracker(cfg.logging, self.run_dir, dir_step(resume_from) if resume_from else 0) \
            if self.dp.is_main else Tracker(self.run_dir, [])
        if self.dp.is_main:  # W&B and MLflow record the run's settings (TensorBoard as text); config.yaml again
            self.tracker.log_config(cfg.model_dump(mode="json"))
        self.methods.setup(self.hook_context())
        if resume_from is not None:
            self.resume(resume_from)

    def _build_ref(self, policy: Any) -> Any:
        """The frozen reference: ``model.ref_name``, else the initial policy: a copy, or with LoRA the policy with
        its adapters off (no copy; it stays the initial policy since only the adapters train), or with a frozen
        reference adapter of its own when a method resets the reference (docs/lora.md)."""
        if self.cfg.model.ref_name:
            name = self.cfg.model.ref_name
            with model_load_errors("model.ref_name", name):
                ref, ref_tokenizer = load_policy(name)
            check_vocabulary(policy, self.tokenizer, ref, ref_tokenizer, "model.ref_name", name,
                             REFERENCE_TOKENIZER_WHY)
        elif is_lora(policy):
            if self.methods.moves_reference:
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

    @property
    def engine(self) -> Any:
        """The rollout engine over the policy (``rollout.engine``), which :meth:`push_weights` feeds; set by
        :meth:`use_engine` only (no setter), so nothing replaces it without its recorder."""
        return self._engine

    def use_engine(self, engine: Any) -> None:
        """Make ``engine`` the run's (at build, or a test's scripted engine) and :attr:`sampling_engine`, what the
        collector and the methods sample with: ``engine`` inside the health checks' recorder when they record (the
        token round trip), wrapped once here rather than swapped in around each collection."""
        self._engine = engine
        self.sampling_engine = self.health.wrap(engine)

    def seeds(self) -> StepSeeds:
        """The seeds of the step under way (:mod:`tether.seeding`): resumes replay exactly."""
        return StepSeeds(self.cfg.seed, self.step)

    def seed_for(self, purpose: str, k: int = 0) -> int:
        """A sampling seed that depends only on (run seed, step, purpose, k)."""
        return self.seeds()(purpose, k)

    def hook_context(self, mini_batch: MiniBatch | None = None) -> StepContext:
        """What a method hook sees of the run now (tether/methods/context.py): the step, settings, models, engine
        and helpers, never the trainer."""
        return StepContext(step=self.step, cfg=self.cfg, device=self.device, run_dir=self.run_dir,
                           tokenizer=self.tokenizer, policy=self.policy, reference=self.reference,
                           engine=self.sampling_engine, sampling=sampling_params(self.cfg.rollout),
                           sample_groups=group_sampler(self.collector), log_probs=self.log_probs,
                           make_engine=self.make_engine, mini_batch=mini_batch)

    def status(self, message: str) -> None:
        """A phase's one line on stderr (``logging.progress``), so the minutes before the first step are not silent."""
        if self.cfg.logging.progress:
            status(message)

    def push_weights(self) -> None:
        """Give the engine the policy's current weights: free for the in-process engine, which holds the same
        tensors; one broadcast for engines with their own copy (Ray actors, vLLM), with LoRA adapters merged."""
        if getattr(self.engine, "model", None) is self.policy:
            # it samples with the policy module itself: no state dict to build (a walk of every parameter, and the
            # engine built its own to find the same tensors), nothing to copy
            return
        if is_lora(self.policy) and engine_entry(self.cfg.rollout.engine).shares_policy:
            # the engine runs the policy module (the same tensors: free) or, sampling ahead (rollout.max_staleness),
            # a copy of the module with adapters of its own: its keys are the module's, not the merged ones
            self.engine.load_weights(self.policy.state_dict())
            return
        self.engine.load_weights(serving_state_dict(self.policy))

    @property
    def autocast(self) -> Callable[[], contextlib.AbstractContextManager]:
        """The precision context of every trainer forward pass, scoring (``ctx.log_probs`` too) and the loss alike:
        ``with self.autocast():``. It holds no trainer, so :func:`~tether.trainer.step.score_log_probs` carries it."""
        return partial(autocast, self.device, self.cfg.model.bf16_autocast)


def rollout_engine(model: Any, *, strategy: Any, tokenizer: Any, cfg: Config) -> Any:
    """The configured engine over ``model`` (:func:`configured_engine`); under data parallelism each rank samples its
    share of the prompts."""
    return strategy.rollout_engine(configured_engine(model, tokenizer, cfg))


def configured_engine(model: Any, tokenizer: Any, cfg: Config) -> Any:
    """The engine ``rollout.engine`` over ``model``, sampling in ``rollout.dtype`` when set: the trainer's and
    ``tether eval``'s alike, so that eval samples as the run's validation did."""
    r = cfg.rollout
    settings = r.engine_kwargs if r.dtype is None else {**r.engine_kwargs, "dtype": r.dtype}
    return build_engine(r.engine, model, tokenizer, cfg.model, settings,
                        logprob_chunk_tokens=cfg.train.logprob_chunk_tokens)


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

