"""EAPO lab study, the mechanism tables beside tether experiment's report (docs/methods/eapo.md).

Reads RUN_ROOT (runs/lab/eapo/study) and prints markdown:
1. per arm, the mean over seeds of the training metrics over two windows of steps (``--windows``, default 1-10 and
   51-60): training accuracy, share of
   steps with a zero gradient (GRPO groups without variance), injected tokens and rollouts, accuracy of injected
   and clean rollouts, the importance weights' mean and normalised effective sample size;
2. compute: rollout tokens per step (generated tokens, plus one prior forward per generated token while the
   prior runs) relative to GRPO;
3. where the logged injections land: on track (the response so far is a prefix of the gold scratchpad) or off
   track, and the share that are the first digit of a two-digit column sum, a carry mark, or (for a sum that
   overflows) in the top column or the answer, where the new leading digit is written and copied.

Usage: python scripts/lab/eapo_report.py [RUN_ROOT] [--windows 1-10 51-60]
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import Counter
from pathlib import Path

from tether.tasks.addition import overflows, scratchpad

TRAIN_KEYS = ("train/accuracy", "eapo/injected_token_frac", "eapo/injected_rollouts_frac", "eapo/accuracy_injected",
              "eapo/accuracy_clean", "eapo/is_weight_mean", "eapo/is_ess")


def rows(path: Path) -> list[dict]:
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def window_mean(metrics: list[dict], key: str, low: int, high: int) -> float | None:
    values = [r[key] for r in metrics if key in r and low <= r["step"] <= high]
    return statistics.mean(values) if values else None


def fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def training_table(root: Path, windows: list[tuple[int, int]]) -> list[str]:
    lines = ["| arm | window | " + " | ".join(k.split("/")[1] for k in TRAIN_KEYS) + " | zero-gradient steps |",
             "|---|---|" + "---|" * (len(TRAIN_KEYS) + 1)]
    for arm_dir in sorted(p for p in root.iterdir() if p.is_dir()):
        runs = [rows(p) for p in sorted(arm_dir.glob("seed*/metrics.jsonl"))]
        for low, high in windows:
            cells = []
            for key in TRAIN_KEYS:
                per_seed = [window_mean(r, key, low, high) for r in runs]
                per_seed = [v for v in per_seed if v is not None]
                cells.append(fmt(statistics.mean(per_seed)) if per_seed else "-")
            zero = [window_mean([{**x, "zero": float(x["actor/grad_norm"] == 0)} for x in r
                                 if "actor/grad_norm" in x], "zero", low, high) for r in runs]
            zero = [z for z in zero if z is not None]
            lines.append(f"| {arm_dir.name} (n={len(runs)}) | {low}-{high} | " + " | ".join(cells)
                         + f" | {fmt(statistics.mean(zero)) if zero else '-'} |")
    return lines


def compute_table(root: Path) -> list[str]:
    """Decoding forwards per step: generated rows (prompts x group size x generation batches) x the kept rows' mean
    length, doubled while a prior runs (one prior forward per policy token). Approximate: dropped groups' lengths
    are taken to be the kept ones'."""
    import yaml

    costs = {}
    for arm_dir in sorted(p for p in root.iterdir() if p.is_dir()):
        per_seed = []
        for path in sorted(arm_dir.glob("seed*/metrics.jsonl")):
            rollout = yaml.safe_load((path.parent / "config.yaml").read_text())["rollout"]
            generated = rollout["prompts_per_step"] * rollout["group_size"]
            steps = [r for r in rows(path) if "train/response_length" in r]
            tokens = [r["train/response_length"] * generated * r.get("rollout/num_gen_batches", 1.0)
                      * (2.0 if "eapo/lambda" in r and r["eapo/lambda"] > 0 else 1.0) for r in steps]
            if tokens:
                per_seed.append(statistics.mean(tokens))
        if per_seed:
            costs[arm_dir.name] = statistics.mean(per_seed)
    base = costs.get("grpo")
    lines = ["| arm | decoding forwards per step (tokens, prior included) | relative to GRPO |", "|---|---|---|"]
    for arm, cost in costs.items():
        lines.append(f"| {arm} | {cost:.0f} | {cost / base:.2f}x |" if base else f"| {arm} | {cost:.0f} | - |")
    return lines


LANDINGS = ("off track", "on track: carry mark", "on track: tens digit of a column sum",
            "on track: top column or answer of an overflow", "on track: other", "on track: wrong token")


def landing(before: str, token: str, gold: str, overflow: bool = False) -> str:
    if not gold.startswith(before):
        return "off track"
    if overflow and "," not in gold[len(before):]:
        return "on track: top column or answer of an overflow"
    if gold[len(before):len(before) + 2] == "+1" and token == "+":
        return "on track: carry mark"
    if gold[len(before):len(before) + 1] == token and before.endswith("=") and token == "1":
        return "on track: tens digit of a column sum"
    return "on track: other" if gold[len(before):len(before) + 1] == token else "on track: wrong token"


def landing_table(root: Path) -> list[str]:
    lines = ["| arm | logged injections | " + " | ".join(LANDINGS) + " |", "|---|---|" + "---|" * len(LANDINGS)]
    for arm_dir in sorted(root.glob("eapo_*")):
        counts: Counter = Counter()
        for path in arm_dir.glob("seed*/eapo_injections.jsonl"):
            for r in rows(path):
                a, b = (int(x) for x in r["prompt"].split("+"))
                overflow = bool(overflows(a, b, len(str(max(a, b)))))
                counts[landing(r["before"], r["token"], scratchpad(a, b), overflow)] += 1
        total = sum(counts.values()) or 1
        lines.append(f"| {arm_dir.name} | {total} | " + " | ".join(f"{counts[k] / total:.2f}" for k in LANDINGS) + " |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", nargs="?", default="runs/lab/eapo/study", type=Path)
    parser.add_argument("--windows", nargs="+", default=["1-10", "51-60"], help="step windows, LOW-HIGH")
    args = parser.parse_args()
    root = args.root
    windows = [tuple(int(x) for x in w.split("-")) for w in args.windows]
    print("\n".join(["### Training, mean over seeds", "", *training_table(root, windows), "", "### Compute", "",
                     *compute_table(root), "", "### Where the logged injections land (first 64 per step)", "",
                     *landing_table(root)]))


if __name__ == "__main__":
    main()
