"""SEED lab study (issue #21): how well a warm start fits the one decisive character of its SFT labels.

    python scripts/lab/seed_decision_fit.py CHECKPOINT RECORDS.jsonl [--records 300]

A thin-ice response is ``<action>down</action>``: every character but the first of the action word is fixed by
the format, so a per-token SFT loss near 0 can hide a decision the model has not learnt. This reads, over a random
sample of records, the negative log-likelihood of the decisive character (the one after ``<action>``) and whether
greedy decoding picks it, split by whether the prompt carries a skill and whether the record is a fork pair
(``meta.fork``, :func:`tether.lab.skill_data.fork_pair_records`). Chance between two moves is
ln 2 = 0.693 nats.
"""

from __future__ import annotations

import argparse
import json
import random
from typing import Any

import torch

from tether.lab.skill_data import response_text
from tether.models import encode_chat, load_policy

DECISIVE = len("<action>")


@torch.no_grad()
def decision(model: Any, tok: Any, record: dict[str, Any]) -> tuple[float, bool]:
    """NLL of the decisive character of ``record``'s response, and whether it is the greedy choice."""
    prompt = encode_chat(tok, record["prompt"])
    response = tok(record["response"], add_special_tokens=False).input_ids
    logits = model(torch.tensor([prompt + response])).logits[0, len(prompt) - 1 + DECISIVE].float()
    target = response[DECISIVE]
    return -float(torch.log_softmax(logits, -1)[target]), int(logits.argmax()) == target


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("checkpoint")
    ap.add_argument("records")
    ap.add_argument("--records", dest="n", type=int, default=300)
    args = ap.parse_args()
    torch.set_num_threads(1)
    model, tok = load_policy(args.checkpoint)
    model.eval()
    with open(args.records) as f:
        records = [json.loads(line) for line in f]
    other = next((i for i, r in enumerate(records, 1)
                  if r.get("response") != response_text(r.get("meta", {}).get("action", ""))), None)
    if other is not None:
        raise SystemExit(f"{args.records} line {other}: not a thin-ice action record (its response must be "
                         "<action>MOVE</action> for meta.action; see tether/lab/skill_data.py)")
    random.Random(0).shuffle(records)
    groups: dict[str, list[tuple[float, bool]]] = {}
    for r in records[: args.n]:
        kind = ("fork, " if r["meta"].get("fork") else "") + ("skill" if r["meta"]["skill"] else "no skill")
        groups.setdefault(kind, []).append(decision(model, tok, r))
    out = {kind: {"records": len(v), "decisive_nll": sum(x[0] for x in v) / len(v),
                  "greedy_accuracy": sum(x[1] for x in v) / len(v)} for kind, v in sorted(groups.items())}
    print(json.dumps({"checkpoint": args.checkpoint, "records": args.records, "groups": out}, indent=2))


if __name__ == "__main__":
    main()
