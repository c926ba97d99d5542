"""The GRPO + OPSD-style baseline (``methods.opsd``): on-policy self-distillation from the same policy given the
env's solution in context, scored like SEED's teacher (:mod:`.plugin`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field

from tether.algos import LossInputs, LossOutput, opd_loss, seed_opd_loss
from tether.config import ConfigError
from tether.methods.base import Method, MethodSettings, register_method
from tether.methods.seed.plugin import opd_metrics, teacher_scores
from tether.methods.seed.prompting import insert_after_task_line, skill_section
from tether.methods.seed.rule_analyzers import OBSERVATION_SOLVERS, solve_from_observation
from tether.models.vision import is_processor

if TYPE_CHECKING:
    from tether.config import Config
    from tether.methods.context import StepContext
    from tether.rollout.batch import RolloutBatch


HINT_TITLE = "Privileged Hint"
HINT_INSTRUCTION = "An optimal sequence of actions from the current state (the next action is the first one)"


class OpsdSettings(MethodSettings):
    """``methods.opsd``: on-policy self-distillation from the same policy given the env's solution in context."""

    coef: float = Field(0.01, ge=0, description="weight of the distillation term (as SEED's lambda_opd)")
    loss: Literal["reverse_kl", "gated"] = Field(
        "reverse_kl", description="reverse_kl: sampled-token reverse KL to the teacher (tether.algos.opd_loss); "
                                  "gated: SEED's gated loss with the hint as the teacher context")
    gate_beta: float = Field(5.0, ge=0, description="gate sharpness for loss: gated")


@register_method
class Opsd(Method):
    """GRPO + OPSD-style self-distillation: teacher = pi_old with the optimal remaining plan after the task line.

    The hint is the env solver's plan from the row's own state, recovered from its observation
    (:func:`~.rule_analyzers.solve_from_observation`: sokoban, frozenlake, thin ice, scripted). Rows without one are
    masked; a run whose first scored batch has none stops there (the term would be silently zero).
    """

    name = "opsd"
    Settings = OpsdSettings
    loss_tokens = frozenset({"teacher_log_probs"})

    def __init__(self, settings: OpsdSettings) -> None:
        super().__init__(settings)
        self.settings: OpsdSettings = settings
        self.hinted = False  # some row of this run has had a hint (checkpointed: a resume is not a new run)

    @classmethod
    def check_config(cls, settings: OpsdSettings, cfg: Config) -> list[str]:
        if cfg.env is None:
            raise ConfigError("methods.opsd reads env observations: it needs an env (env: ...), not a task")
        if cfg.env.name not in OBSERVATION_SOLVERS:
            raise ConfigError(f"methods.opsd with env.name={cfg.env.name}: no solver reads its observations, so no "
                              f"row would get a hint and the run would be plain GRPO; allowed: "
                              f"{', '.join(OBSERVATION_SOLVERS)}")
        return []

    def setup(self, ctx: StepContext) -> None:
        _refuse_images("methods.opsd", ctx.tokenizer)  # whether the policy sees images is known once it is loaded
        self.env_name = ctx.cfg.env.name

    def on_score(self, batch: RolloutBatch, ctx: StepContext) -> dict[str, Any]:
        hints: list[str | None] = []
        for ep, turn in zip(batch.info["episode"], batch.info["turn"], strict=True):
            plan = solve_from_observation(self.env_name, ep.turns[turn]["observation"], ep.task)
            hints.append(hint_section(plan) if plan else None)
        if not self.hinted and hints and not any(hints):  # this env's observations hold no state we can solve
            raise RuntimeError(f"methods.opsd: no row of step {ctx.step} got a hint (env {self.env_name}: "
                               "solve_from_observation read no state from its observations), so the distillation "
                               "term would be zero; this view of the env is not supported by OPSD")
        self.hinted = self.hinted or any(hints)
        teacher, row_mask, lost = teacher_scores(ctx, batch, hints, insert_after_task_line)
        mask = row_mask[:, None] * batch.response_mask
        batch.token["teacher_log_probs"], batch.token["opsd_mask"] = teacher, mask
        return {"seed/opsd_hint_rows_frac": row_mask.mean().item(), "seed/opsd_recovery_failures": float(lost)}

    def extra_loss(self, inputs: LossInputs, micro: RolloutBatch, ctx: StepContext) -> LossOutput | None:
        mask, teacher = micro.token.get("opsd_mask"), inputs.tokens.get("teacher_log_probs")
        if mask is None or teacher is None:
            return None
        total = ctx.mini_batch.token_sum("opsd_mask")
        if self.settings.loss == "gated":
            out = seed_opd_loss(inputs.log_probs, teacher, mask, beta=self.settings.gate_beta,
                                num_active_tokens=total)
        else:
            out = opd_loss(inputs.log_probs, teacher, mask, num_tokens=total)
        active = mask.sum()
        gap = (teacher - inputs.log_probs).detach() * mask
        metrics, counts = opd_metrics("seed/opsd_", out.loss.detach() * total, active, micro.response_mask.sum(),
                                      delta_mean=gap.sum() / active.clamp(min=1))
        return LossOutput(self.settings.coef * out.loss, metrics, counts)

    def state_dict(self) -> dict[str, Any]:
        return {"hinted": self.hinted}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        # A checkpoint is written after a step whose on_score passed the no-hint check, so a run with one has had a
        # hint: one written before `hinted` was checkpointed must not restart the check (it stopped such a run).
        self.hinted = state.get("hinted", True)


def hint_section(plan: list[str]) -> str:
    """The privileged teacher's context: the prompt block that states ``plan``, the solver's actions from the row's
    state (inserted after the task line, as a SEED skill is)."""
    return skill_section(HINT_TITLE, HINT_INSTRUCTION, ", ".join(plan))


def _refuse_images(method: str, tokenizer: Any) -> None:
    """OPSD's hint is the env solver's plan read back from the observation's text, which a visual
    observation does not have (docs/vision.md)."""
    if is_processor(tokenizer):
        raise ConfigError(f"{method} on a vision-language policy is not built (its hints are solved from text "
                          "observations; docs/vision.md): use methods.seed or GRPO")
