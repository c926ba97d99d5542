"""Single-turn collection: groups of samples per prompt, rewards, DAPO dynamic sampling, validation."""

from __future__ import annotations

import dataclasses
import random
import warnings
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from tether.engine.base import Intervention, RolloutEngine, SamplingParams, sampling_params
from tether.errors import RefillShortfall
from tether.files import append_jsonl
from tether.health.reward_audit import answer_shares, component_shares
from tether.models import encode_chat
from tether.models.vision import encode_vision_messages, is_processor
from tether.rollout.batch import RolloutBatch, zero_variance_groups
from tether.rollout.chunks import generate_in_chunks
from tether.tasks import metrics as task_metrics
from tether.tasks.base import prompt_text, score_batch, task_split
from tether.tasks.images import image_key, open_image, prompt_messages
from tether.track.progress import CountProgress

if TYPE_CHECKING:
    from tether.config import Config, OverlongConfig
    from tether.rollout.base import GenerationHooks
    from tether.seeding import StepSeeds
    from tether.tasks import Task, TaskItem

VISUAL_PROMPTS_KEPT = 256  # encoded prompts with images kept: each holds its pixels (~1 MB), a text one a few ids


class PromptStream:
    """Training prompts in seeded epoch-wise shuffles; its position is part of every checkpoint."""

    def __init__(self, num_items: int, seed: int) -> None:
        if num_items == 0:
            raise ValueError("the task has no training items")
        self.num_items, self.seed = num_items, seed
        self.epoch, self.pos = 0, 0
        self._order = self._shuffle()

    def _shuffle(self) -> list[int]:
        order = list(range(self.num_items))
        random.Random(self.seed * 7919 + self.epoch).shuffle(order)
        return order

    def take(self, k: int) -> list[int]:
        out = []
        for _ in range(k):
            if self.pos == self.num_items:
                self.epoch, self.pos = self.epoch + 1, 0
                self._order = self._shuffle()
            out.append(self._order[self.pos])
            self.pos += 1
        return out

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "pos": self.pos}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.pos = state["epoch"], state["pos"]
        self._order = self._shuffle()


def overlong_penalty(lengths: torch.Tensor, max_new_tokens: int, cfg: OverlongConfig) -> torch.Tensor:
    """DAPO Eq. 13: 0 up to ``L_max - buffer``, then linear down to ``-penalty`` at ``L_max``."""
    start = max_new_tokens - cfg.buffer
    return (-(lengths.float() - start) / cfg.buffer * cfg.penalty).clamp(max=0.0)


def with_group_mean_rewards(batch: RolloutBatch) -> RolloutBatch:
    """``batch`` with each row's reward replaced by the mean of its group: a group baseline makes it all zeros."""
    rewards = batch.rewards.clone()
    for gid in batch.group_ids.unique():
        rows = batch.group_ids == gid
        rewards[rows] = batch.rewards[rows].mean()
    return dataclasses.replace(batch, rewards=rewards)


def replace_nonfinite(rewards: torch.Tensor, group_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Give each non-finite reward the lowest finite reward of its group (0 when the group has none): one NaN
    would otherwise make every later loss and gradient NaN, and a worst-in-group row cannot be reinforced.

    Returns:
        (rewards, mask of the replaced rows).
    """
    bad = ~torch.isfinite(rewards)
    if not bad.any():
        return rewards, bad
    out = rewards.clone()
    for group in group_ids[bad].unique().tolist():
        rows = group_ids == group
        finite = rewards[rows & ~bad]
        out[rows & bad] = finite.min() if len(finite) else 0.0
    return out, bad


class SingleTurnCollector:
    """Samples ``group_size`` responses per prompt of a :class:`~tether.tasks.Task` and scores them."""

    advantage_tags: ClassVar[frozenset[str]] = frozenset()  # rows carry rewards and group ids only

    def __init__(self, task: Task, tokenizer: Any, cfg: Config) -> None:
        self.task, self.tokenizer, self.cfg = task, tokenizer, cfg
        images = getattr(task, "image_column", None)
        if images is not None and not is_processor(tokenizer):
            raise ValueError(f"the task's prompts carry images ({images}), but the policy {cfg.model.name!r} came "
                             "with a text tokenizer: use a vision-language model (docs/vision.md)")
        self.stream = PromptStream(len(task.train), cfg.seed)
        self._prompt_cache: dict[str, list[int]] = {}
        self._visual_cache: OrderedDict[str, list[int]] = OrderedDict()  # least recently used first
        self._next_group = 0
        self.reward_faults = 0

    @classmethod
    def from_config(cls, cfg: Config, tokenizer: Any) -> SingleTurnCollector:
        """The collector of ``cfg.task``, with ``task.rewards`` added (as ``tether train`` and ``tether eval`` use)."""
        from tether.rewards import build_config_task

        return cls(build_config_task(cfg), tokenizer, cfg)

    def state_dict(self) -> dict[str, Any]:
        return {"stream": self.stream.state_dict(), "next_group": self._next_group, "faults": self.reward_faults}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.stream.load_state_dict(state["stream"])
        self._next_group, self.reward_faults = state["next_group"], state["faults"]

    # -- building blocks methods reuse ------------------------------------------------------

    def prompt_ids(self, item: TaskItem) -> list[int]:
        # Cached by the prompt itself, not item.id: an id is optional (TaskItem's default is "") and a user task's
        # ids need not differ across splits, and keyed by id every such item got the first one's tokens.
        if item.images:
            return self._visual_prompt_ids(item)
        key = prompt_text(item.prompt)
        if key not in self._prompt_cache:
            self._prompt_cache[key] = encode_chat(self.tokenizer, item.prompt, system=self.task.system_prompt)
        return self._prompt_cache[key]

    def _visual_prompt_ids(self, item: TaskItem) -> list[int]:
        """A :class:`~tether.models.vision.VisionPrompt` of the item's messages and images, by the policy's processor;
        kept for the last :data:`VISUAL_PROMPTS_KEPT` prompts (a group's copies and a val set's reuse it)."""
        key = f"{prompt_text(item.prompt)}\n{image_key(item.images)}"
        if key in self._visual_cache:
            self._visual_cache.move_to_end(key)
            return self._visual_cache[key]
        messages = prompt_messages(item.prompt, len(item.images), self.task.system_prompt)
        ids = encode_vision_messages(self.tokenizer, messages, [open_image(image) for image in item.images])
        self._visual_cache[key] = ids
        if len(self._visual_cache) > VISUAL_PROMPTS_KEPT:
            self._visual_cache.popitem(last=False)
        return ids

    def generate(self, engine: RolloutEngine, items: list[TaskItem], n: int, params: SamplingParams, seed: int,
                 *, group_ids: list[int] | None = None, source: int = 0,
                 intervention: Intervention | None = None,
                 on_rows: Callable[[int, int], None] | None = None) -> RolloutBatch:
        """``n`` samples for each item, scored; rows of item ``j`` share ``group_ids[j]``. ``on_rows(done, total)``
        after each engine call (validation's progress)."""
        if group_ids is None:
            group_ids = list(range(self._next_group, self._next_group + len(items)))
            self._next_group += len(items)
        rows = [(item, gid) for item, gid in zip(items, group_ids, strict=True) for _ in range(n)]
        parts = []
        for start, chunk, prompts, gen in generate_in_chunks(engine, rows, lambda row: self.prompt_ids(row[0]),
                                                             params, (seed,), intervention):
            parts.append(self._score(chunk, prompts, gen, source))
            if on_rows is not None:
                on_rows(start + len(chunk), len(rows))
        batch = RolloutBatch.concat(parts)
        batch.rewards, bad = replace_nonfinite(batch.rewards, batch.group_ids)
        if bad.any():
            self.reward_faults += int(bad.sum())
            batch.correct = batch.correct & ~bad
            # a non-finite reward is the scorer's fault: the audit's fault_frac counts it (val/fault_frac too)
            batch.info["fault"] = [f or b for f, b in zip(batch.info["fault"], bad.tolist(), strict=True)]
            warnings.warn("the task gave non-finite rewards; each is counted in reward/faults and replaced by the "
                          "lowest finite reward of its group", stacklevel=2)
        return batch

    def _score(self, rows: list, prompts: list[list[int]], gen: Any, source: int) -> RolloutBatch:
        gen = gen.to("cpu")  # the batch is built on the CPU, next to the rewards; the trainer moves it
        rewards, correct, extracted, faults, components = [], [], [], [], []
        items = [item for item, _ in rows]
        for score in score_batch(self.task, items, gen.texts):
            faults.append(bool(getattr(score, "fault", False)))
            self.reward_faults += int(faults[-1])
            rewards.append(score.reward)
            correct.append(score.correct)
            extracted.append(score.extracted)  # None: no answer found (the reward audit, docs/health.md)
            components.append(dict(getattr(score, "components", None) or {"task": score.reward}))
        rewards_t = torch.tensor(rewards, dtype=torch.float32)
        if self.cfg.rollout.overlong.enabled:
            penalty = overlong_penalty(gen.response_mask.sum(1), self.cfg.rollout.max_new_tokens,
                                       self.cfg.rollout.overlong)
            rewards_t = rewards_t + penalty
            for terms, value in zip(components, penalty.tolist(), strict=True):
                terms["overlong"] = value  # shaping is a term of the reward too: its share is audited
        n = len(rows)
        return RolloutBatch(
            prompt_ids=prompts, response_ids=gen.response_ids, response_mask=gen.response_mask,
            sample_log_probs=gen.sample_log_probs,
            group_ids=torch.tensor([gid for _, gid in rows], dtype=torch.long),
            rewards=rewards_t, correct=torch.tensor(correct, dtype=torch.bool),
            source=torch.full((n,), source, dtype=torch.long), token=dict(gen.token),
            info={"item": [item for item, _ in rows], "text": list(gen.texts),
                  "truncated": gen.truncated.tolist(), "extracted": extracted, "fault": faults,
                  "reward_components": components},
        )

    # -- one RL step's batch -------------------------------------------------------------------

    def collect(self, engine: RolloutEngine, seeds: StepSeeds,
                hooks: GenerationHooks) -> tuple[RolloutBatch, dict[str, float]]:
        """Generation batches until ``prompts_per_step`` groups survive the filters (DAPO refill); batch ``k`` samples
        from ``seeds("rollout", k)``."""
        r = self.cfg.rollout
        per_batch = r.gen_batch_prompts or r.prompts_per_step
        kept: list[RolloutBatch] = []
        metrics: dict[str, float] = {}
        n_kept = n_seen = 0
        generated: list[torch.Tensor] = []  # every row's verdict before any filter: the training accuracy DAPO hides
        described: list[tuple[list, list]] = []  # every row's item and text, for the task's response features
        for gen_batch in range(r.max_gen_batches):
            items = [self.task.train[i] for i in self.stream.take(per_batch)]
            batch = self.generate(engine, items, r.group_size, sampling_params(r), seeds("rollout", gen_batch),
                                  intervention=hooks.intervention())
            n_seen += per_batch
            generated.append(batch.correct)
            described.append((batch.info["item"], batch.info["text"]))
            generated_batch = batch
            batch, hook_metrics = hooks.on_generation(batch)
            metrics.update(hook_metrics)
            unfiltered = batch
            if r.dynamic_sampling and len(batch):
                drop = zero_variance_groups(batch.rewards, batch.group_ids)
                batch = batch.select([i for i, g in enumerate(batch.group_ids.tolist()) if g not in drop])
            kept.append(batch)
            n_kept += len(batch.group_ids.unique())
            if n_kept >= r.prompts_per_step:
                break
        else:
            if not r.partial_batches:
                raise RefillShortfall(
                    f"step {seeds.step + 1}: only {n_kept} of rollout.prompts_per_step={r.prompts_per_step} groups "
                    f"survived the filters in rollout.max_gen_batches={r.max_gen_batches} generation batches (the "
                    "task is too easy or too hard for the policy now: set rollout.partial_batches or raise "
                    "rollout.max_gen_batches)")
            if n_kept == 0:  # nothing survived: the last batch teaches nothing (zero advantages) but keeps the step
                # A method's filter (ARMOR's acceptance) may have left nothing at all: fall back to the rows as
                # generated, each rewarded its group's mean so that every advantage is zero.
                kept = [unfiltered if len(unfiltered) else with_group_mean_rewards(generated_batch)]
        metrics["rollout/short_batch"] = float(n_kept < r.prompts_per_step)
        batch = RolloutBatch.concat(kept)
        keep_groups = list(dict.fromkeys(batch.group_ids.tolist()))[: r.prompts_per_step]
        batch = batch.select([i for i, g in enumerate(batch.group_ids.tolist()) if g in set(keep_groups)])
        metrics.update({"rollout/num_gen_batches": gen_batch + 1, "rollout/kept_groups_frac": n_kept / n_seen,
                        "rollout/accuracy_all": torch.cat(generated).float().mean().item(),
                        "reward/faults": float(self.reward_faults)})
        metrics.update(task_metrics.feature_metrics(
            self.task, [i for items, _ in described for i in items], [t for _, texts in described for t in texts],
            torch.cat(generated).tolist(), "rollout"))
        write_samples(Path(self.cfg.run_dir), seeds.step, batch)
        return batch, metrics

    # -- validation --------------------------------------------------------------------------

    def validate(self, engine: RolloutEngine, seed: int) -> dict[str, float]:
        """``val.samples`` samples (one greedy with ``val.greedy``) of each held-out item: avg@k, pass@k and more."""
        v = self.cfg.val
        held_out = task_split(self.task, v.split)
        items = held_out[: v.max_prompts] if v.max_prompts else held_out
        k = 1 if v.greedy else v.samples
        params = sampling_params(self.cfg.rollout, v)
        train_faults = self.reward_faults  # validation's faults are its own (val/reward_faults), not training's
        with validation_progress(self.cfg, len(items) * k, "samples") as bar:
            batch = self.generate(engine, items, k, params, seed, group_ids=list(range(len(items))),
                                  on_rows=bar.update)
        val_faults, self.reward_faults = self.reward_faults - train_faults, train_faults
        correct = batch.correct.view(len(items), k).float()
        per_item = correct.sum(1)

        shares, _ = answer_shares(batch)  # no answer vs. wrong answer, so `tether eval` tells them apart too
        shares.update(component_shares(batch))
        return {
            **{f"val/{key}": value for key, value in shares.items()},
            "val/avg@k": correct.mean().item(),
            "val/pass@k": sum(task_metrics.pass_at_k(k, int(c), k) for c in per_item.tolist()) / len(items),
            "val/reward_mean": batch.rewards.mean().item(),
            "val/reward_faults": float(val_faults),
            "val/response_length": batch.response_mask.sum(1).mean().item(),
            **task_metrics.feature_metrics(self.task, batch.info["item"], batch.info["text"],
                                           batch.correct.tolist(), "val"),
        }


def write_samples(run_dir: Path, step: int, batch: RolloutBatch, limit: int = 4) -> None:
    """The first row of the first ``limit`` groups of the batch of step ``step + 1`` as JSON lines in
    ``RUN_DIR/samples.jsonl``, for ``tether show``: prompt, completion, reward and its components, correctness, the
    extracted answer. Under torchrun, rank 0 alone writes."""
    if torch.distributed.is_initialized() and torch.distributed.get_rank() != 0:
        return
    firsts = list(dict.fromkeys(batch.group_ids.tolist()))[:limit]
    rows = [batch.group_ids.tolist().index(g) for g in firsts]
    items = batch.info["item"]
    append_jsonl(Path(run_dir) / "samples.jsonl",
                 ({"step": step, "group": group, "prompt": items[i].prompt, "answer": items[i].answer,
                   "completion": batch.info["text"][i], "reward": float(batch.rewards[i]),
                   "correct": bool(batch.correct[i]), "extracted": batch.info["extracted"][i],
                   "components": batch.info["reward_components"][i]} for group, i in zip(firsts, rows, strict=True)),
                 default=str)


def validation_progress(cfg: Config, total: int, unit: str) -> CountProgress:
    """The bar (on a terminal) or the plain lines of one validation of ``total`` ``unit`` (``logging.progress``)."""
    return CountProgress("validation", total, unit, enabled=cfg.logging.progress)
