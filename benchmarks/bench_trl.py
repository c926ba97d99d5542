"""Speed of one RL step: tether's Trainer against TRL's GRPOTrainer, side by side in one process.

    bash benchmarks/setup_trl.sh                      # once: benchmarks/.venv-trl with TRL and tether
    benchmarks/.venv-trl/bin/python benchmarks/bench_trl.py --steps 10 --warmup 2
    benchmarks/.venv-trl/bin/python benchmarks/bench_trl.py --steps 10 --warmup 2 --lora   # LoRA adapters in both

Both trainers train SmolLM2-135M-Instruct (float32, from tether's converted cache directory) on the
quickstart task (reasoning-gym basic_arithmetic, its prompts, its reward), with the same group size,
prompts per step, completion budget, temperature, learning rate, clip range, token-mean loss and one
optimiser step per RL step. The steps alternate (tether, TRL, tether, TRL, ...): a TRL callback runs
one tether step before each TRL step, outside TRL's timed interval, so both see the same machine
state. Both get the same prompts in the same order. docs/benchmarks.md lists what is matched and
what still differs. With ``--lora`` both train the same LoRA adapters (the config's ``model.lora``, else tether's
defaults: rank 16, alpha 32, every attention and MLP projection; TRL through ``peft_config``), base weights frozen.

Timings per RL step (medians over ``--steps`` after ``--warmup`` steps of each trainer):

* ``step_s``: the step from its first to its last operation, logger writes excluded (tether's
  ``perf/step_s``; TRL from ``on_step_begin`` to ``on_step_end``: generation, reward, backward,
  clip, optimiser and scheduler step);
* ``rollout_s``: generation, decoding and reward (tether ``collector.collect``, TRL
  ``_generate_and_score_completions``, which also computes the advantages);
* ``generate_s``: the decoding loop alone (tether ``engine.generate``, TRL ``_generate_single_turn``);
* ``train_s = step_s - rollout_s``: log-prob forward, loss, backward, optimiser step;
* ``rollout_tok_s`` / ``train_tok_s``: generated tokens (EOS included) per second of those;
* ``wall_s``: the step plus writing its metrics (tether: around ``train_step``; TRL: to ``on_log``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parent.parent
QUICKSTART = REPO / "configs" / "quickstart.yaml"
RESULTS = Path(__file__).resolve().parent / "results"
SETUP_HINT = "bash benchmarks/setup_trl.sh, then run this script with benchmarks/.venv-trl/bin/python"
SUMMARY_KEYS = ("step_s", "wall_s", "rollout_s", "generate_s", "train_s", "tokens", "rollout_tok_s", "train_tok_s")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=10, help="timed RL steps per trainer (default 10)")
    p.add_argument("--warmup", type=int, default=2, help="untimed RL steps per trainer before them (default 2)")
    p.add_argument("--prompts-per-step", type=int, default=None, help="default: the quickstart's (4)")
    p.add_argument("--group-size", type=int, default=None, help="samples per prompt; default: the quickstart's (8)")
    p.add_argument("--max-new-tokens", type=int, default=None, help="default: the quickstart's (24)")
    p.add_argument("--micro-batch-size", type=int, default=None,
                   help="rows per forward/backward in both trainers; default: the quickstart's (32), capped at "
                        "the rows of a step; must divide them")
    p.add_argument("--threads", type=int, default=2, help="torch CPU threads (default 2)")
    p.add_argument("--lora", action="store_true",
                   help="train LoRA adapters in both trainers: the config's model.lora, else tether's defaults; "
                        "without it both fine-tune every weight, whatever the config says")
    p.add_argument("--only", choices=("tether", "trl"), default=None, help="run one trainer only")
    p.add_argument("--ignore-eos", action="store_true",
                   help="every row of both trainers samples --max-new-tokens (tether rollout.ignore_eos; TRL "
                        "generation_kwargs min_new_tokens): equal work per step whatever each policy answers")
    p.add_argument("--tether-override", action="append", default=[], metavar="KEY=VALUE",
                   help="a tether config override (repeatable) that leaves the step comparable, e.g. "
                        "optim.max_tokens_per_micro_batch=1024 or train.gradient_checkpointing=false")
    p.add_argument("--config", type=Path, default=QUICKSTART,
                   help="tether config to take the task and settings from (default configs/quickstart.yaml)")
    p.add_argument("--out", type=Path, default=None, help="results JSON; default: benchmarks/results/<date>.json")
    args = p.parse_args(argv)
    if args.steps < 1 or args.warmup < 0:
        p.error("--steps must be >= 1 and --warmup >= 0")
    return args


# -- shared settings ---------------------------------------------------------------------------


def tether_config(args: argparse.Namespace, run_dir: str) -> Any:
    """The quickstart config with the CLI's sizes, no validation, no checkpoints, no TensorBoard or progress bar."""
    from tether.config import load_config

    overrides = [f"run_dir={run_dir}", f"train.threads={args.threads}", f"train.steps={args.warmup + args.steps}",
                 "train.resume=never", "train.overwrite=true",
                 "val.every=0", "logging.tensorboard=false", "logging.progress=false",
                 *(["rollout.ignore_eos=true"] if args.ignore_eos else [])]
    for flag, key in (("prompts_per_step", "rollout.prompts_per_step"), ("group_size", "rollout.group_size"),
                      ("max_new_tokens", "rollout.max_new_tokens")):
        if getattr(args, flag) is not None:
            overrides.append(f"{key}={getattr(args, flag)}")
    cfg = load_config(args.config, [*overrides, *args.tether_override])
    if args.lora and cfg.model.lora is None:
        from tether.config import LoraSettings

        cfg.model.lora = LoraSettings()
    elif not args.lora:
        cfg.model.lora = None  # full fine-tuning, whatever the config says
    rows = cfg.rollout.prompts_per_step * cfg.rollout.group_size
    micro = min(args.micro_batch_size or cfg.optim.micro_batch_size, rows)
    if rows % micro:
        raise SystemExit(f"--micro-batch-size {micro} must divide the {rows} rows of a step "
                         "(TRL splits a generation batch into equal micro-batches)")
    cfg.optim.micro_batch_size = micro
    check_comparable(cfg)
    return cfg


def check_comparable(cfg: Any) -> None:
    """Refuse settings whose TRL counterpart this script does not set up (it would compare different steps)."""
    a, r, o = cfg.algorithm, cfg.rollout, cfg.optim
    problems = []
    if cfg.task is None:
        problems.append("needs a single-turn `task`")
    if (a.advantage, a.policy_loss, a.loss_agg) != ("grpo", "ppo", "token-mean"):
        problems.append("algorithm must be grpo / ppo / token-mean (TRL loss_type='dapo')")
    if a.kl.coef or a.use_ref or a.entropy_coef or cfg.methods:
        problems.append("no KL, reference model, entropy bonus or methods (TRL beta=0)")
    if (o.mini_batches, o.ppo_epochs, o.warmup_steps, o.weight_decay) != (1, 1, 0, 0.0):
        problems.append("one optimiser step per RL step, no warm-up, no weight decay")
    if r.dynamic_sampling or r.overlong.enabled or r.stop or r.top_k or r.top_p != 1.0 or r.gen_batch_prompts:
        problems.append("plain sampling: no dynamic sampling, overlong penalty, stop strings, top-k or top-p")
    # fp32 weights and forward passes on both sides (the model section has had `dtype`, now `bf16_autocast`)
    if getattr(cfg.model, "dtype", "float32") != "float32" or getattr(cfg.model, "bf16_autocast", False):
        problems.append("float32 only: no bf16 weights or autocast")
    if problems:
        raise SystemExit("config not comparable with the TRL setup: " + "; ".join(problems))


def trl_gradient_checkpointing(cfg: Any) -> bool:
    """TRL's layer checkpointing, matched to tether's: on only where tether's is ``true``. TRL's own default is
    on; tether's ``auto`` checkpoints only micro-batches over its activation budget (each tether step's record
    says how many did), which at the quickstart's sizes is none."""
    return cfg.train.gradient_checkpointing is True


def model_dir(name: str) -> str:
    """The local directory both trainers load (tether's float32 SmolLM2 conversion for the alias)."""
    from tether.models import SMOLLM2, ModelUnavailableError, smollm2_dir

    if name != SMOLLM2:
        return name
    try:
        return str(smollm2_dir())
    except ModelUnavailableError as error:
        raise SystemExit(f"{error}\nOr convert it once from tether's own venv: .venv/bin/python -c "
                         "'from tether.models import smollm2_dir; print(smollm2_dir())'") from None


def median_summary(records: list[dict[str, float]], warmup: int) -> dict[str, float]:
    timed = records[warmup:]
    out = {key: statistics.median(r[key] for r in timed) for key in SUMMARY_KEYS if timed and key in timed[0]}
    out["steps_timed"] = len(timed)
    return out


def ratio_interval(trl: list[dict[str, float]], tether: list[dict[str, float]], warmup: int,
                   draws: int = 10_000, seed: int = 0) -> tuple[float, float]:
    """95% percentile-bootstrap interval of median(TRL s/step) / median(tether s/step) over the timed steps,
    resampled in pairs: step i of each trainer ran back to back, under the same load."""
    import numpy as np

    a = np.array([r["step_s"] for r in trl[warmup:]])
    b = np.array([r["step_s"] for r in tether[warmup:]])
    idx = np.random.default_rng(seed).integers(0, len(a), size=(draws, len(a)))
    ratios = np.median(a[idx], axis=1) / np.median(b[idx], axis=1)
    lo, hi = np.percentile(ratios, [2.5, 97.5])
    return float(lo), float(hi)


def derived(record: dict[str, float]) -> dict[str, float]:
    record["train_s"] = record["step_s"] - record["rollout_s"]
    record["rollout_tok_s"] = record["tokens"] / max(record["rollout_s"], 1e-9)
    record["train_tok_s"] = record["tokens"] / max(record["train_s"], 1e-9)
    return record


# -- tether --------------------------------------------------------------------------------------


class TetherBench:
    """tether's Trainer, stepped by hand; each step's timings appended to ``records``."""

    def __init__(self, cfg: Any, path: str) -> None:
        from tether.models import load_policy
        from tether.trainer.trainer import Trainer

        policy, tokenizer = load_policy(path, dtype=torch.float32)
        self.trainer = Trainer(cfg, policy=policy, tokenizer=tokenizer)
        self.records: list[dict[str, float]] = []
        self._generate_s = 0.0
        engine = self.trainer.engine
        inner = engine.generate

        def timed_generate(*a: Any, **k: Any) -> Any:
            start = time.perf_counter()
            try:
                return inner(*a, **k)
            finally:
                self._generate_s += time.perf_counter() - start

        engine.generate = timed_generate

    def step(self) -> None:
        self._generate_s = 0.0
        start = time.perf_counter()
        m = self.trainer.train_step()
        wall = time.perf_counter() - start
        self.records.append(derived({
            "step_s": m["perf/step_s"], "wall_s": wall, "rollout_s": m["perf/rollout_s"],
            "generate_s": self._generate_s, "tokens": m["perf/rollout_tok_s"] * m["perf/rollout_s"],
            "reward_mean": m["train/reward_mean"], "threads": torch.get_num_threads(),
            "activation_gb": m["perf/activation_gb"], "checkpointed": m["perf/checkpointed_micro_batches"]}))


# -- TRL -----------------------------------------------------------------------------------------


def trl_dataset(task: Any, order: list[int]) -> Any:
    """The task's train prompts as chat messages, in tether's prompt order; ``item`` indexes ``task.train``."""
    from datasets import Dataset

    def messages(item: Any) -> list[dict[str, str]]:
        system = [{"role": "system", "content": task.system_prompt}] if task.system_prompt else []
        return [*system, {"role": "user", "content": item.prompt}]

    return Dataset.from_list([{"prompt": messages(task.train[i]), "item": i} for i in order])


def trl_reward(task: Any) -> Any:
    """A TRL reward function that is tether's: ``task.score(item, text).reward``."""

    def quickstart_reward(completions: list, item: list[int], **_: Any) -> list[float]:
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        return [task.score(task.train[i], text).reward for i, text in zip(item, texts, strict=True)]

    return quickstart_reward


def trl_peft_config(cfg: Any) -> Any:
    """PEFT's LoraConfig of ``cfg.model.lora`` as tether builds it (tether.models.lora.add_lora), or None."""
    lora = cfg.model.lora
    if lora is None:
        return None
    from peft import LoraConfig

    return LoraConfig(r=lora.rank, lora_alpha=lora.alpha, target_modules=list(lora.target_modules), lora_dropout=0.0,
                      bias="none", task_type="CAUSAL_LM")


def build_trl(cfg: Any, path: str, task: Any, order: list[int], out_dir: str, between: Any) -> Any:
    """A GRPOTrainer set up like ``cfg``; ``between()`` runs before each TRL step, outside its timing."""
    try:
        from transformers import PrinterCallback, TrainerCallback
        from trl import GRPOConfig, GRPOTrainer
    except ImportError as error:
        raise SystemExit(f"TRL is not importable here ({error}). {SETUP_HINT}") from None

    r, o, a = cfg.rollout, cfg.optim, cfg.algorithm
    rows = r.prompts_per_step * r.group_size
    args = GRPOConfig(
        output_dir=out_dir, use_cpu=True, bf16=False, fp16=False, model_init_kwargs={"dtype": "float32"},
        gradient_checkpointing=trl_gradient_checkpointing(cfg),
        seed=cfg.seed, max_steps=cfg.train.steps, shuffle_dataset=False, dataloader_num_workers=0,
        # one generation batch = one optimiser step: rows = per_device_train_batch_size x gradient_accumulation
        num_generations=r.group_size, per_device_train_batch_size=o.micro_batch_size,
        gradient_accumulation_steps=rows // o.micro_batch_size, num_iterations=1,
        max_completion_length=r.max_new_tokens, temperature=r.temperature, top_p=1.0, top_k=0,
        learning_rate=o.lr, lr_scheduler_type="constant", warmup_steps=0, weight_decay=o.weight_decay,
        adam_beta1=o.betas[0], adam_beta2=o.betas[1], max_grad_norm=o.grad_clip,
        optim="adamw_torch_fused",  # TRL's default; tether's AdamW is fused too (tether.optimizer)
        beta=0.0, loss_type="dapo", scale_rewards="group",
        epsilon=a.loss_kwargs.get("clip_low", 0.2), epsilon_high=a.loss_kwargs.get("clip_high", 0.2),
        use_vllm=False, logging_steps=1, report_to="none", save_strategy="no", disable_tqdm=True,
        log_completions=False,
        # rollout.ignore_eos: TRL's transformers generation has no ignore_eos; EOS held back to the budget samples
        # as many tokens (the distribution differs on that one token; the work does not)
        generation_kwargs={"min_new_tokens": r.max_new_tokens} if r.ignore_eos else None)

    class TimedGRPOTrainer(GRPOTrainer):
        bench: dict[str, float]

        def _generate_and_score_completions(self, inputs: Any) -> Any:
            start = time.perf_counter()
            out = super()._generate_and_score_completions(inputs)
            self.bench["rollout_s"] += time.perf_counter() - start
            self.bench["tokens"] += float(out["num_items_in_batch"])
            self.bench["reward_mean"] = self._metrics["train"]["reward"][-1]
            return out

        def _generate_single_turn(self, *a: Any, **k: Any) -> Any:
            start = time.perf_counter()
            out = super()._generate_single_turn(*a, **k)
            self.bench["generate_s"] += time.perf_counter() - start
            return out

    class StepTimer(TrainerCallback):
        def __init__(self) -> None:
            self.records: list[dict[str, float]] = []
            self.start = 0.0

        def on_step_begin(self, *_: Any, **__: Any) -> None:
            between()
            trainer.bench = {"rollout_s": 0.0, "generate_s": 0.0, "tokens": 0.0}
            self.start = time.perf_counter()

        def on_step_end(self, *_: Any, **__: Any) -> None:
            step_s = time.perf_counter() - self.start
            self.records.append(derived({"step_s": step_s, "wall_s": step_s, **trainer.bench,
                                         "threads": torch.get_num_threads()}))

        def on_log(self, *_: Any, **__: Any) -> None:
            if self.records:
                self.records[-1]["wall_s"] = time.perf_counter() - self.start

    trainer = TimedGRPOTrainer(model=path, reward_funcs=trl_reward(task), args=args,
                               train_dataset=trl_dataset(task, order), peft_config=trl_peft_config(cfg))
    trainer.remove_callback(PrinterCallback)  # tether's progress bar is off too
    trainer.bench = {"rollout_s": 0.0, "generate_s": 0.0, "tokens": 0.0}
    timer = StepTimer()
    trainer.add_callback(timer)
    return trainer, timer


def check_prompt_parity(trl_trainer: Any, tether_bench: TetherBench | None, task: Any,
                        order: list[int]) -> tuple[bool, int]:
    """Whether both trainers feed the model the same tokens for the first prompt, and how many there are."""
    from tether.models import encode_chat

    item = task.train[order[0]]
    ours = encode_chat(trl_trainer.processing_class, item.prompt, system=task.system_prompt)
    theirs, _, _ = trl_trainer._tokenize_prompts(list(trl_dataset(task, order[:1])["prompt"]))
    same = list(theirs[0]) == ours
    if tether_bench is not None:
        same = same and tether_bench.trainer.collector.prompt_ids(item) == ours
    return same, len(ours)


# -- report -----------------------------------------------------------------------------------------


def optimizer_facts(optimizer: Any, model: Any) -> dict[str, Any]:
    """What each trainer actually ran with, read back after training (the JSON keeps it for checking)."""
    optimizer = getattr(optimizer, "optimizer", optimizer)  # accelerate wraps TRL's
    d, groups = optimizer.defaults, optimizer.param_groups
    return {"optimizer": type(optimizer).__name__, "lr": sorted({g["lr"] for g in groups}),
            "betas": sorted({tuple(g["betas"]) for g in groups}), "eps": sorted({g["eps"] for g in groups}),
            "weight_decay": sorted({g["weight_decay"] for g in groups}), "fused": d.get("fused"),
            "foreach": d.get("foreach"),
            "param_dtype": str(next(model.parameters()).dtype),
            "trainable_params": sum(p.numel() for p in model.parameters() if p.requires_grad),
            "activation_checkpointing": bool(getattr(model, "is_activation_checkpointing", False))}


def setup_facts(tether: TetherBench | None, trl: Any) -> dict[str, Any]:
    facts: dict[str, Any] = {}
    if tether is not None:
        t = tether.trainer
        facts["tether"] = {**optimizer_facts(t.optimizer, t.policy), "micro_batch_size": t.cfg.optim.micro_batch_size,
                           "max_tokens_per_micro_batch": t.cfg.optim.max_tokens_per_micro_batch,
                           # auto: per micro-batch; each step's record has the share checkpointed
                           "gradient_checkpointing": t.cfg.train.gradient_checkpointing,
                           "loss": f"{t.cfg.algorithm.policy_loss}/{t.cfg.algorithm.loss_agg}",
                           "clip": t.cfg.algorithm.loss_kwargs, "grad_clip": t.cfg.optim.grad_clip}
    if trl is not None:
        a = trl.args
        facts["trl"] = {**optimizer_facts(trl.optimizer, trl.model), "per_device_train_batch_size":
                        a.per_device_train_batch_size, "gradient_accumulation_steps": a.gradient_accumulation_steps,
                        "steps_per_generation": a.steps_per_generation, "generation_batch_size":
                        a.generation_batch_size, "num_iterations": a.num_iterations, "loss_type": a.loss_type,
                        "epsilon": [a.epsilon, a.epsilon_high], "beta": a.beta, "max_grad_norm": a.max_grad_norm,
                        "lr_scheduler_type": getattr(a.lr_scheduler_type, "value", a.lr_scheduler_type),
                        "use_vllm": a.use_vllm}
    return facts


def environment() -> dict[str, Any]:
    import transformers

    env = {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
           "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(), "platform": platform.platform()}
    try:
        import trl

        env["trl"] = trl.__version__
    except ImportError:
        env["trl"] = None
    try:
        env["cpu"] = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                          if line.startswith("model name"))
    except (OSError, StopIteration):
        env["cpu"] = platform.processor()
    from tether.engine.hf import speed_flags

    env["cpu_flags"] = speed_flags()  # whether bfloat16 rollouts can be fast here (avx512_bf16, amx_bf16)
    return env


def print_table(summary: dict[str, dict[str, float]]) -> None:
    rows = [("s / RL step", "step_s", "{:.2f}"), ("s / step incl. logging", "wall_s", "{:.2f}"),
            ("rollout s", "rollout_s", "{:.2f}"), ("  of which decoding s", "generate_s", "{:.2f}"),
            ("train s", "train_s", "{:.2f}"), ("tokens / step", "tokens", "{:.0f}"),
            ("rollout tok/s", "rollout_tok_s", "{:.1f}"), ("train tok/s", "train_tok_s", "{:.1f}")]
    names = [n for n in ("tether", "trl") if n in summary]
    header = f"{'median over timed steps':<26}" + "".join(f"{n:>10}" for n in names)
    if len(names) == 2:
        header += f"{'TRL/tether':>12}"
    print(header)
    print("-" * len(header))
    for label, key, fmt in rows:
        line = f"{label:<26}" + "".join(f"{fmt.format(summary[n][key]):>10}" for n in names)
        if len(names) == 2:
            line += f"{summary['trl'][key] / max(summary['tether'][key], 1e-9):>12.2f}"
        print(line)
    if len(names) == 2:
        ratio = summary["trl"]["step_s"] / summary["tether"]["step_s"]
        print(f"\nTRL s/step / tether s/step = {ratio:.2f}  (> 1: tether is faster)")


def results_path(out: Path | None) -> Path:
    if out is not None:
        return out
    stem = dt.date.today().isoformat()
    path, n = RESULTS / f"{stem}.json", 2
    while path.exists():
        path, n = RESULTS / f"{stem}-{n}.json", n + 1
    return path


# -- main ------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    # the two trainers' run directories (metrics, samples) are scratch: the JSON under --out is the result
    with tempfile.TemporaryDirectory(prefix="tether-bench-") as work:
        return bench(args, work)


def bench(args: argparse.Namespace, work: str) -> dict[str, Any]:
    """Both trainers' steps (or one's, ``--only``), alternating, with their run directories under ``work``."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    torch.set_num_threads(args.threads)
    from tether.rollout.single_turn import PromptStream

    cfg = tether_config(args, os.path.join(work, "tether"))
    path = model_dir(cfg.model.name)
    r = cfg.rollout
    lora = cfg.model.lora
    print(f"model {path}" + ("" if lora is None else f" + LoRA rank {lora.rank}, alpha {lora.alpha}") +
          f"\n{r.prompts_per_step} prompts x {r.group_size} samples, <= {r.max_new_tokens} new tokens, "
          f"micro-batch {cfg.optim.micro_batch_size}, {args.threads} threads, "
          f"{args.warmup} warm-up + {args.steps} timed steps per trainer\n", flush=True)
    load_start = os.getloadavg()
    if load_start[0] > 0.5:
        print(f"WARNING: load average {load_start[0]:.1f}: other processes are running. Descheduled OpenMP threads "
              "stall every parallel region, so timings can be several times too slow; measure on an idle machine.\n",
              flush=True)

    tether = TetherBench(cfg, path) if args.only != "trl" else None
    task = tether.trainer.collector.task if tether else None
    records: dict[str, list[dict[str, float]]] = {}
    parity = prompt_len = trl = None
    if args.only == "tether":
        for _ in range(cfg.train.steps):
            tether.step()
    else:
        if task is None:
            from tether.tasks import make_task

            task = make_task(cfg.task.name, **cfg.task.kwargs)
        # tether's own prompt order, so step k of both trainers answers the same prompts
        order = PromptStream(len(task.train), cfg.seed).take(cfg.train.steps * r.prompts_per_step)
        trl, timer = build_trl(cfg, path, task, order, os.path.join(work, "trl"),
                               between=tether.step if tether else (lambda: None))
        parity, prompt_len = check_prompt_parity(trl, tether, task, order)
        if not parity:
            print("WARNING: tether and TRL tokenize the prompts differently", file=sys.stderr)
        torch.set_num_threads(args.threads)
        trl.train()
        records["trl"] = timer.records
    if tether is not None:
        records["tether"] = tether.records

    summary = {name: median_summary(recs, args.warmup) for name, recs in sorted(records.items(), reverse=True)}
    print_table(summary)
    result = {
        "date": dt.datetime.now().isoformat(timespec="seconds"),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "settings": {"steps": args.steps, "warmup": args.warmup, "prompts_per_step": r.prompts_per_step,
                     "group_size": r.group_size, "max_new_tokens": r.max_new_tokens,
                     "micro_batch_size": cfg.optim.micro_batch_size, "threads": args.threads,
                     "lr": cfg.optim.lr, "temperature": r.temperature, "model": path,
                     "config": str(args.config), "interleaved": args.only is None,
                     "tether_overrides": args.tether_override, "ignore_eos": r.ignore_eos,
                     "lora": None if cfg.model.lora is None else cfg.model.lora.model_dump()},
        "environment": environment(), "loadavg_start": load_start, "loadavg_end": os.getloadavg(),
        "prompt_tokens_identical": parity, "first_prompt_tokens": prompt_len,
        "setup": setup_facts(tether, trl), "summary": summary,
        "ratio_trl_over_tether_step_s": (summary["trl"]["step_s"] / summary["tether"]["step_s"]
                                         if len(summary) == 2 else None),
        "ratio_95ci": (ratio_interval(records["trl"], records["tether"], args.warmup) if len(summary) == 2
                       else None),
        "steps": records,
    }
    if result["ratio_95ci"]:
        lo, hi = result["ratio_95ci"]
        print(f"95% interval of the ratio (steps resampled in pairs): [{lo:.2f}, {hi:.2f}]")
    out = results_path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nload average {load_start[0]:.1f} at start, {result['loadavg_end'][0]:.1f} at end ({os.cpu_count()} CPUs; "
          f"this run's own threads add about {args.threads})\nwrote {out}")
    return result


if __name__ == "__main__":
    main()
