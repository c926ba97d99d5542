"""SEED lab, third design: the GRPO pilot's registered rule (issue #42; tether/lab/seed_third.py), read from the
pilot runs' selection-split validation only.

    python scripts/lab/seed_pilot.py [--root runs/lab/seed/third/pilot] [--horizon 64] [--out FILE.json] [--apply]

Prints the curve (mean over the pilot seeds of val/success_rate every 4 steps), W every 8 steps, and what the rule
fixes: the stage-2 length (train.steps), this setting's GRPO value (test_size.setting_baseline), the test size
(test_size.delta = calibration.min_movement), the seeds and their MDE, and whether delta fits under 1 - G. When
GRPO has not flattened by the horizon it says so: rerun the pilot to 96 steps and read it with --horizon 96.
``--apply`` writes what the rule fixes into the design's lines marked PROVISIONAL (tether.lab.seed_third.apply_rule;
commit them before the calibration runs); it refuses while the pilot has not decided, or when delta > 1 - G.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from tether.lab.seed_third import PILOT_SEEDS, PROVISIONAL_FILES, apply_rule, pilot_curve, pilot_rule


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default="runs/lab/seed/third/pilot")
    ap.add_argument("--horizon", type=int, default=64)
    ap.add_argument("--out", default=None)
    ap.add_argument("--apply", action="store_true", help="write the rule into the design's PROVISIONAL lines")
    args = ap.parse_args()
    runs = [Path(args.root) / f"seed{s}" for s in PILOT_SEEDS]
    missing = [str(r) for r in runs if not (r / "metrics.jsonl").is_file()]
    if missing:
        raise SystemExit(f"no metrics.jsonl in {', '.join(missing)}: run the pilot first (docs/methods/seed.md)")
    curve = pilot_curve(runs)
    if args.horizon not in curve:
        raise SystemExit(f"the pilot has not validated step {args.horizon} yet (last: {max(curve, default=None)})")
    result = pilot_rule(curve, args.horizon)
    print("step  " + "  ".join(f"{s:>5}" for s in curve))
    print("v     " + "  ".join(f"{v:5.3f}" for v in curve.values()))
    print(json.dumps({k: v for k, v in result.items() if k != "curve"}, indent=2))
    if "train_steps" not in result:
        print(f"GRPO has not flattened by step {args.horizon}: run the pilot on to train.steps=96 and read it with "
              "--horizon 96")
    elif not result["flattened"]:
        print(f"GRPO has not flattened by step {args.horizon} either: stage 2 runs {args.horizon} steps (declare it)")
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2))
    if args.apply:
        apply(result, args.out or "scripts/lab/seed_pilot.py")


def apply(result: dict, source: str) -> None:
    if "train_steps" not in result:
        raise SystemExit("--apply: the pilot has not decided the stage-2 length yet; nothing written")
    if not result["testable"]:
        raise SystemExit(f"--apply: delta {result['delta']} exceeds 1 - G = {1 - result['grpo_value']:.3f}: the "
                         "design is not testable in this setting; nothing written, nothing else runs")
    for name in PROVISIONAL_FILES:
        path = Path(name)
        path.write_text(apply_rule(path.read_text(), result, source))
        print(f"fixed by the rule: {name}")


if __name__ == "__main__":
    main()
