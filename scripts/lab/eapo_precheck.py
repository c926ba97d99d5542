"""EAPO lab study, precondition check (docs/methods/eapo.md, "Evidence, second design"), on the selection split.

1. Accuracy of the base and the prior by carry count, and with and without overflow where the task draws it
   (greedy and sampled): the prior must succeed where the base fails, or EAPO has nothing to inject.
2. The JS statistic of the two next-token distributions along the base's own rollouts, split by where the token
   sits: a carry decision (the scratchpad so far is right and the next character is the '+' of a carry), an
   overflow decision (on track in the top column of a sum with a new leading digit, and the next character is that
   digit: after '=', ':' or '#'), another on-track position, or off track. A fixed threshold tau is then chosen by
   the rule the protocol states, and the gate's landing places at that tau are counted with the prior injecting at
   every gated position (lambda = 1).

Usage: python scripts/lab/eapo_precheck.py CONFIG --prior DIR [--out FILE.json] [--tau-quantile 0.98]
"""

from __future__ import annotations

import argparse
import json
import os
from collections import Counter
from pathlib import Path

import torch

from tether.config import load_config
from tether.engine.base import SamplingParams
from tether.engine.hf import HFEngine
from tether.methods.eapo import PriorInjection
from tether.models import encode_chat, load_policy
from tether.tasks import make_task
from tether.tasks.addition import extract_final, scratchpad


def accuracy_by_carries(model, tok, items, params: SamplingParams, seed: int, by_overflow: bool) -> dict[str, float]:
    engine = HFEngine(model, tok)
    gen = engine.generate([encode_chat(tok, i.prompt) for i in items], params, seed=seed)
    out: dict[str, list[int]] = {}
    for item, text in zip(items, gen.texts, strict=True):
        ok = extract_final(text) == item.answer
        out.setdefault(f"carries={item.meta['carries']}", []).append(int(ok))
        if by_overflow:
            out.setdefault(f"overflow={item.meta['overflow']}", []).append(int(ok))
        out.setdefault("all", []).append(int(ok))
    return {k: sum(v) / len(v) for k, v in sorted(out.items())}


def position_class(prefix: str, gold: str, overflow: bool = False) -> str:
    """carry: on track and the gold scratchpad's next characters are '+1'; overflow: on track in the top column of an
    overflowing sum, next the new leading digit (after '=', ':' or '#'); on_track: the response so far is a prefix of
    the gold scratchpad; off_track: it is not (an earlier token was wrong)."""
    if not gold.startswith(prefix):
        return "off_track"
    if gold[len(prefix):len(prefix) + 2] == "+1" and len(prefix) >= 3 and prefix[-2] == "+":
        return "carry"
    if overflow and "," not in gold[len(prefix):] and prefix[-1:] in ("=", ":", "#") and gold[len(prefix)] == "1":
        return "overflow"
    return "on_track"


def hard(item, by_overflow: bool) -> bool:
    """The prompts the base is built to fail: overflowing sums where the task draws them, else two carries."""
    return item.meta["overflow"] == 1 if by_overflow else item.meta["carries"] == 2


def gate_landing(base, prior, tok, items, params: SamplingParams, tau: float, seed: int, by_overflow: bool,
                 budget: int = 4) -> dict:
    engine = HFEngine(base, tok)
    injection = PriorInjection(prior, gate="js", threshold=tau, mix_lambda=1.0, budget=budget, params=params,
                               seed=seed, pad_id=tok.pad_token_id)
    gen = engine.generate([encode_chat(tok, i.prompt) for i in items], params, seed=seed, intervention=injection)
    stats: dict[str, list[float]] = {"carry": [], "overflow": [], "on_track": [], "off_track": []}
    landed: Counter = Counter()
    carries_available = 0
    for row, item in enumerate(items):
        gold = scratchpad(item.meta["a"], item.meta["b"])
        ids = gen.response_ids[row][gen.response_mask[row] > 0].tolist()
        for t in range(len(ids)):
            prefix = tok.decode(ids[:t], skip_special_tokens=True)
            cls = position_class(prefix, gold, by_overflow and item.meta["overflow"] == 1)
            carries_available += cls == "carry"
            stats[cls].append(float(gen.token["eapo_gate_stat"][row, t]))
            if gen.token["injected_mask"][row, t] > 0:
                landed[cls] += 1
    tokens = int(gen.response_mask.sum())
    injected = int((gen.token["injected_mask"] * gen.response_mask).sum())
    verdicts = [extract_final(text) == i.answer for i, text in zip(items, gen.texts, strict=True)]
    correct = sum(verdicts)
    hard_ones = [v for v, i in zip(verdicts, items, strict=True) if hard(i, by_overflow)]
    quant = {k: [round(float(torch.quantile(torch.tensor(v), q)), 4) for q in (0.5, 0.9, 0.99)] if v else []
             for k, v in stats.items()}
    return {"tau": tau, "tokens": tokens, "injected_tokens": injected, "injected_token_frac": injected / tokens,
            "injected_rollouts_frac": float((gen.token["injected_mask"].sum(1) > 0).float().mean()),
            "landed": dict(landed), "landed_on_carry_frac": landed["carry"] / max(injected, 1),
            "landed_on_overflow_frac": landed["overflow"] / max(injected, 1),
            "carry_positions_seen": carries_available, "budget": budget,
            "accuracy_with_injection": correct / len(items),
            "accuracy_with_injection_hard": sum(hard_ones) / max(len(hard_ones), 1),
            "js_quantiles_50_90_99": quant, "raw": stats}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("config")
    ap.add_argument("--prior", required=True)
    ap.add_argument("--out")
    ap.add_argument("--tau-quantile", type=float, default=0.98,
                    help="tau = this quantile of JS over all tokens of the base's guided rollouts (lambda 0 pass)")
    ap.add_argument("--tau", type=float, help="a fixed tau instead of the quantile rule (both are reported)")
    ap.add_argument("--budgets", type=int, nargs="+", default=[4], help="injection budgets to try (lambda = 1)")
    ap.add_argument("--prompts", type=int, default=256)
    args = ap.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    cfg = load_config(args.config)
    task = make_task(cfg.task.name, **cfg.task.kwargs)
    items = task.val[: args.prompts]  # the selection split: never the report split
    by_overflow = getattr(task, "reports_overflow", False)
    base, tok = load_policy(cfg.model.name)
    prior, _ = load_policy(args.prior)
    sampled = SamplingParams(max_new_tokens=cfg.rollout.max_new_tokens, temperature=cfg.rollout.temperature)
    greedy = SamplingParams(max_new_tokens=cfg.rollout.max_new_tokens, greedy=True)
    report = {"selection_prompts": len(items), "features": task.features()["val"]}
    for name, model in (("base", base), ("prior", prior)):
        report[f"{name}_greedy"] = accuracy_by_carries(model, tok, items, greedy, seed=1, by_overflow=by_overflow)
        report[f"{name}_sampled"] = accuracy_by_carries(model, tok, items, sampled, seed=2, by_overflow=by_overflow)
    # the gate never fires: the JS statistic along the base's own rollouts
    probe = gate_landing(base, prior, tok, items, sampled, tau=float("inf"), seed=3, by_overflow=by_overflow)
    report["js_by_position_without_injection"] = probe["js_quantiles_50_90_99"]
    report["carry_positions_seen"] = probe["carry_positions_seen"]
    everything = torch.tensor([v for values in probe.pop("raw").values() for v in values])
    tau = round(float(torch.quantile(everything, args.tau_quantile)), 3)
    report["tau_rule"] = f"the {args.tau_quantile} quantile of JS over every token of the base's own rollouts"
    for key, value in (("gate_at_quantile_tau", tau), ("gate_at_fixed_tau", args.tau)):
        if value is None:
            continue
        for budget in args.budgets:
            landing = gate_landing(base, prior, tok, items, sampled, tau=value, seed=3, by_overflow=by_overflow,
                                   budget=budget)
            landing.pop("raw")
            report[f"{key}_budget{budget}"] = landing
    print(json.dumps(report, indent=2), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
