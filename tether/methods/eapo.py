"""EAPO: a frozen prior policy takes over a few tokens at gated points of each rollout. RECONSTRUCTED.

Lu et al., "Experience Augmented Policy Optimization for LLM Reasoning", arXiv:2606.30420. Only the
abstract is public; every choice below that the abstract does not fix is a setting, and
docs/methods/eapo.md lists which parts are confirmed and which are inferred
(labels of ../shared/research/eapo.md).

During decoding the prior ``pi_E`` runs in lock-step with the policy (:class:`PriorInjection`, an
:class:`~tether.engine.base.Intervention` of the HF engine). At step ``t`` of row ``i``, with ``p`` the
policy's and ``q`` the prior's processed next-token distribution (both functions of the prefix)::

    g_t  = [stat(p, q) > tau] and [injected so far < budget] and [lambda > 0]
    mu_t = (1 - lambda g_t) p + lambda g_t q          # the distribution the token is drawn from
    stored: log mu_t(a_t), gate_mask = g_t, injected_mask = [a_t drawn from q's branch]

The loss (``tether.algos`` ``eapo``) reweights by ``pi_old / mu`` at gated positions. The gate never
looks at the token of its own step, so the behaviour process is a well-defined policy and the
sequence-level correction ``prod_{t gated} pi_old / mu_t`` is exactly unbiased (the budget counter
depends on earlier branch draws too; they are fixed before step ``t``, so the per-decision argument
still holds: docs/methods/eapo.md, "Why the weights are unbiased").
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import torch
from pydantic import Field, ValidationInfo, field_validator
from torch import Tensor

from tether.algos.eapo_gate import GATES, LN2, gate_statistic, js_divergence, mixture_log_probs, scheduled_lambda
from tether.engine.base import InterventionStep, SamplingParams
from tether.engine.decoding import left_pad, process_logits, sample_tokens
from tether.engine.hf import KVDecoder
from tether.files import append_jsonl
from tether.methods.base import Method, MethodSettings, register_method
from tether.models.vision import has_images, later_positions, prompt_positions, uses_multimodal_rope
from tether.seeding import derive_seed

if TYPE_CHECKING:
    from tether.config import Config
    from tether.methods.context import StepContext
    from tether.rollout.batch import RolloutBatch

# Per-token tensors the intervention records ([N, T]); the first two reach the loss under these names.
TOKEN_KEYS = ("gate_mask", "injected_mask", "eapo_gate_stat", "eapo_js")
# why the prior must use the policy's tokenizer: the end of the vocabulary check's message
PRIOR_TOKENIZER_WHY = ("injection swaps single tokens between the two models, so the prior must use the policy's "
                       "tokenizer (e.g. a checkpoint of an earlier run from the same base model)")


# -- the intervention -----------------------------------------------------------------------


class PriorInjection:
    """Runs the prior next to the policy in the HF engine's decoding loop and injects its tokens.

    The prior keeps its own KV cache, with the engine's padding convention: prompts left-padded,
    position ids counted from the attention mask (a visual prompt's: the engine's, multimodal RoPE
    included), one always-on attention column per new token (also for rows that finished). Its forward
    for the token of step ``t`` runs lazily at step ``t + 1``, so no forward is wasted after the last step.

    With ``mix_lambda = 0`` or ``budget = 0`` it is passive: the prior never runs, :meth:`step` always
    returns None, and the engine's sampling (and RNG stream) is exactly what it is without it.

    Args:
        prior: the frozen prior, a Hugging Face causal LM on the engine's device.
        gate: ``js``, ``entropy`` or ``max_log_ratio`` (:func:`gate_statistic`).
        threshold: ``tau``; a row is gated when its statistic is strictly above it.
        mix_lambda: ``lambda``, probability of drawing a gated token from the prior.
        budget: most injected tokens per sequence.
        params: how the prior's logits are processed (temperature, top-k, top-p) into ``q``.
        seed: seeds this object's own ``torch.Generator``; call ``k`` of :meth:`start` uses
            ``derive_seed(seed, k)`` (:mod:`tether.seeding`).
        pad_id: the prompt padding token (never attended to).
        bf16_autocast: run the prior's forwards under bfloat16 autocast (as the engine may).
    """

    def __init__(self, prior: Any, *, gate: str, threshold: float, mix_lambda: float, budget: int,
                 params: SamplingParams, seed: int, pad_id: int = 0, bf16_autocast: bool = False) -> None:
        if gate not in GATES:
            raise ValueError(f"eapo gate must be one of {', '.join(GATES)}; got '{gate}'")
        self.prior, self.gate, self.threshold = prior, gate, threshold
        self.mix_lambda, self.budget, self.params = mix_lambda, budget, params
        self.seed, self.pad_id, self.bf16_autocast = seed, pad_id, bf16_autocast
        self.passive = mix_lambda <= 0.0 or budget <= 0
        self.calls = 0
        self._decoder = KVDecoder(prior, bf16_autocast=bf16_autocast)

    # -- Intervention ---------------------------------------------------------------------------

    def start(self, prompt_ids: list[list[int]]) -> None:
        """Reset per-call state; prefill the prior on the left-padded prompts (unless passive)."""
        device = next(self.prior.parameters()).device
        self._n, self._t = len(prompt_ids), 0
        self._cols: dict[str, list[Tensor]] = {k: [] for k in TOKEN_KEYS}
        self._n_injected = torch.zeros(self._n, dtype=torch.long, device=device)
        self._from_prior = torch.zeros(self._n, dtype=torch.bool, device=device)
        self._generator = torch.Generator(device=device).manual_seed(derive_seed(self.seed, self.calls))
        self.calls += 1
        self._pending: Tensor | None = None
        if self.passive:
            return
        input_ids, self._attention, position_ids = left_pad(prompt_ids, self.pad_id, device)
        # a visual prompt's positions as the engine gives them: multimodal RoPE (Qwen) places image tokens on a grid,
        # and its later tokens sit at their text position plus an offset; with plain positions q is another input's
        self._offsets: Tensor | None = None
        if has_images(prompt_ids):
            position_ids, self._offsets = prompt_positions(self.prior, prompt_ids, input_ids, self._attention,
                                                           position_ids)
        self._mm_rope = uses_multimodal_rope(position_ids)
        self._next_pos = torch.tensor([len(p) for p in prompt_ids], device=device)
        self._cache = self._decoder.new_cache()
        with torch.no_grad():
            self._logits = self._decoder.prefill(prompt_ids, input_ids, self._attention, position_ids, self._cache)

    def _record(self, gated: Tensor, stat: Tensor, js: Tensor) -> None:
        self._cols["gate_mask"].append(gated.float())
        self._cols["eapo_gate_stat"].append(stat.float())
        self._cols["eapo_js"].append(js.float())

    def step(self, policy_log_probs: Tensor, active: Tensor) -> InterventionStep | None:
        """Gate from the prefix; gated rows get ``log mu`` and, with probability lambda, a prior token."""
        n = self._n
        self._from_prior = torch.zeros(n, dtype=torch.bool, device=policy_log_probs.device)
        if self.passive:
            zeros = policy_log_probs.new_zeros(n)
            self._record(self._from_prior, zeros, zeros)
            return None
        with torch.no_grad():
            if self._pending is not None:  # the prior's forward of the previous step's tokens
                ones = self._attention.new_ones(n, 1)
                self._attention = torch.cat([self._attention, ones], dim=1)
                positions = self._next_pos[:, None]
                if self._mm_rope:
                    positions = later_positions(positions, self._offsets)
                self._logits = self._decoder.next_logits(self._pending[:, None], self._attention, positions,
                                                         self._cache)
                self._next_pos += 1
            prior_log_probs = process_logits(self._logits, self.params)
            if prior_log_probs.shape != policy_log_probs.shape:
                raise ValueError(f"eapo: prior log-probs {tuple(prior_log_probs.shape)} vs policy "
                                 f"{tuple(policy_log_probs.shape)}: the vocabularies differ")
            stat = gate_statistic(self.gate, policy_log_probs, prior_log_probs)
            gated = active & (stat > self.threshold) & (self._n_injected < self.budget)
            js = stat if self.gate == "js" else js_divergence(policy_log_probs, prior_log_probs)
            self._record(gated, stat.where(active, 0.0), js.where(gated, 0.0))
            if not bool(gated.any()):
                return None
            prior_log_probs = prior_log_probs.to(policy_log_probs.dtype)
            mix = mixture_log_probs(policy_log_probs, prior_log_probs, self.mix_lambda)
            behaviour = torch.where(gated[:, None], mix, policy_log_probs)
            from_prior = gated
            if self.mix_lambda < 1.0:
                u = torch.rand(n, generator=self._generator, device=gated.device)
                from_prior = gated & (u < self.mix_lambda)
            forced = torch.full((n,), -1, dtype=torch.long, device=gated.device)
            rows = from_prior.nonzero().flatten()
            if rows.numel():
                forced[rows] = sample_tokens(prior_log_probs[rows], self._generator)
            self._from_prior = from_prior
        return InterventionStep(behaviour_log_probs=behaviour, forced_tokens=forced)

    def advance(self, tokens: Tensor) -> None:
        self._cols["injected_mask"].append(self._from_prior.float())
        self._n_injected += self._from_prior.long()
        self._t += 1
        if not self.passive:
            self._pending = tokens.to(self._next_pos.device)

    def finish(self) -> dict[str, Tensor]:
        """``gate_mask``, ``injected_mask``, ``eapo_gate_stat`` (statistic at active tokens) and
        ``eapo_js`` (JS(p, q) at gated tokens), each ``[N, steps]`` float."""
        out = {}
        for key, cols in self._cols.items():
            out[key] = torch.stack(cols, dim=1) if cols else torch.zeros(self._n, 0)
        self._cache = self._logits = self._pending = None  # free the prior's KV cache
        return out


# -- the plug-in ------------------------------------------------------------------------------


class EAPOSettings(MethodSettings):
    """``methods.eapo`` (docs/methods/eapo.md, "Settings", explains each with its source)."""

    prior: str = Field(description="prior policy: checkpoint directory or model name (load_policy); frozen")
    gate: Literal["js", "entropy", "max_log_ratio"] = Field(
        "js", description="critical-point statistic of the two next-token distributions (nats)")
    threshold_mode: Literal["fixed", "quantile"] = Field(
        "fixed", description="fixed: stat > threshold; quantile: stat > max(quantile of recent stats, floor)")
    threshold: float = Field(0.1, description="tau of threshold_mode=fixed")
    quantile: float = Field(0.95, gt=0, lt=1, description="threshold_mode=quantile: which quantile")
    floor: float = Field(1.5, validate_default=True,
                         description="threshold_mode=quantile: lower bound, also the first step's tau")
    mix_lambda: float = Field(1.0, ge=0, le=1, description="P(draw from the prior) at a gated position")
    budget: int = Field(4, ge=0, description="most injected tokens per sequence")
    schedule: Literal["constant", "cosine"] = Field("constant", description="lambda over RL steps")
    decay_steps: int = Field(120, ge=1, description="schedule=cosine: lambda reaches 0 at this step")
    prior_temperature: float | None = Field(
        None, gt=0, description="temperature of the prior's distribution; default: rollout.temperature")
    log_injections: int = Field(0, ge=0, description="write up to this many injected tokens per step, each with "
                                "its prompt and the response text before it, to run_dir/eapo_injections.jsonl "
                                "(to check where the gate lands)")

    @field_validator("threshold")
    @classmethod
    def _js_threshold_reachable(cls, value: float, info: ValidationInfo) -> float:
        if info.data.get("gate") == "js" and info.data.get("threshold_mode") == "fixed" and value >= LN2:
            raise ValueError(f"JS divergence never exceeds ln 2 = {LN2:.4f} nats, so the gate would never "
                             "fire; set a threshold below it (e.g. 0.1)")
        return value

    @field_validator("floor")
    @classmethod
    def _js_floor_reachable(cls, value: float, info: ValidationInfo) -> float:
        if info.data.get("gate") == "js" and info.data.get("threshold_mode") == "quantile" and value >= LN2:
            raise ValueError(f"JS divergence never exceeds ln 2 = {LN2:.4f} nats, so the gate would never "
                             "fire; set a floor below it (e.g. 0.05; 1.5 is MENTOR's floor for entropy)")
        return value


@register_method
class EAPO(Method):
    """Experience-augmented rollouts from a frozen prior policy (reconstructed; see the module docstring)."""

    name: ClassVar[str] = "eapo"
    Settings: ClassVar[type[MethodSettings]] = EAPOSettings
    needs_intervention: ClassVar[bool] = True  # the prior runs in lock-step with the policy's decoding loop
    # injected_mask marks the rows whose group baseline algorithm.advantage=clean_baseline takes from the others
    advantage_tags: ClassVar[frozenset[str]] = frozenset({"injected"})
    # what the intervention records that the eapo loss reads (its behaviour correction, its metrics)
    loss_tokens: ClassVar[frozenset[str]] = frozenset({"gate_mask", "injected_mask"})
    settings: EAPOSettings

    def __init__(self, settings: MethodSettings) -> None:
        super().__init__(settings)
        s = self.settings
        self.threshold = s.floor if s.threshold_mode == "quantile" else s.threshold
        self.prior: Any = None
        self._recent_stats: Tensor | None = None
        self._calls_step, self._calls = -1, 0

    # -- setup ------------------------------------------------------------------------------------

    @classmethod
    def check_config(cls, settings: EAPOSettings, cfg: Config) -> list[str]:
        """A warning when injected tokens would count as on-policy (the advantage's tags are checked with the
        estimator, tether/advantage_inputs.py)."""
        if cfg.algorithm.policy_loss != "eapo":
            return [f"methods.eapo with algorithm.policy_loss='{cfg.algorithm.policy_loss}': injected tokens are "
                    "then treated as on-policy (biased); use policy_loss: eapo (with correction: none for that "
                    "ablation on purpose)"]
        return []

    @classmethod
    def named_models(cls, settings: EAPOSettings) -> dict[str, str]:
        return {"methods.eapo.prior": settings.prior}

    @classmethod
    def policy_tokenizer_models(cls, settings: EAPOSettings) -> dict[str, str]:
        return {"methods.eapo.prior": PRIOR_TOKENIZER_WHY}

    def setup(self, ctx: StepContext) -> None:
        """Load the prior (frozen, on the policy's device) and check that its vocabulary is the policy's."""
        from tether.models import load_policy
        from tether.models.policy import check_vocabulary, model_load_errors

        s = self.settings
        with model_load_errors("methods.eapo.prior", s.prior):
            prior, prior_tokenizer = load_policy(s.prior, dtype=next(ctx.policy.parameters()).dtype)
        check_vocabulary(ctx.policy, ctx.tokenizer, prior, prior_tokenizer, "methods.eapo.prior", s.prior,
                         PRIOR_TOKENIZER_WHY)
        # whole on every rank, even when the policy is sharded: it decodes in lock-step with the local engine
        self.prior = prior.to(ctx.device).eval().requires_grad_(False)

    # -- hooks ------------------------------------------------------------------------------------

    def current_lambda(self, step: int) -> float:
        s = self.settings
        return scheduled_lambda(s.mix_lambda, s.schedule, step, s.decay_steps)

    def intervention(self, ctx: StepContext) -> PriorInjection:
        """A fresh :class:`PriorInjection` per generation batch, seeded from (run seed, step, batch)."""
        s, r = self.settings, ctx.cfg.rollout
        if self._calls_step != ctx.step:
            self._calls_step, self._calls = ctx.step, 0
        seed = ctx.seed_for("eapo", self._calls)
        self._calls += 1
        lam = self.current_lambda(ctx.step)
        params = SamplingParams(temperature=s.prior_temperature or r.temperature, top_p=r.top_p,
                                top_k=r.top_k)
        engine = ctx.engine
        return PriorInjection(self.prior, gate=s.gate, threshold=self.threshold, mix_lambda=lam,
                              budget=s.budget, params=params, seed=seed, pad_id=getattr(engine, "pad_id", 0),
                              bf16_autocast=getattr(engine, "bf16_autocast", False))

    def on_score(self, batch: RolloutBatch, ctx: StepContext) -> dict[str, Any]:
        """Rollout metrics; keep this step's statistics at non-injected tokens for the quantile threshold."""
        missing = [k for k in TOKEN_KEYS if k not in batch.token]
        if missing:
            raise RuntimeError(f"eapo: the batch lacks {missing}; the engine must support interventions "
                               "(rollout.engine=hf does; vllm and ray cannot)")
        # Only on-policy rows were sampled with the prior. Other rows (ARMOR's anchors, from the reference engine)
        # hold zeros where the gate statistic would be (armor.like): counted, they would pull the quantile threshold
        # down and turn eapo/*_clean into their accuracy.
        guided = batch.select((batch.source == 0).nonzero().flatten().cpu())
        metrics = rollout_metrics(guided)
        if self.settings.log_injections:
            log_injections(batch, ctx.tokenizer, ctx.step, self.settings.log_injections,
                           ctx.run_dir / "eapo_injections.jsonl")
        metrics["eapo/lambda"] = self.current_lambda(ctx.step)
        metrics["eapo/threshold"] = self.threshold
        if self.current_lambda(ctx.step) > 0 and self.settings.budget > 0:  # the prior ran this step
            valid = (guided.response_mask > 0) & (guided.token["injected_mask"] == 0)
            self._recent_stats = guided.token["eapo_gate_stat"][valid].detach().float().cpu()
        return metrics

    def after_update(self, ctx: StepContext) -> dict[str, Any]:
        """threshold_mode=quantile: tau = max(quantile of the last step's non-injected stats, floor)."""
        s = self.settings
        stats, self._recent_stats = self._recent_stats, None
        if s.threshold_mode != "quantile" or stats is None or stats.numel() == 0:
            return {}
        finite = stats[torch.isfinite(stats)]
        if finite.numel():
            self.threshold = max(float(torch.quantile(finite.double(), s.quantile)), s.floor)
        return {}

    def state_dict(self) -> dict[str, Any]:
        return {"threshold": self.threshold}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if "threshold" in state:
            self.threshold = float(state["threshold"])


def log_injections(batch: RolloutBatch, tokenizer: Any, step: int, limit: int, path: Path) -> None:
    """Append up to ``limit`` injected tokens of ``batch`` as JSON lines: step, row, position, the prompt (the
    task item's text where there is one), the response text before the token, the token, and the row's verdict."""
    injected = ((batch.token["injected_mask"] > 0) & (batch.response_mask > 0)).nonzero().tolist()[:limit]
    items = batch.info.get("item")
    rows = []
    for row, t in injected:
        ids = batch.response_ids[row].tolist()
        prompt = items[row].prompt if items else tokenizer.decode(batch.prompt_ids[row])
        rows.append({"step": step, "row": row, "position": t, "prompt": prompt,
                     "before": tokenizer.decode(ids[:t], skip_special_tokens=True),
                     "token": tokenizer.decode(ids[t:t + 1]), "correct": bool(batch.correct[row])})
    append_jsonl(path, rows)


def rollout_metrics(batch: RolloutBatch) -> dict[str, float]:
    """``eapo/*`` metrics of a batch with the intervention's per-token tensors (docs/methods/eapo.md)."""
    mask = batch.response_mask > 0
    gated = (batch.token["gate_mask"] > 0) & mask
    injected = (batch.token["injected_mask"] > 0) & mask
    n_tokens = max(int(mask.sum()), 1)
    lengths = batch.response_mask.sum(1, keepdim=True).clamp(min=1)
    rel_pos = torch.arange(batch.width, dtype=torch.float32, device=lengths.device)[None] / lengths
    inj_rows = injected.any(1)
    out = {
        "eapo/gated_token_frac": int(gated.sum()) / n_tokens,
        "eapo/injected_token_frac": int(injected.sum()) / n_tokens,
        "eapo/injected_rollouts_frac": inj_rows.float().mean().item(),
        "eapo/injected_per_rollout": injected.sum(1).float().mean().item(),
    }
    if mask.any():
        out["eapo/gate_stat_mean"] = batch.token["eapo_gate_stat"][mask].float().mean().item()
    if injected.any():
        out["eapo/injection_rel_pos"] = rel_pos[injected].mean().item()
    if gated.any():
        out["eapo/js_gated"] = batch.token["eapo_js"][gated].float().mean().item()
    for name, rows in (("injected", inj_rows), ("clean", ~inj_rows)):
        if rows.any():
            out[f"eapo/reward_{name}"] = batch.rewards[rows].float().mean().item()
            out[f"eapo/accuracy_{name}"] = batch.correct[rows].float().mean().item()
    return out
