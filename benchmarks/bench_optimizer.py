"""One AdamW step over SmolLM2-135M's parameters: PyTorch's fused kernel (tether's, ``tether.optimizer.adamw``)
against the multi-tensor (``foreach``) path tether used before and the per-parameter loop.

    .venv/bin/python benchmarks/bench_optimizer.py [--threads 2] [--steps 10] [--rounds 3]

Gradients are random (the step's cost does not depend on them). The implementations alternate, ``--rounds``
times, each timing ``--steps`` steps after one untimed step; the JSON (``--out``) has every round's mean seconds
per step and the median per implementation. One step costs the same in an RL or an SFT run of the same model.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

RESULTS = Path(__file__).resolve().parent / "results"
IMPLEMENTATIONS = {"fused": {"fused": True}, "foreach": {"foreach": True}, "for-loop": {"foreach": False}}


def seconds_per_step(params: list[torch.nn.Parameter], kind: str, steps: int) -> float:
    opt = torch.optim.AdamW(params, lr=1e-5, **IMPLEMENTATIONS[kind])
    opt.step()  # the moments are allocated here, outside the timing
    start = time.perf_counter()
    for _ in range(steps):
        opt.step()
    return (time.perf_counter() - start) / steps


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    from tether.models import load_policy, smollm2_dir

    model, _ = load_policy(str(smollm2_dir()), dtype=torch.float32)
    params = [q for q in model.parameters() if q.requires_grad]
    gen = torch.Generator().manual_seed(0)
    for q in params:
        q.grad = torch.randn(q.shape, generator=gen) * 1e-3
    rounds: dict[str, list[float]] = {kind: [] for kind in IMPLEMENTATIONS}
    for _ in range(args.rounds):
        for kind in IMPLEMENTATIONS:
            rounds[kind].append(seconds_per_step(params, kind, args.steps))
    median = {kind: statistics.median(v) for kind, v in rounds.items()}
    for kind, s in median.items():
        print(f"{kind:9s} {s:.3f} s / step  ({s / median['fused']:.1f}x fused)")
    result = {"date": dt.datetime.now().isoformat(timespec="seconds"), "command": " ".join(["python", *sys.argv]),
              "settings": vars(args) | {"out": str(args.out)}, "torch": torch.__version__,
              "cpu": platform.processor() or platform.machine(), "parameters": sum(q.numel() for q in params),
              "seconds_per_step": rounds, "median": median}
    out = args.out or RESULTS / f"{dt.date.today()}-optimizer.json"
    out.write_text(json.dumps(result, indent=1))
    print(f"wrote {out}")
    return result


if __name__ == "__main__":
    main()
