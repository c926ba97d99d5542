"""SEED stage 2 as a trainer plug-in (``methods.seed``), and the teacher scoring it shares with the GRPO +
OPSD-style baseline (``methods.opsd``, :mod:`.opsd`).

One RL update with ``seed`` (seed.md Sec. 1.1 (d)-(g); docs/methods/seed.md has the formulas):

1. **Analysis** (:meth:`Seed.on_generation`, before any gradient step, so with the pre-update weights): every
   trajectory of the batch is rendered with the analyzer prompt (:func:`~.analyzer.episode_analysis_prompt`),
   encoded with the chat template, left-truncated to ``analysis_context_length`` tokens, and answered greedily by
   the policy itself through ``ctx.engine`` (``analysis_max_new_tokens``). The answer is parsed; the analysis
   succeeds iff it parsed with a non-empty skill. Skills go to ``run_dir/skills.jsonl`` and onto the episode as
   ``x_skill`` (the transcript viewer prints it). This runs in ``on_generation`` rather than ``on_score`` only so
   that the transcripts the collector writes right after carry the skill; the weights are the same at both
   points. If a collector never calls the generation hook, :meth:`Seed.on_score` analyses instead.
2. **Teacher re-scoring** (:meth:`Seed.on_score`): for every row of an analysed trajectory the row's user message
   gets the skill block after its task line (:func:`~.prompting.augment_with_skill`), is re-encoded with the chat
   template, and the *same* sampled response tokens are scored under it with the pre-update weights
   (``ctx.log_probs``) -> ``batch.token["teacher_log_probs"]``. ``batch.token["seed_mask"]`` is 1 on the
   response tokens of those rows, 0 elsewhere (rows of trajectories whose analysis failed, and every row while
   the OPD schedule is off).
3. **Loss** (:meth:`Seed.extra_loss`, per micro-batch): ``opd_coef * seed_opd_loss(log_probs, teacher, mask,
   beta=gate_beta)``, normalised by the OPD-active tokens of the whole mini-batch (``global_token_mean``, a total the
   trainer gives in ``ctx.mini_batch``; the SEED code divides by the micro-batch's own count). PPO, entropy and KL
   are the trainer's own terms, so the total is ``L_pg - c_ent L_ent + lambda L_opd + beta_KL L_KL`` with the
   config's ``algorithm.entropy_coef`` and ``algorithm.kl.coef``.

Validation never calls any of this: deployment is prompt-identical to GRPO.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal

import torch
from pydantic import Field
from torch import Tensor

from tether.algos import LossInputs, LossOutput, seed_opd_loss
from tether.config import ConfigError
from tether.engine.base import SamplingParams
from tether.envs import env_class, escape_placeholders
from tether.files import append_jsonl
from tether.methods.base import Method, MethodSettings, register_method
from tether.methods.seed.analyzer import Analysis, episode_analysis_prompt, parse_analysis, success_label
from tether.methods.seed.prompting import augment_with_skill, user_messages
from tether.methods.seed.rule_analyzers import Trajectory, rule_analysis
from tether.models.vision import encode_message, has_images, observation_images

if TYPE_CHECKING:
    from tether.config import Config
    from tether.methods.context import StepContext
    from tether.rollout.batch import RolloutBatch


class SeedSettings(MethodSettings):
    """``methods.seed`` of a config: stage 2. Defaults are the paper's. A ``tether seed-sft`` config reads the
    analyzer prompt's options here too (stage 1's own settings are its top-level ``sft``)."""

    opd_coef: float = Field(0.01, ge=0, description="lambda_opd, the weight of the gated OPD loss (paper: 0.01)")
    gate_beta: float = Field(5.0, ge=0, description="beta of the gate sigmoid(beta * (l_T - l)) (paper: 5.0)")
    analysis_max_new_tokens: int = Field(4096, ge=1, description="analysis answer budget (paper: 4096, greedy)")
    analysis_context_length: int = Field(16384, ge=16,
                                         description="analysis prompt tokens kept, from the end, at stage 2 and "
                                                     "in stage 1's SFT data (paper: 16384)")
    analysis_batch_size: int = Field(16, ge=1, description="trajectories per analysis generate call")
    analyzer: Literal["policy", "rule"] = Field(
        "policy", description="who writes the hindsight skill: policy = the pre-update policy itself, greedily "
                              "(paper); rule = the env's offline rule analyzer (rule_analyzers.py; for thin_ice an "
                              "oracle that knows the hazards): the oracle-hindsight control of issue #21")
    include_summary: bool = Field(True, description="the analyzer also writes episode_summary (paper: true)")
    success_threshold: float = Field(1.0, description="a trajectory is labelled success iff its return >= this")
    global_token_mean: bool = Field(True, description="normalise OPD by the mini-batch's active tokens "
                                                      "(false: by each micro-batch's, as the SEED code)")
    opd_start_after_steps: int | None = Field(None, ge=0, description="OPD off while update number <= this")
    opd_stop_after_steps: int | None = Field(None, ge=0, description="OPD off once update number > this")

    def opd_active(self, update: int) -> bool:
        """OPD schedule (seed.md Sec. 6, property 25); ``update`` counts from 1. Analysis runs either way."""
        if self.opd_start_after_steps is not None and update <= self.opd_start_after_steps:
            return False
        return self.opd_stop_after_steps is None or update <= self.opd_stop_after_steps


# -- shared by both plug-ins ---------------------------------------------------------------------


def row_messages(batch: RolloutBatch, tokenizer: Any, rows: list[int]) -> list[str | None]:
    """Each row's user message: ``batch.info["prompt_text"]`` when the collector records it, else the one a visual
    prompt carries, else recovered from the prompt ids, once per distinct prompt (None where that fails)."""
    if "prompt_text" in batch.info:
        return [batch.info["prompt_text"][i] for i in rows]
    carried = [getattr(batch.prompt_ids[i], "message", None) for i in rows]
    recover = [i for i, m in zip(rows, carried, strict=True) if not m]
    recovered = iter(user_messages(tokenizer, [batch.prompt_ids[i] for i in recover]))
    return [m or next(recovered) for m in carried]


def teacher_prompts(batch: RolloutBatch, tokenizer: Any, contexts: list[str | None],
                    insert: Callable[[str, str], str]) -> tuple[list[int], list[list[int]], int]:
    """The rows with a context, their prompt ids with the context inserted (chat template applied), and the
    number of rows whose user message could not be recovered (they are left out). A visual row's prompt is
    encoded with its own images (the context is model text, escaped so it adds no image slot); a text prompt is
    encoded once for the rows that share it (the same message and context: OPSD's hint is the observation's)."""
    wanted = [i for i, c in enumerate(contexts) if c]
    pairs = [(i, m) for i, m in zip(wanted, row_messages(batch, tokenizer, wanted), strict=True) if m is not None]
    encoded: dict[str, list[int]] = {}
    prompts = []
    for i, m in pairs:
        text, images = insert(m, escape_placeholders(contexts[i])), getattr(batch.prompt_ids[i], "images", ())
        if images:
            prompts.append(encode_message(tokenizer, text, images))
            continue
        if text not in encoded:
            encoded[text] = encode_message(tokenizer, text)
        prompts.append(list(encoded[text]))  # a row's own list: a caller may change it
    return [i for i, _ in pairs], prompts, len(wanted) - len(pairs)


def teacher_scores(ctx: StepContext, batch: RolloutBatch, contexts: list[str | None],
                   insert: Callable[[str, str], str]) -> tuple[Tensor, Tensor, int]:
    """Log-probs of each row's *sampled* response tokens under its prompt with ``contexts[i]`` inserted, with the
    policy's current (pre-update) weights, without gradient.

    Returns:
        (teacher log-probs ``[N, T]``, 0 on rows without a context; row mask ``[N]``, 1 where scored;
        number of rows whose user message could not be recovered).
    """
    rows, prompts, lost = teacher_prompts(batch, ctx.tokenizer, contexts, insert)
    teacher = torch.zeros_like(batch.response_mask)
    row_mask = batch.response_mask.new_zeros(len(batch))
    if rows:
        teacher[rows] = ctx.log_probs(ctx.policy, batch.select(rows), prompt_ids=prompts).to(teacher)
        row_mask[rows] = 1.0
    return teacher, row_mask, lost


def env_provides(ctx: StepContext, name: str) -> Any:
    """An optional attribute of the run's env class, None where it has none: what an env declares for SEED's
    diagnostics (thin ice: ``hidden_hazard``, ``states_lesson``, ``at_fork``; docs/methods/seed.md)."""
    return getattr(env_class(ctx.cfg.env.name), name, None)


def fatal_safe_deltas(batch: RolloutBatch, teacher: Tensor, student: Tensor, mask: Tensor,
                      hidden_hazard: str, at_fork: Callable[[dict], bool] | None = None) -> dict[str, float]:
    """The skill's pre-update shift of each row's whole response, log pi_T(a|h~) - log pi(a|h) (the sum of the
    token deltas), averaged separately over rows whose move the env reports fell into its hidden hazard (the
    step-info flag ``hidden_hazard``; thin ice: onto ``~``), *fatal*, and over the other valid rows, *safe*. The
    mechanism needs the first negative and the second positive. Beside them, *deadly* rows (any ``fell_*`` flag:
    onto ``~`` or into a visible hole, both of which the oracle rule forbids) and *alive* rows, the split the
    SEED study's control was read with (docs/methods/seed.md). With ``at_fork`` (an env's predicate on the info
    of the state a row acts in; thin ice: the naive move lands on ``~``), the same shift at *fork* rows, where the
    lesson should change the move: all of them (``fork``), those whose move avoided the hazard (``fork_safe``: the
    teacher should raise them) and those onto it (``fork_fatal``), with ``seed/fork_rows`` counting them (the third
    SEED design's gate, read where the signal acts).

    ``student`` is pi_old's log-probs (the engine's sampled ones when the trainer skipped that pass: same weights,
    temperature 1). Rows without a teacher (``mask`` 0) are left out; a split with no row reports nothing.
    """
    delta = ((teacher - student) * mask).sum(1)
    kinds: dict[str, list[float]] = {"fatal": [], "safe": [], "deadly": [], "alive": [], "fork": [],
                                     "fork_safe": [], "fork_fatal": []}
    for i, (ep, turn) in enumerate(zip(batch.info["episode"], batch.info["turn"], strict=True)):
        moved = ep.infos[turn + 1]  # the env's info after this row's move
        if mask[i].sum() > 0 and ep.turns[turn]["valid"]:
            fatal = bool(moved.get(hidden_hazard))
            kinds["fatal" if fatal else "safe"].append(float(delta[i]))
            deadly = any(v for k, v in moved.items() if k.startswith("fell_"))
            kinds["deadly" if deadly else "alive"].append(float(delta[i]))
            if at_fork is not None and at_fork(ep.infos[turn]):  # the info of the state this row acts in
                kinds["fork"].append(float(delta[i]))
                kinds["fork_fatal" if fatal else "fork_safe"].append(float(delta[i]))
    out = {f"seed/delta_{k}": sum(v) / len(v) for k, v in kinds.items() if v}
    out["seed/fatal_rows"] = float(len(kinds["fatal"]))
    if at_fork is not None:
        out["seed/fork_rows"] = float(len(kinds["fork"]))
    return out


def opd_metrics(prefix: str, loss_sum: Tensor, active: Tensor, tokens: Tensor,
                **means: Tensor) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """A micro-batch's distillation metrics and their units (``LossOutput.counts``): ``{prefix}loss`` and each of
    ``means`` are means over its ``active`` tokens, ``{prefix}active_token_frac`` over its response ``tokens``.

    The trainer folds them as value x units over micro-batches, data-parallel ranks and mini-batches, so the logged
    value is the mean over every active token of the update. Kept as the method's own sums and flushed in
    ``after_update``, they were never added over ranks: rank 0 logged the means over its share.

    Args:
        loss_sum: the term summed over the active tokens (not normalised).
        means: name -> mean over the active tokens.
    """
    metrics = {f"{prefix}loss": loss_sum / active.clamp(min=1), **{f"{prefix}{k}": v for k, v in means.items()},
               f"{prefix}active_token_frac": active / tokens.clamp(min=1)}
    # every unit named: the trainer's default, the loss tokens, differs from ``tokens`` under algorithm.mask_truncated
    return metrics, {**{k: active for k in metrics}, f"{prefix}active_token_frac": tokens}


# -- SEED ----------------------------------------------------------------------------------------


@register_method
class Seed(Method):
    """SEED stage 2: self-analysis with the pre-update policy, skill-context teacher, gated OPD loss."""

    name = "seed"
    Settings = SeedSettings
    loss_tokens = frozenset({"teacher_log_probs"})  # the distillation term's teacher; its own mask stays on the batch

    def __init__(self, settings: SeedSettings) -> None:
        super().__init__(settings)
        self.settings: SeedSettings = settings

    @classmethod
    def check_config(cls, settings: SeedSettings, cfg: Config) -> list[str]:
        if cfg.env is None:
            raise ConfigError("methods.seed analyses multi-turn trajectories: it needs an env (env: ...), not a task")
        if "opsd" in cfg.methods:
            raise ConfigError("methods.seed and methods.opsd both set the teacher log-probs; use one of them")
        return []

    # -- 1. analysis ---------------------------------------------------------------------------

    def on_generation(self, batch: RolloutBatch, ctx: StepContext) -> tuple[RolloutBatch, dict[str, Any]]:
        return batch, self.analyse(batch, ctx)

    def analyse(self, batch: RolloutBatch, ctx: StepContext) -> dict[str, float]:
        """Analyse every trajectory of ``batch`` with the current policy; sets ``batch.info["seed_skill"]``."""
        s = self.settings
        start = time.perf_counter()
        episodes = list({id(ep): ep for ep in batch.info["episode"]}.values())  # trajectory order of the rows
        labels = [success_label(ep.ret, s.success_threshold) for ep in episodes]
        # seed_visual: a visual episode's observations are <image> slots, filled with its frames
        prompts = [encode_message(ctx.tokenizer, episode_analysis_prompt(ep, threshold=s.success_threshold,
                                                                             include_summary=s.include_summary),
                                  observation_images(ep.seen)) for ep in episodes]
        cut = [len(p) > s.analysis_context_length and not has_images([p]) for p in prompts]
        # left truncation, as the code's prompt batch; never through a visual prompt's image tokens
        prompts = [p[-s.analysis_context_length:] if c else p for p, c in zip(prompts, cut, strict=True)]
        if s.analyzer == "rule":
            results, lengths, hit_limit = self._rule_answers(episodes, labels, ctx.cfg.env.name)
        else:
            results, lengths, hit_limit = self._policy_answers(prompts, ctx)
        skills = {}
        for ep, result in zip(episodes, results, strict=True):
            if result.ok:
                ep.x_skill = skills[id(ep)] = result.skill.strip()
        batch.info["seed_skill"] = [skills.get(id(ep)) for ep in batch.info["episode"]]
        self._write_skills(ctx, episodes, labels, results, prompts, cut)
        metrics = self._analysis_metrics(episodes, labels, results, lengths, hit_limit, cut,
                                         time.perf_counter() - start)
        if (states_lesson := env_provides(ctx, "states_lesson")) is not None:
            written = [r.skill for r in results if r.ok]
            metrics["seed/skill_correct_rate"] = sum(map(states_lesson, written)) / max(len(written), 1)
        return metrics

    def _policy_answers(self, prompts: list[list[int]], ctx: StepContext
                        ) -> tuple[list[Analysis], list[float], list[bool]]:
        """Greedy answers of the pre-update policy: the analyses, their token counts, whether each hit the limit."""
        s = self.settings
        params = SamplingParams(max_new_tokens=s.analysis_max_new_tokens, greedy=True)
        results: list[Analysis] = []
        lengths: list[float] = []
        hit_limit: list[bool] = []
        for k in range(0, len(prompts), s.analysis_batch_size):
            gen = ctx.engine.generate(prompts[k:k + s.analysis_batch_size], params,
                                      seed=ctx.seed_for("seed/analysis", k))
            results += [parse_analysis(text, include_summary=s.include_summary) for text in gen.texts]
            lengths += gen.response_mask.sum(1).tolist()
            hit_limit += gen.truncated.tolist()
        return results, lengths, hit_limit

    def _rule_answers(self, episodes: list, labels: list[str], env_name: str
                      ) -> tuple[list[Analysis], list[float], list[bool]]:
        """The rule analyzer's answers (``analyzer: rule``), parsed like the policy's; no tokens are generated.
        The label is the analyzer prompt's (return >= success_threshold), as the policy would read it."""
        s = self.settings
        texts = [rule_analysis(Trajectory.from_episode(ep), env_name, success=label == "success",
                               include_summary=s.include_summary) for ep, label in zip(episodes, labels, strict=True)]
        results = [parse_analysis(t, include_summary=s.include_summary) for t in texts]
        return results, [0.0] * len(results), [False] * len(results)

    def _write_skills(self, ctx: StepContext, episodes: list, labels: list[str], results: list[Analysis],
                      prompts: list[list[int]], cut: list[bool]) -> None:
        append_jsonl(ctx.run_dir / "skills.jsonl",
                     ({"step": ctx.step, "episode": ep.episode_id, "group": ep.group_id, "task": ep.task,
                       "outcome": label, "return": ep.ret, "ok": r.ok, "skill": r.skill, "summary": r.summary,
                       "error": r.error, "raw": r.raw, "prompt_tokens": len(p), "prompt_truncated": c}
                      for ep, label, r, p, c in zip(episodes, labels, results, prompts, cut, strict=True)))

    @staticmethod
    def _analysis_metrics(episodes: list, labels: list[str], results: list[Analysis], lengths: list[float],
                          hit_limit: list[bool], cut: list[bool], seconds: float) -> dict[str, float]:
        n = max(len(results), 1)
        ok = [r.ok for r in results]
        words = [len(r.skill.split()) for r in results if r.ok]
        out = {
            "seed/analysis_success_rate": sum(ok) / n,
            "seed/analysis_parse_error_rate": sum(r.error is not None for r in results) / n,
            "seed/skill_words": sum(words) / max(len(words), 1),
            "seed/analysis_response_tokens": sum(lengths) / n,
            "seed/analysis_hit_token_limit": sum(hit_limit) / n,
            "seed/analysis_prompt_truncated": sum(cut) / n,
            "seed/traj_success_frac": labels.count("success") / n,
            "seed/analysis_s": seconds,
        }
        for label in ("success", "failure"):
            picked = [i for i, lab in enumerate(labels) if lab == label]
            if picked:
                out[f"seed/analysis_success_rate_{label}"] = sum(ok[i] for i in picked) / len(picked)
                out[f"seed/return_{label}"] = sum(episodes[i].ret for i in picked) / len(picked)
        return out

    # -- 2. teacher log-probs ------------------------------------------------------------------

    def on_score(self, batch: RolloutBatch, ctx: StepContext) -> dict[str, Any]:
        metrics = {} if "seed_skill" in batch.info else self.analyse(batch, ctx)
        start = time.perf_counter()
        active = self.settings.opd_active(ctx.step + 1)
        skills = batch.info["seed_skill"] if active else [None] * len(batch)
        teacher, row_mask, lost = teacher_scores(ctx, batch, skills, augment_with_skill)
        mask = row_mask[:, None] * batch.response_mask
        batch.token["teacher_log_probs"], batch.token["seed_mask"] = teacher, mask
        labels = [success_label(ep.ret, self.settings.success_threshold) for ep in batch.info["episode"]]
        for label in ("success", "failure"):
            rows = [i for i, lab in enumerate(labels) if lab == label]
            if rows:
                metrics[f"seed/row_reward_{label}"] = batch.rewards[rows].mean().item()
        if (hidden_hazard := env_provides(ctx, "hidden_hazard")) is not None:
            student = batch.token.get("old_log_probs", batch.sample_log_probs)
            metrics.update(fatal_safe_deltas(batch, teacher, student, mask, hidden_hazard,
                                             env_provides(ctx, "at_fork")))
        metrics.update({"seed/opd_enabled": float(active), "seed/teacher_rows_frac": row_mask.mean().item(),
                        "seed/prompt_recovery_failures": float(lost),
                        "seed/teacher_s": time.perf_counter() - start})
        return metrics

    # -- 3. loss -------------------------------------------------------------------------------

    def extra_loss(self, inputs: LossInputs, micro: RolloutBatch, ctx: StepContext) -> LossOutput | None:
        mask, teacher = micro.token.get("seed_mask"), inputs.tokens.get("teacher_log_probs")
        if mask is None or teacher is None:
            return None
        total = ctx.mini_batch.token_sum("seed_mask") if self.settings.global_token_mean else None
        out = seed_opd_loss(inputs.log_probs, teacher, mask, beta=self.settings.gate_beta, num_active_tokens=total)
        m = out.metrics
        metrics, counts = opd_metrics(
            "seed/opd_", out.loss.detach() * (mask.sum() if total is None else total), mask.sum(),
            micro.response_mask.sum(), delta_mean=m["seed/opd_delta_mean"], gate_mean=m["seed/opd_gate_mean"],
            raised_frac=m["seed/opd_gate_active_ratio"])
        # per micro-batch counts (the SEED code): verl scales each micro-batch's loss by micro / mini rows (1 over the
        # accumulation count), which the trainer's global normalisers do not; without it L_opd grew with the count
        scale = 1.0 if total is not None else len(micro) / len(ctx.mini_batch.batch)
        return LossOutput(self.settings.opd_coef * scale * out.loss, metrics, counts)
