"""GPU smoke run: a few RL steps of each method on one GPU, with throughput and peak memory.

    python scripts/gpu_smoke.py [--model random:smollm2-135m | PATH] [--task parity] [--steps 3] [--json OUT]

``--model random:ARCH`` builds random weights of a known architecture (no download: a machine without a model hub
can run it); any other value is a local directory or a cached Hub name. ``--task parity`` (the default) rewards
even-length responses, so random weights still give mixed groups and every method's path runs: ARMOR accepts
anchors, DAPO's filter keeps groups, EAPO's gate opens. Rewards then say nothing about learning; the numbers
are speed. EAPO's prior is the policy's own initial weights.

Each method: ``--steps`` RL steps of 4 prompts x 8 samples, up to ``--tokens`` new tokens, on ``--device``. The
script stops if the policy, the reference or a prior is not on that device, and prints per method: seconds per
step, rollout and training tokens per second, and peak GPU memory.
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from tether.config import load_config
from tether.models import tiny_model
from tether.trainer import Trainer

# Shapes of real models, for random weights: speed and memory match the real model's, answers do not.
ARCHITECTURES = {
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2),  # for a check on the CPU: --device cpu
    "smollm2-135m": dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                         num_key_value_heads=3, max_position_embeddings=8192, rms_norm_eps=1e-5,
                         rope_theta=100000.0, initializer_range=0.02),
    "qwen2.5-0.5b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                         num_key_value_heads=2, max_position_embeddings=32768, rms_norm_eps=1e-6,
                         rope_theta=1000000.0, initializer_range=0.02, tie_word_embeddings=True),
}

METHODS: dict[str, dict[str, Any]] = {
    "grpo": {},
    "grpo_kl": {"algorithm": {"kl": {"coef": 0.001}}},
    "dr_grpo": {"algorithm": {"advantage": "dr_grpo", "loss_agg": "seq-mean-token-sum-norm"}},
    "dapo": {"rollout": {"dynamic_sampling": True, "max_gen_batches": 8},
             "algorithm": {"loss_kwargs": {"clip_low": 0.2, "clip_high": 0.28}}},
    "armor": {"methods": {"armor": {}}, "algorithm": {"policy_loss": "armor", "advantage": "qae"},
              "rollout": {"max_gen_batches": 8}},
    # the quantile gate opens on every rollout, whatever the weights (a fixed threshold may never open on random ones)
    "eapo": {"methods": {"eapo": {"threshold_mode": "quantile", "floor": -1.0}},
             "algorithm": {"policy_loss": "eapo"}},
}
PROOF = ("armor/acceptance_rate", "armor/anchor_rows", "eapo/injected_token_frac", "actor/kl_loss")


def build_model(spec: str, out: Path) -> str:
    """A model directory for ``spec``: random weights saved under ``out`` for ``random:ARCH``, else ``spec``."""
    if not spec.startswith("random:"):
        return spec
    arch = spec.removeprefix("random:")
    if arch not in ARCHITECTURES:
        raise SystemExit(f"--model {spec}: unknown architecture; known: {', '.join(ARCHITECTURES)}")
    model, tok = tiny_model(seed=0, **ARCHITECTURES[arch])
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return str(out)


def config(name: str, model: str, args: argparse.Namespace, run_root: Path) -> dict[str, Any]:
    data: dict[str, Any] = {
        "run_dir": str(run_root / name), "model": {"name": model, "bf16_autocast": args.bf16},
        "task": {"name": args.task, "kwargs": {}},
        "rollout": {"prompts_per_step": 4, "group_size": 8, "max_new_tokens": args.tokens},
        "optim": {"micro_batch_size": 8}, "val": {"every": 0},
        "train": {"steps": args.steps, "resume": False, "device": args.device},
        "logging": {"tensorboard": False, "progress": False}}
    for section, values in copy.deepcopy(METHODS[name]).items():
        data[section] = {**data.get(section, {}), **values}
    if "eapo" in data.get("methods", {}):
        data["methods"]["eapo"]["prior"] = model  # the prior: the policy's own initial weights
    return data


def check_placement(trainer: Trainer) -> str:
    """The device the models train on; raises if the policy, reference or a method's model is elsewhere."""
    models = {"policy": trainer.policy, "reference": trainer.ref_policy,
              **{f"{m.name} prior": getattr(m, "prior", None) for m in trainer.methods}}
    for role, model in models.items():
        if model is not None and next(model.parameters()).device != trainer.device:
            raise RuntimeError(f"the {role} is on {next(model.parameters()).device}, not on {trainer.device}")
    gpu = trainer.device.type == "cuda"
    return f"{trainer.device}" + (f" ({torch.cuda.get_device_name(trainer.device)})" if gpu else "")


def run_method(name: str, model: str, args: argparse.Namespace, run_root: Path) -> dict[str, Any]:
    gc.collect()  # the previous method's models go before this one's peak memory is measured
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    trainer = Trainer(load_config(data=config(name, model, args, run_root)))
    where = check_placement(trainer)
    steps = [trainer.train_step() for _ in range(args.steps)]
    timed = steps[1:] or steps  # the first step pays for kernel selection and allocator growth

    def median(key: str) -> float:
        return statistics.median(s.get(key, float("nan")) for s in timed)

    # that the method's own path ran: anchors accepted, prior tokens injected
    proof = {k: statistics.mean(s[k] for s in steps) for k in PROOF if k in steps[0]}
    return {"method": name, "device": where, "step_s": median("perf/step_s"),
            "rollout_tok_s": median("perf/rollout_tok_s"), "train_tok_s": median("perf/train_tok_s"),
            "reward": statistics.mean(s["train/reward_mean"] for s in steps),
            "peak_gib": torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else 0.0, **proof}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="random:smollm2-135m", help="random:ARCH, a local directory or a Hub name")
    ap.add_argument("--task", default="parity", help="a registered task (parity: any weights give mixed groups)")
    ap.add_argument("--methods", default=",".join(METHODS), help=f"comma-separated, from {', '.join(METHODS)}")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=256, help="max new tokens per response")
    ap.add_argument("--bf16", action="store_true", help="model.bf16_autocast")
    ap.add_argument("--device", default="cuda", help="train.device (cuda: stop at once if there is no GPU)")
    ap.add_argument("--json", type=Path, help="also write the rows here")
    args = ap.parse_args()
    unknown = sorted(set(args.methods.split(",")) - set(METHODS))
    if unknown:
        raise SystemExit(f"--methods: unknown {', '.join(unknown)}; known: {', '.join(METHODS)}")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        model = build_model(args.model, Path(tmp) / "model")
        for name in args.methods.split(","):
            start = time.perf_counter()
            try:
                row = run_method(name, model, args, Path(tmp) / "runs")
            except Exception as err:  # report and go on to the next method
                row = {"method": name, "error": f"{type(err).__name__}: {err}"}
            row["wall_s"] = time.perf_counter() - start
            rows.append(row)
            print(json.dumps(row), flush=True)
    print(f"\n{args.model}, {args.task}, 4 x 8 rows, <= {args.tokens} new tokens, bf16 autocast {args.bf16}")
    print(f"{'method':9s} {'s/step':>7s} {'rollout tok/s':>14s} {'train tok/s':>12s} {'reward':>7s} {'peak GiB':>9s}")
    for r in rows:
        if "error" in r:
            print(f"{r['method']:9s} FAILED {r['error']}")
        else:
            proof = "  ".join(f"{k} {r[k]:.3g}" for k in PROOF if k in r)
            print(f"{r['method']:9s} {r['step_s']:7.2f} {r['rollout_tok_s']:14.0f} {r['train_tok_s']:12.0f} "
                  f"{r['reward']:7.3f} {r['peak_gib']:9.2f}  {proof}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    if any("error" in r for r in rows):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
