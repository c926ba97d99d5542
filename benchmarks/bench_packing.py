"""Rows packed by prompt against right-padded rows: the trainer's loss pass, side by side in one process.

    .venv/bin/python benchmarks/bench_packing.py --reps 5

One forward with gradient (log-probs and entropy of every response token, as the update's forward) and its
backward, on SmolLM2-135M in float32, for a GRPO-shaped micro-batch: ``--prompts`` distinct prompts of
``--prompt-tokens`` tokens, ``--group`` rows each, response lengths drawn uniformly from ``--min-new`` to
``--max-new`` tokens (the quickstart's shape by default: 4 x 8 rows, 43-token prompts, responses up to 24 tokens).
``packed`` is :func:`tether.models.forward.pack_rows` (the default), ``padded`` is ``pack=False`` (each row
``[prompt | response]`` right-padded, what a trainer without packing runs). The two alternate, ``--reps`` times
each after one warm-up each, so a load on the machine falls on both; the ratio of medians is the result. Results
go to ``--out`` as JSON, with the CPU's flags.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import time
from pathlib import Path

import torch

from tether.engine.hf import speed_flags

RESULTS = Path(__file__).resolve().parent / "results"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--prompts", type=int, default=4, help="distinct prompts (default 4)")
    p.add_argument("--group", type=int, default=8, help="rows per prompt (default 8)")
    p.add_argument("--prompt-tokens", type=int, default=43, help="prompt length (default 43, the quickstart's)")
    p.add_argument("--min-new", type=int, default=4, help="shortest response (default 4)")
    p.add_argument("--max-new", type=int, default=24, help="longest response (default 24)")
    p.add_argument("--reps", type=int, default=5, help="timed passes of each (default 5)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", type=Path, default=None, help="default: benchmarks/results/<date>-packing.json")
    return p.parse_args(argv)


def batch(args: argparse.Namespace, vocab: int) -> tuple[list[list[int]], torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, vocab, (args.prompt_tokens,), generator=g).tolist() for _ in range(args.prompts)]
    rows = args.prompts * args.group
    lengths = torch.randint(args.min_new, args.max_new + 1, (rows,), generator=g)
    ids = torch.randint(0, vocab, (rows, args.max_new), generator=g)
    mask = (torch.arange(args.max_new)[None] < lengths[:, None]).float()
    return [p for p in prompts for _ in range(args.group)], ids, mask


def main(argv: list[str] | None = None) -> None:
    from tether.models import load_policy, smollm2_dir
    from tether.models.forward import response_log_probs

    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    model, _ = load_policy(str(smollm2_dir()), dtype=torch.float32)
    model.eval()
    prompt_ids, ids, mask = batch(args, model.config.vocab_size)

    def timed(pack: bool) -> float:
        model.zero_grad(set_to_none=True)
        start = time.perf_counter()
        lp, ent = response_log_probs(model, prompt_ids, ids, mask, with_entropy=True, pack=pack)
        (lp.sum() + 0.01 * ent.sum()).backward()
        return time.perf_counter() - start

    seconds: dict[str, list[float]] = {"packed": [], "padded": []}
    timed(True), timed(False)  # warm-up
    for _ in range(args.reps):
        for name, pack in (("packed", True), ("padded", False)):
            seconds[name].append(timed(pack))
    median = {name: statistics.median(s) for name, s in seconds.items()}
    ratio = median["padded"] / median["packed"]
    print(f"{len(prompt_ids)} rows, {int(mask.sum())} response tokens: packed {median['packed']:.2f} s, "
          f"padded {median['padded']:.2f} s per forward + backward: {ratio:.2f}x")
    out = args.out or RESULTS / f"{dt.date.today()}-packing.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"date": dt.datetime.now().isoformat(timespec="seconds"), "settings": vars(args) | {
        "out": str(out)}, "response_tokens": int(mask.sum()), "seconds": seconds, "median_s": median,
        "padded_over_packed": ratio, "torch": torch.__version__, "cpu_flags": speed_flags()}, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
