"""Peak memory of the trainer's loss pass as the LM-head chunk changes (``train.logprob_chunk_tokens``).

    .venv/bin/python benchmarks/bench_logprob_chunks.py --rows 8 --new-tokens 256 --chunks full 2048 1024 256 \
        --checkpoint-layers

One forward with gradient (log-probs and entropy of every response token, as the update's forward) and its
backward, on SmolLM2-135M (49,152-token vocabulary) in float32, each cell in a fresh child process: the peak
resident set (``ru_maxrss``) is a high-water mark of the whole process. The number reported is the peak of the pass
above the process's peak after loading the model and building the batch. ``full`` is the full-logits path (the
``[rows, tokens, vocab]`` logits of one ``model(...)`` call, what an unknown architecture runs); a number is the
chunk in response tokens across rows. ``--checkpoint-layers`` recomputes the decoder layers in backward, as the
trainer does for a micro-batch this large, so that the decoder's activations (5 GB here without it) do not hide the
logits. Results go to ``--out`` as JSON, with the CPU's flags.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tether.engine.hf import speed_flags

RESULTS = Path(__file__).resolve().parent / "results"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=8, help="rows of the micro-batch (default 8)")
    p.add_argument("--prompt-tokens", type=int, default=64, help="prompt length (default 64)")
    p.add_argument("--new-tokens", type=int, default=256, help="response length (default 256)")
    p.add_argument("--chunks", nargs="+", default=["full", "2048", "1024", "256"],
                   help="cells: full, or a chunk in tokens")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--checkpoint-layers", action="store_true",
                   help="recompute each decoder layer in backward, as train.gradient_checkpointing=auto does for a "
                   "micro-batch this large: the decoder's activations then no longer hide the logits")
    p.add_argument("--out", type=Path, default=None, help="default: benchmarks/results/<date>-logprob-chunks.json")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports kilobytes


def run_cell(cell: dict[str, Any]) -> dict[str, Any]:
    import torch

    from tether.models import forward, load_policy, smollm2_dir
    from tether.models.forward import response_log_probs
    from tether.models.layers import checkpoint_layers

    torch.set_num_threads(cell["threads"])
    model, _ = load_policy(str(smollm2_dir()), dtype=torch.float32)
    model.eval()
    if cell.get("checkpoint_layers"):
        checkpoint_layers(model)
    g = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size
    prompts = [torch.randint(0, vocab, (cell["prompt_tokens"],), generator=g).tolist() for _ in range(cell["rows"])]
    ids = torch.randint(0, vocab, (cell["rows"], cell["new_tokens"]), generator=g)
    mask = torch.ones(cell["rows"], cell["new_tokens"])
    chunk = cell["chunk"]
    if chunk == "full":
        forward.PLAIN_HEAD_MODEL_TYPES = frozenset()  # this child process only: the full-logits path
        chunk_size = cell["new_tokens"]
    else:
        chunk_size = int(chunk)
    base = peak_rss_mb()
    start = time.perf_counter()
    lp, ent = response_log_probs(model, prompts, ids, mask, with_entropy=True, chunk_size=chunk_size,
                                 pack=False)
    (lp.sum() + 0.01 * ent.sum()).backward()
    seconds = time.perf_counter() - start
    return {"chunk": chunk, "pass_peak_mb": peak_rss_mb() - base, "process_peak_mb": peak_rss_mb(),
            "seconds": seconds, "logits_mb_one_call": (cell["rows"] * cell["new_tokens"] if chunk == "full"
                                                       else min(chunk_size, cell["rows"] * cell["new_tokens"]))
            * vocab * 4 / 2**20}



def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.child is not None:
        print(json.dumps(run_cell(json.loads(args.child))))
        return
    rows = []
    for chunk in args.chunks:
        cell = {"chunk": chunk, "rows": args.rows, "prompt_tokens": args.prompt_tokens,
                "new_tokens": args.new_tokens, "threads": args.threads, "checkpoint_layers": args.checkpoint_layers}
        env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
        out = subprocess.run([sys.executable, __file__, "--child", json.dumps(cell)], check=True, env=env,
                             capture_output=True, text=True).stdout
        rows.append(json.loads(out.strip().splitlines()[-1]))
        r = rows[-1]
        print(f"chunk {r['chunk']:>5}: pass peak {r['pass_peak_mb']:7.0f} MB (one call's logits "
              f"{r['logits_mb_one_call']:6.0f} MB), {r['seconds']:.1f} s", flush=True)
    out_path = args.out or RESULTS / f"{dt.date.today()}-logprob-chunks.json"
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps({"rows": args.rows, "prompt_tokens": args.prompt_tokens,
                                    "new_tokens": args.new_tokens, "threads": args.threads,
                                    "checkpoint_layers": args.checkpoint_layers,
                                    "cpu_flags": speed_flags(), "cells": rows}, indent=2))
    print(f"wrote {out_path}")


if __name__ == "__main__":
    main()
