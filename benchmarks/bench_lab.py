"""Speed of one RL step of the lab's character model against the quickstart's SmolLM2 step, side by side.

    .venv/bin/python benchmarks/bench_lab.py --steps 5 --warmup 1 [--model char-256x4]

Issue 18 asks that one GRPO step of the character model (64 rows, up to 32 new tokens, one thread) be at least 20x
faster than the quickstart's step (SmolLM2-135M, 4 prompts x 8 samples, 24 new tokens), so that an experiment of
5 arms x 5 seeds x 200 steps fits in two hours on two cores. Both run here on one thread, in alternation (char,
SmolLM2, char, ...), so both see the same machine state; the medians of ``perf/step_s`` after the warm-up steps
are reported with their ratio. The character model is trained on the lab's addition task from its random
initialisation (its speed does not depend on its weights beyond response lengths, which are logged).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
from pathlib import Path

import torch

from tether.config import load_config
from tether.trainer import Trainer


def char_config(run_dir: str, model: str) -> list[str]:
    return ["task.name=addition", "task.kwargs={digits: 3, train_size: 256, val_size: 8, report_size: 8}",
            f"model.name={model}", "rollout.prompts_per_step=8", "rollout.group_size=8",
            "rollout.max_new_tokens=32", "optim.lr=1e-4", "optim.micro_batch_size=32", "val.every=0",
            "train.save_every=0", "logging.tensorboard=false", "logging.progress=false", f"run_dir={run_dir}",
            "train.threads=1", "train.device=cpu"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--model", default="char-256x4")
    ap.add_argument("--out", default="benchmarks/results/lab_step.json", help="where the JSON goes")
    args = ap.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        char = Trainer(load_config("configs/quickstart.yaml", char_config(f"{tmp}/char", args.model)))
        smol = Trainer(load_config("configs/quickstart.yaml", [f"run_dir={tmp}/smol", "val.every=0",
                                                                "train.save_every=0", "logging.tensorboard=false",
                                                                "logging.progress=false", "train.threads=1",
                                                                "train.device=cpu"]))
        times: dict[str, list[float]] = {"char": [], "smollm2": []}
        lengths: dict[str, list[float]] = {"char": [], "smollm2": []}
        for i in range(args.warmup + args.steps):
            for name, trainer in (("char", char), ("smollm2", smol)):
                metrics = trainer.train_step()
                if i >= args.warmup:
                    times[name].append(metrics["perf/step_s"])
                    lengths[name].append(metrics["train/response_length"])
                print(name, i, round(metrics["perf/step_s"], 2), flush=True)
    result = {name: {"median_step_s": statistics.median(t), "steps": t,
                     "mean_response_length": statistics.mean(lengths[name])} for name, t in times.items()}
    result["ratio_smollm2_over_char"] = result["smollm2"]["median_step_s"] / result["char"]["median_step_s"]
    result["machine"] = {"cpu": platform.processor() or platform.machine(), "threads": 1,
                         "torch": torch.__version__}
    result["char_model"] = args.model
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
