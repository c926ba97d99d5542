"""ARMOR lab study, mechanism metrics at each run's endpoint (docs/methods/armor.md, "Evidence, third design").

ARMOR's claim is that reverse KL does not keep the policy's coverage of the reference distribution and anchors
with the mixed ratio do. On the report split this measures, for the reference (the stage-1 peak) and for every
finished run of the study (its endpoint checkpoint):

* ``fwd_kl``: forward KL(pi_ref || pi_theta), estimated on samples of the reference (T = 1) as the mean over
  samples of sum_t log pi_ref(y_t) - log pi_theta(y_t): how much of what the reference does the policy lost;
* ``fwd_kl_correct``: the same on the reference's correct samples in the anchors' mode only, i.e. on what anchors
  carry (the mode: the task's response feature ``--mode-feature``, the addition task's scratchpad by default);
* ``mode_logp``: the policy's mean log-probability per token of those correct answers in the mode;
* ``rev_kl``: reverse KL(pi_theta || pi_ref) on the policy's own samples (T = 1), the mean over samples of
  sum_t log pi_theta(y_t) - log pi_ref(y_t): the drift a KL penalty constrains (a KL arm is matched on it);
* ``entropy``: the policy's mean per-token entropy on its own samples (T = 1).

Usage: python scripts/lab/armor_mechanism.py PROTOCOL [--prompts 256] [--split SPLIT] [--mode-feature NAME]
       [--arms [ARM ...]] [--runs RUN_DIR ...] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch

from tether.engine.base import SamplingParams
from tether.engine.hf import HFEngine
from tether.lab.experiment import endpoint_checkpoint
from tether.lab.protocol import arm_config, load_protocol, run_dir
from tether.models import encode_chat, load_policy
from tether.models.forward import response_log_probs
from tether.tasks import make_task, task_split


def sample(model, tok, prompts: list[list[int]], max_new_tokens: int, seed: int):
    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=1.0)
    return HFEngine(model, tok).generate(prompts, params, seed=seed)


@torch.no_grad()
def sequence_log_probs(model, prompts, gen) -> torch.Tensor:
    """Sum over each response's tokens of log pi(y_t | x, y_<t)."""
    lp, _ = response_log_probs(model, prompts, gen.response_ids, gen.response_mask)
    return (lp * gen.response_mask).sum(1)


@torch.no_grad()
def mean_entropy(model, prompts, gen) -> float:
    _, ent = response_log_probs(model, prompts, gen.response_ids, gen.response_mask, with_entropy=True)
    mask = gen.response_mask.float()
    return float((ent * mask).sum() / mask.sum())


def in_mode(task, item, text: str, feature: str) -> bool:
    """Whether ``text`` is a correct answer in the anchors' mode: the task's response feature ``feature``."""
    features = task.response_features(item, text)
    if feature not in features:
        raise SystemExit(f"--mode-feature {feature}: the task reports {sorted(features)}")
    return bool(task.score(item, text).correct and features[feature])


def measure(model, reference, tok, prompts, ref_gen, ref_lp, good: torch.Tensor,
            max_new_tokens: int) -> dict[str, float]:
    lp = sequence_log_probs(model, prompts, ref_gen)
    gap = ref_lp - lp
    tokens = ref_gen.response_mask.sum(1).float()
    own = sample(model, tok, prompts, max_new_tokens, seed=1)
    drift = sequence_log_probs(model, prompts, own) - sequence_log_probs(reference, prompts, own)
    return {"fwd_kl": float(gap.mean()), "fwd_kl_correct": float(gap[good].mean()),
            "mode_logp": float((lp[good] / tokens[good]).mean()), "rev_kl": float(drift.mean()),
            "entropy": mean_entropy(model, prompts, own)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("protocol", type=Path)
    parser.add_argument("--prompts", type=int, default=256)
    parser.add_argument("--samples", type=int, default=2)
    parser.add_argument("--split", help="the task split whose prompts are used (default: the endpoint's)")
    parser.add_argument("--mode-feature", default="mode/scratchpad",
                        help="the response feature that marks the anchors' mode (default: mode/scratchpad)")
    parser.add_argument("--arms", nargs="*", help="only these arms of the protocol (default: all; none: --arms)")
    parser.add_argument("--runs", nargs="+", type=Path, default=[],
                        help="other run directories of the same task and reference, measured at their last "
                             "checkpoint (e.g. a KL coefficient sweep)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    protocol = load_protocol(args.protocol)
    base = arm_config(protocol, protocol.baseline, protocol.seeds[0])
    task = make_task(base.task.name, **base.task.kwargs)
    items = task_split(task, args.split or protocol.endpoint.split)[: args.prompts]
    reference, tok = load_policy(base.model.name)
    reference.eval()
    prompts = [encode_chat(tok, item.prompt) for item in items for _ in range(args.samples)]
    ref_gen = sample(reference, tok, prompts, base.rollout.max_new_tokens, seed=0)
    good = torch.tensor([in_mode(task, item, text, args.mode_feature)
                         for item, text in zip([i for i in items for _ in range(args.samples)], ref_gen.texts,
                                               strict=True)])
    ref_lp = sequence_log_probs(reference, prompts, ref_gen)
    out: dict = {"reference": base.model.name, "prompts": len(items), "samples": args.samples,
                 "split": args.split or protocol.endpoint.split, "mode_feature": args.mode_feature,
                 "reference_correct_in_mode_share": float(good.float().mean()), "answers": len(prompts),
                 "runs": {}}
    out["runs"]["reference"] = measure(reference, reference, tok, prompts, ref_gen, ref_lp, good,
                                       base.rollout.max_new_tokens)
    checkpoints = {f"{arm}/seed{seed}": endpoint_checkpoint(run_dir(protocol, arm, seed), protocol.endpoint.at)
                   for arm in (protocol.arms if args.arms is None else args.arms) for seed in protocol.seeds
                   if (run_dir(protocol, arm, seed) / "endpoint.json").is_file()}
    checkpoints |= {str(directory): endpoint_checkpoint(directory, "final") for directory in args.runs}
    for name, checkpoint in checkpoints.items():
        model, _ = load_policy(str(checkpoint))
        model.eval()
        out["runs"][name] = measure(model, reference, tok, prompts, ref_gen, ref_lp, good, base.rollout.max_new_tokens)
        print(name, out["runs"][name], flush=True)
    text = json.dumps(out, indent=2)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)
    print(markdown_table(out["runs"]))


def markdown_table(runs: dict[str, dict[str, float]]) -> str:
    """Per arm (the reference and each --runs directory alone), each metric's mean over seeds."""
    arms: dict[str, list[dict[str, float]]] = {}
    for key, values in runs.items():
        arms.setdefault(key.rsplit("/seed", 1)[0], []).append(values)
    metrics = list(next(iter(runs.values())))
    lines = ["| arm | runs | " + " | ".join(metrics) + " |", "|---|---|" + "---|" * len(metrics)]
    for arm, rows in arms.items():
        means = [sum(row[m] for row in rows) / len(rows) for m in metrics]
        lines.append(f"| {arm} | {len(rows)} | " + " | ".join(f"{x:.3f}" for x in means) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
