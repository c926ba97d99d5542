"""The quickstart RL step with float32 and bfloat16 rollouts, side by side in one process.

    .venv/bin/python benchmarks/bench_rollout_dtype.py --steps 5 --warmup 1

Two trainers on ``configs/quickstart.yaml`` (SmolLM2-135M, float32 training), one sampling with the policy itself
(``rollout.dtype`` unset) and one from its bfloat16 copy with the ``tis`` correction; their steps alternate (float32,
bfloat16, float32, ...) so both see the same machine state. Per step: ``perf/step_s``, ``perf/rollout_s`` and the
process CPU seconds of each (``time.process_time``, every thread: steadier than wall-clock on a shared machine), the
generated tokens, the engine-trainer gap (``health/logprob_diff_mean``) and the correction's metrics. Medians go to
the terminal and, with every step, to ``--out`` as JSON with the CPU's flags (``avx512_bf16``/``amx_bf16``: whether
bfloat16 is native). Parity only logs here (``health.parity.patience=0``): the gap is what is measured.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from tether.engine.hf import speed_flags

REPO = Path(__file__).resolve().parent.parent
QUICKSTART = REPO / "configs" / "quickstart.yaml"
RESULTS = Path(__file__).resolve().parent / "results"
ARMS = {"float32": [], "bfloat16": ["rollout.dtype=bfloat16", "rollout.correction.mode=tis"]}
KEYS = ("step_s", "rollout_s", "train_s", "step_cpu_s", "rollout_cpu_s", "tokens", "logprob_diff_mean",
        "corr_kl_k3", "corr_weight_mean")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=5, help="timed RL steps per arm (default 5)")
    p.add_argument("--warmup", type=int, default=1, help="untimed RL steps per arm before them (default 1)")
    p.add_argument("--threads", type=int, default=2, help="torch CPU threads (default 2)")
    p.add_argument("--out", type=Path, default=None, help="default: benchmarks/results/<date>-rollout-dtype.json")
    return p.parse_args(argv)



def build(name: str, run_dir: str, steps: int, threads: int) -> Any:
    import torch

    from tether.config import load_config
    from tether.models import load_policy, smollm2_dir
    from tether.trainer import Trainer

    cfg = load_config(QUICKSTART, [f"run_dir={run_dir}/{name}", f"train.threads={threads}", f"train.steps={steps}",
                                   "train.resume=never", "train.overwrite=true",
                                   "val.every=0", "logging.tensorboard=false",
                                   "logging.progress=false", "health.parity.patience=0", *ARMS[name]])
    policy, tokenizer = load_policy(str(smollm2_dir()), dtype=torch.float32)
    return Trainer(cfg, policy=policy, tokenizer=tokenizer)


def timed_step(trainer: Any) -> dict[str, float]:
    """One RL step, with the CPU seconds of its rollout (timed around the collector) and of the whole step."""
    collect = trainer.collector.collect
    cpu: dict[str, float] = {}

    def collect_timed(*args: Any, **kwargs: Any) -> Any:
        start = time.process_time()
        out = collect(*args, **kwargs)
        cpu["rollout"] = time.process_time() - start
        return out

    trainer.collector.collect = collect_timed
    start = time.process_time()
    m = trainer.train_step()
    step_cpu = time.process_time() - start
    trainer.collector.collect = collect
    return {"step_s": m["perf/step_s"], "rollout_s": m["perf/rollout_s"],
            "train_s": m["perf/step_s"] - m["perf/rollout_s"], "step_cpu_s": step_cpu, "rollout_cpu_s": cpu["rollout"],
            "tokens": m["perf/rollout_tok_s"] * m["perf/rollout_s"],
            "logprob_diff_mean": m.get("health/logprob_diff_mean", float("nan")),
            "corr_kl_k3": m.get("rollout_corr/kl_k3", float("nan")),
            "corr_weight_mean": m.get("rollout_corr/weight_mean", float("nan"))}


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    steps = args.warmup + args.steps
    records: dict[str, list[dict[str, float]]] = {name: [] for name in ARMS}
    with tempfile.TemporaryDirectory() as run_dir:
        trainers = {name: build(name, run_dir, steps, args.threads) for name in ARMS}
        for i in range(steps):
            for name, trainer in trainers.items():
                r = timed_step(trainer)
                print(f"step {i + 1} {name:>8}: step {r['step_s']:.2f} s (cpu {r['step_cpu_s']:.2f}), rollout "
                      f"{r['rollout_s']:.2f} s (cpu {r['rollout_cpu_s']:.2f}), {r['tokens']:.0f} tokens, gap "
                      f"{r['logprob_diff_mean']:.4f}", flush=True)
                if i >= args.warmup:
                    records[name].append(r)
    medians = {name: {k: statistics.median(r[k] for r in rs) for k in KEYS} for name, rs in records.items()}
    for name, m in medians.items():
        print(f"{name:>8} median: " + ", ".join(f"{k} {v:.4g}" for k, v in m.items()))
    f32, bf16 = medians["float32"], medians["bfloat16"]
    ratios = {k: f32[k] / bf16[k] for k in ("step_s", "rollout_s", "step_cpu_s", "rollout_cpu_s")}
    print("float32 / bfloat16: " + ", ".join(f"{k} {v:.2f}x" for k, v in ratios.items()))
    out = args.out or RESULTS / f"{dt.date.today()}-rollout-dtype.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"cpu_flags": speed_flags(), "threads": args.threads, "warmup": args.warmup,
                               "medians": medians, "float32_over_bfloat16": ratios, "steps": records}, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
