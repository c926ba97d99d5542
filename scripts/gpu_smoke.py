"""GPU smoke run (never run here: written on a CPU-only machine): a few steps per method, with throughput.

    python scripts/gpu_smoke.py [--model Qwen/Qwen2.5-0.5B-Instruct] [--steps 3] [--device cuda]

Each method: ``steps`` RL steps of 4 prompts x 8 samples, 256 new tokens, bf16 autocast, on one GPU.
Prints the device the policy trains on (and stops if it is not ``train.device``), then rollout and training
tokens per second and peak GPU memory per method. Sized to finish well within 10 minutes.
"""

from __future__ import annotations

import argparse
import gc
import time

import torch

from tether.config import load_config
from tether.trainer import Trainer

METHODS = {
    "grpo": {},
    "dr_grpo": {"algorithm": {"advantage": "dr_grpo", "loss_agg": "seq-mean-token-sum-norm"}},
    "armor": {"methods": {"armor": {}}, "algorithm": {"policy_loss": "armor", "advantage": "qae"}},
    # eapo needs methods.eapo.prior (a prior model); add it for your model family to smoke-test EAPO
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="Qwen/Qwen2.5-0.5B-Instruct")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--device", default="cuda", help="train.device (cuda: stop at once if there is no GPU)")
    args = ap.parse_args()
    for name, extra in METHODS.items():
        data = {"run_dir": f"runs/gpu_smoke/{name}", "model": {"name": args.model, "bf16_autocast": True},
                "task": {"name": "reasoning_gym", "kwargs": {}},
                "rollout": {"prompts_per_step": 4, "group_size": 8, "max_new_tokens": 256},
                "optim": {"micro_batch_size": 8}, "val": {"every": 0},
                "train": {"steps": args.steps, "resume": False, "device": args.device},
                "logging": {"tensorboard": False, "progress": False}, **extra}
        trainer = None  # the previous method's models go before this one's peak memory is measured
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        start = time.perf_counter()
        try:
            trainer = Trainer(load_config(data=data))
            print(f"{name:8s} trains on {describe(trainer)}", flush=True)
            last = trainer.fit()
        except Exception as err:  # report and go on to the next method
            print(f"{name:8s} FAILED: {type(err).__name__}: {err}")
            continue
        peak = torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else 0.0
        print(f"{name:8s} {time.perf_counter() - start:6.1f}s  rollout {last.get('perf/rollout_tok_s', 0):8.0f} tok/s"
              f"  train {last.get('perf/train_tok_s', 0):8.0f} tok/s  reward {last.get('train/reward_mean', 0):.3f}"
              f"  peak GPU memory {peak:.1f} GiB")


def describe(trainer: Trainer) -> str:
    """The device of the policy's (and the reference's) weights; raises if one is not ``trainer.device``."""
    models = {"policy": trainer.policy, "reference": trainer.ref_policy}
    for role, model in models.items():
        if model is not None and next(model.parameters()).device != trainer.device:
            raise RuntimeError(f"the {role} is on {next(model.parameters()).device}, not on train.device's "
                               f"{trainer.device}")
    gpu = trainer.device.type == "cuda"
    return f"{trainer.device}" + (f" ({torch.cuda.get_device_name(trainer.device)})" if gpu else "")


if __name__ == "__main__":
    main()
