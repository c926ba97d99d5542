"""ARMOR lab study, mechanism metrics at each run's endpoint (docs/methods/armor.md, "Evidence, third design").

ARMOR's claim is that reverse KL does not keep the policy's coverage of the reference distribution and anchors
with the mixed ratio do. On the report split this measures, for the reference (the stage-1 peak) and for every
finished run of the study (its endpoint checkpoint):

* ``fwd_kl``: forward KL(pi_ref || pi_theta), estimated on samples of the reference (T = 1) as the mean over
  samples of sum_t log pi_ref(y_t) - log pi_theta(y_t): how much of what the reference does the policy lost;
* ``fwd_kl_correct``: the same on the reference's correct samples only, i.e. on what anchors carry;
* ``scratchpad_logp``: the policy's mean log-probability of the reference's correct scratchpad answers per token;
* ``entropy``: the policy's mean per-token entropy on its own samples (T = 1).

Usage: python scripts/lab/armor_mechanism.py PROTOCOL [--prompts 256] [--out FILE.json]
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
from tether.tasks.addition import response_mode


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


def measure(model, tok, prompts, ref_gen, ref_lp, good: torch.Tensor, max_new_tokens: int) -> dict[str, float]:
    lp = sequence_log_probs(model, prompts, ref_gen)
    gap = ref_lp - lp
    tokens = ref_gen.response_mask.sum(1).float()
    own = sample(model, tok, prompts, max_new_tokens, seed=1)
    return {"fwd_kl": float(gap.mean()), "fwd_kl_correct": float(gap[good].mean()),
            "scratchpad_logp": float((lp[good] / tokens[good]).mean()),
            "entropy": mean_entropy(model, prompts, own)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("protocol", type=Path)
    parser.add_argument("--prompts", type=int, default=256)
    parser.add_argument("--samples", type=int, default=2)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    protocol = load_protocol(args.protocol)
    base = arm_config(protocol, protocol.baseline, protocol.seeds[0])
    task = make_task(base.task.name, **base.task.kwargs)
    items = task_split(task, protocol.endpoint.split)[: args.prompts]
    reference, tok = load_policy(base.model.name)
    reference.eval()
    prompts = [encode_chat(tok, item.prompt) for item in items for _ in range(args.samples)]
    ref_gen = sample(reference, tok, prompts, base.rollout.max_new_tokens, seed=0)
    good = torch.tensor([task.score(item, text).correct and response_mode(text) == "scratchpad"
                         for item, text in zip([i for i in items for _ in range(args.samples)], ref_gen.texts,
                                               strict=True)])
    ref_lp = sequence_log_probs(reference, prompts, ref_gen)
    out: dict = {"reference": base.model.name, "prompts": len(items), "samples": args.samples,
                 "reference_correct_scratchpad_share": float(good.float().mean()), "answers": len(prompts),
                 "runs": {}}
    out["runs"]["reference"] = measure(reference, tok, prompts, ref_gen, ref_lp, good, base.rollout.max_new_tokens)
    for arm in protocol.arms:
        for seed in protocol.seeds:
            directory = run_dir(protocol, arm, seed)
            if not (directory / "endpoint.json").is_file():
                continue
            model, _ = load_policy(str(endpoint_checkpoint(directory, protocol.endpoint.at)))
            model.eval()
            out["runs"][f"{arm}/seed{seed}"] = measure(model, tok, prompts, ref_gen, ref_lp, good,
                                                       base.rollout.max_new_tokens)
            print(arm, seed, out["runs"][f"{arm}/seed{seed}"], flush=True)
    text = json.dumps(out, indent=2)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)
    print(markdown_table(out["runs"]))


def markdown_table(runs: dict[str, dict[str, float]]) -> str:
    """Per arm (the reference alone), each metric's mean over seeds."""
    arms: dict[str, list[dict[str, float]]] = {}
    for key, values in runs.items():
        arms.setdefault(key.split("/")[0], []).append(values)
    metrics = list(next(iter(runs.values())))
    lines = ["| arm | runs | " + " | ".join(metrics) + " |", "|---|---|" + "---|" * len(metrics)]
    for arm, rows in arms.items():
        means = [sum(row[m] for row in rows) / len(rows) for m in metrics]
        lines.append(f"| {arm} | {len(rows)} | " + " | ".join(f"{x:.3f}" for x in means) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
