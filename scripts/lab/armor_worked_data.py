"""ARMOR on SmolLM2, design H's warm-start data: worked answers to reasoning-gym arithmetic, as ``sft.data=jsonl``.

Each line is ``{"prompt", "response"}``: the prompt exactly as the stage-1 config's task writes it (its
``prompt_template`` around the question), the response the left-to-right working, one operation at a time
(``Calculate 7 + 2 - 4.`` -> ``7 + 2 = 9, 9 - 4 = 5``: the last number is the answer, as ``extract: last_number``
reads it). The questions are drawn from the task's generator with another seed and never appear in the stage-1
config's train, selection (val) or report splits, so the warm start has seen none of the prompts RL trains or is
judged on.

    python scripts/lab/armor_worked_data.py configs/armor/smollm2/premise_worked.yaml \
        runs/armor/smollm2/worked_data.jsonl --examples 400
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from tether.config import load_config
from tether.files import write_jsonl
from tether.tasks import make_task
from tether.tasks.base import task_split
from tether.tasks.extract import format_prompt

DATA_SEED = 2**29  # far from the train (seed), val (2**30) and report (2**31) seeds the task draws with
TERM = re.compile(r"([+-])\s*(\d+)")


def working(question: str) -> str | None:
    """``a + b - c`` as ``a + b = s, s - c = t``; None for a question that is not a chain of + and -."""
    body = question.removeprefix("Calculate").strip().rstrip(".").strip()
    first = re.match(r"(\d+)", body)
    if first is None:
        return None
    total, rest, steps = int(first.group(1)), body[first.end():], []
    for sign, number in TERM.findall(rest):
        new = total + int(number) if sign == "+" else total - int(number)
        steps.append(f"{total} {sign} {number} = {new}")
        total = new
    if not steps or TERM.sub("", rest).strip():
        return None
    return ", ".join(steps)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("config", help="the stage-1 train config (its task's splits are excluded)")
    p.add_argument("out", type=Path)
    p.add_argument("--examples", type=int, default=400)
    args = p.parse_args()
    cfg = load_config(args.config)
    kwargs = dict(cfg.task.kwargs)
    task = make_task(cfg.task.name, seed=cfg.seed, **kwargs)
    taken = {item.meta["question"] for split in ("train", "val", "report") for item in task_split(task, split)}
    pool = make_task(cfg.task.name, seed=DATA_SEED, **{**kwargs, "train_size": 8 * args.examples, "report_size": 0})
    rows, seen = [], set()
    for item in pool.train:
        question = item.meta["question"]
        response = working(question)
        if question in taken or question in seen or response is None:
            continue
        assert int(response.rsplit("=", 1)[1]) == int(float(item.answer)), (question, response, item.answer)
        seen.add(question)
        rows.append({"prompt": format_prompt(kwargs["prompt_template"], question), "response": response})
        if len(rows) == args.examples:
            break
    if len(rows) < args.examples:
        raise SystemExit(f"only {len(rows)} usable questions outside the config's splits; ask for fewer")
    write_jsonl(args.out, rows)
    print(f"wrote {len(rows)} worked examples to {args.out}; e.g. {rows[0]}")


if __name__ == "__main__":
    main()
