"""The figure and numbers of docs/agents.md "Evidence" from a finished scripts/agent_experiment.sh run.

Usage: python scripts/agent_report.py [runs/agents/frozenlake_tiny] [docs/img/agents_frozenlake.png] [grpo]

The third argument names the GRPO run directory inside the first (Sokoban: grpo60); the title and the
validation mode (greedy or sampled) come from that run's config.yaml.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import yaml
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from tether.track.plot import read_metrics


def main() -> None:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "runs/agents/frozenlake_tiny")
    png = Path(sys.argv[2] if len(sys.argv) > 2 else "docs/img/agents_frozenlake.png")
    run = out / (sys.argv[3] if len(sys.argv) > 3 else "grpo")
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    env, val_cfg = cfg["env"], cfg["val"]
    mode = "greedy" if val_cfg["greedy"] else f"T={val_cfg['temperature']:g}"
    rows = read_metrics(run / "metrics.jsonl")
    val = [(r["step"], r["val/success_rate"], r["val/episodes"]) for r in rows if "val/success_rate" in r]
    train = [(r["step"], r["env/success_rate"]) for r in rows if "env/success_rate" in r]

    fig = Figure(figsize=(7, 4))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    steps, rates, ns = zip(*val, strict=True)
    se = [math.sqrt(p * (1 - p) / n) for p, n in zip(rates, ns, strict=True)]
    ax.errorbar(steps, rates, yerr=se, marker="o", capsize=3, label=f"held-out, {mode} ({int(ns[0])} episodes, ±1 SE)")
    t_steps, t_rates = zip(*train, strict=True)
    ax.plot(t_steps, t_rates, ".", alpha=0.35, color="C1", label="training episodes, T=1 (4 maps x 8 per step)")
    window = 5
    rolling = [sum(t_rates[max(0, i - window + 1):i + 1]) / len(t_rates[max(0, i - window + 1):i + 1])
               for i in range(len(t_rates))]
    ax.plot(t_steps, rolling, color="C1", label=f"training, {window}-step mean")
    ax.set_ylim(0, 1)
    ax.set_xlabel("GRPO step (step 0 = SFT warm start)")
    ax.set_ylabel("success rate")
    ax.set_title(f"{env['name']} {env['kwargs']}: GRPO from an SFT warm start (2-layer Llama, 3.2M params)",
                 fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper right")
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110, bbox_inches="tight")
    print(f"wrote {png}")

    print(f"| step | held-out success ({mode}) |")
    print("|---|---|")
    for s, p, n in val:
        print(f"| {s} | {p:.3f} ({round(p * n)}/{int(n)}) |")
    first, last = t_rates[:window], t_rates[-window:]
    print(f"training success, steps 1-{window}: {sum(first) / len(first):.3f}; "
          f"last {window}: {sum(last) / len(last):.3f}")
    for name in ("sft", "grpo"):
        path = out / f"sampled_eval_{name}.json"
        if path.is_file():
            r = json.loads(path.read_text())
            print(f"sampled eval {name}: {r['val/success_rate']:.3f} of {int(r['val/episodes'])}")
    sft = json.loads((out / "sft" / "sft.json").read_text())
    print(f"sft: {sft['pairs']} pairs, {sft['steps']} steps, {sft['wall_s']} s, final loss {sft['final_loss']:.3f}")
    step_s = [r["perf/step_s"] for r in rows if "perf/step_s" in r]
    print(f"grpo: {len(step_s)} steps, {sum(step_s):.0f} s in steps (mean {sum(step_s) / len(step_s):.0f} s)")


if __name__ == "__main__":
    main()
