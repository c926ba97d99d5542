"""Decoding speed of the in-process engine: generated tokens per second, variants alternated in one process.

    .venv/bin/python benchmarks/bench_decode.py --batch 32 --new-tokens 32 --rounds 3 \\
        --variant main=ref:main --variant now=

A variant is ``NAME=SETTINGS``: comma-separated ``key=value`` keyword arguments of ``HFEngine`` (``cache=static``,
``compact_below=0``, ``bf16_autocast=true``) plus ``dtype=bfloat16`` (the variant decodes with a copy of the
weights in that dtype), and ``ref:REV`` loads the engine module as it was at git revision
``REV`` (the "before" of a change). Each round runs every variant once, in turn, on the same prompts and seed, so a
machine whose load drifts slows all of them alike; the ratios between variants, not the seconds, are the result.
Rates are generated tokens over wall-clock and over this process's CPU time; ratios are medians over rounds of each
round's ratio to the first variant. ``--eos`` ends rows at EOS (chat
prompts, uneven lengths: the long tail); without it every row decodes exactly ``--new-tokens``. JSON goes to
``--out`` (default ``benchmarks/results/<date>-decode.json``).
"""

from __future__ import annotations

import argparse
import copy
import datetime as dt
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).resolve().parent / "results"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2-135m-instruct",
                   help="tether model alias or path, or random:ARCH (scripts/gpu_smoke.py's random weights)")
    p.add_argument("--batch", type=int, default=32, help="rows per generate call (default 32)")
    p.add_argument("--new-tokens", type=int, default=32, help="max new tokens per row (default 32)")
    p.add_argument("--prompt-tokens", type=int, default=64, help="random prompt tokens per row without --eos")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    p.add_argument("--rounds", type=int, default=3, help="timed rounds; each runs every variant once (default 3)")
    p.add_argument("--eos", action="store_true", help="chat prompts, rows end at EOS (uneven lengths)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--variant", action="append", default=None, help="NAME=SETTINGS (see above); default now=")
    p.add_argument("--accuracy", default=None, metavar="DTYPE",
                   help="also compare the model in DTYPE (bfloat16) with float32: log-prob differences on the "
                        "float32 greedy responses, and greedy-token agreement")
    p.add_argument("--out", type=Path, default=None, help="JSON results file")
    return p.parse_args(argv)


def parse_settings(text: str) -> dict[str, Any]:
    """``a=1,b=static,c=true`` -> keyword arguments (ints, floats and booleans converted)."""
    out: dict[str, Any] = {}
    for item in filter(None, text.split(",")):
        key, _, value = item.partition("=")
        out[key] = json.loads(value) if value in ("true", "false") or value.replace(".", "", 1).isdigit() else value
    return out


def module_from(path: Path) -> Any:
    """Import the Python file at ``path`` as a module of its own."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def engine_class_at(rev: str) -> type:
    """``HFEngine`` as ``tether/engine/hf.py`` was at git revision ``rev`` (it imports today's other modules)."""
    source = subprocess.run(["git", "-C", str(REPO), "show", f"{rev}:tether/engine/hf.py"], check=True,
                            capture_output=True, text=True).stdout
    path = Path(tempfile.mkdtemp()) / f"hf_at_{rev.replace('/', '_')}.py"
    path.write_text(source)
    return module_from(path).HFEngine


def build_variant(spec: str, model: Any, tokenizer: Any, eos: bool) -> tuple[str, Any]:
    from tether.engine import HFEngine

    name, _, settings = spec.partition("=")
    cls = HFEngine
    if settings.startswith("ref:"):
        rev, _, settings = settings[4:].partition(",")
        cls = engine_class_at(rev)
    kwargs = parse_settings(settings)
    if "dtype" in kwargs:
        model = copy.deepcopy(model).to(getattr(torch, kwargs.pop("dtype")))
    if not eos:
        kwargs["eos_token_ids"] = []
    return name, cls(model, tokenizer, **kwargs)


def make_prompts(args: argparse.Namespace, tokenizer: Any) -> list[list[int]]:
    from tether.models import encode_chat

    if args.eos:
        return [encode_chat(tokenizer, f"What is {i} + {3 * i + 7}? Explain briefly.") for i in range(args.batch)]
    g = torch.Generator().manual_seed(0)
    return torch.randint(100, 20000, (args.batch, args.prompt_tokens), generator=g).tolist()


def load(name: str, device: str) -> tuple[Any, Any]:
    from tether.models import load_policy, tiny_model

    if name.startswith("random:"):
        shapes = module_from(REPO / "scripts" / "gpu_smoke.py").ARCHITECTURES
        model, tokenizer = tiny_model(seed=0, **shapes[name.removeprefix("random:")])
    else:
        model, tokenizer = load_policy(name)
    return model.to(device).eval(), tokenizer


def ready_variants(specs: list[str], model: Any, tokenizer: Any, args: argparse.Namespace,
                   prompts: list[list[int]]) -> tuple[dict[str, Any], dict[str, str]]:
    """The variants that build and run a warm-up call (first-call allocations, lazy imports, compilation),
    and the error of each that does not: one failing variant (a compiler missing) leaves the others' numbers."""
    from tether.engine import SamplingParams

    ready, failed = {}, {}
    warm_tokens = args.new_tokens if args.device.startswith("cuda") else 2  # a GPU compiles for the timed shapes
    for spec in specs:
        try:
            name, engine = build_variant(spec, model, tokenizer, args.eos)
            engine.generate(prompts, SamplingParams(max_new_tokens=warm_tokens, temperature=1.0), seed=1)
            ready[name] = engine
        except Exception as e:  # reported in the output and the JSON
            failed[spec] = f"{type(e).__name__}: {e}"
            print(f"variant {spec} failed: {failed[spec]}", flush=True)
    return ready, failed


def time_call(engine: Any, prompts: list[list[int]], params: Any, device: str) -> dict[str, float]:
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    wall, cpu = time.perf_counter(), time.process_time()
    gen = engine.generate(prompts, params, seed=0)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    tokens = float(gen.response_mask.sum())
    return {"wall_s": wall, "cpu_s": cpu, "tokens": tokens, "tokens_per_s": tokens / wall,
            "tokens_per_cpu_s": tokens / cpu}


def dtype_accuracy(model: Any, tokenizer: Any, prompts: list[list[int]], new_tokens: int,
                   dtype: str) -> dict[str, float]:
    """How far decoding with the weights in ``dtype`` is from float32: on the float32 greedy responses, the
    absolute differences of the per-token log-probs (``score``), and the fraction of positions where greedy
    decoding in ``dtype`` picks the float32 token (up to each row's first disagreement, and after it)."""
    from tether.engine import HFEngine, SamplingParams

    greedy = SamplingParams(max_new_tokens=new_tokens, greedy=True)
    ref = HFEngine(model, tokenizer, eos_token_ids=[])
    low = HFEngine(copy.deepcopy(model).to(getattr(torch, dtype)), tokenizer, eos_token_ids=[])
    gen = ref.generate(prompts, greedy)
    diff = (low.score(prompts, gen.response_ids, gen.response_mask) - gen.sample_log_probs).abs()
    same = low.generate(prompts, greedy).response_ids == gen.response_ids
    return {"log_prob_abs_diff_mean": float(diff.mean()), "log_prob_abs_diff_max": float(diff.max()),
            "greedy_agreement": float(same.float().mean()),
            "tokens_before_first_disagreement_mean": float(same.long().cumprod(1).sum(1).float().mean())}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    from tether.engine import SamplingParams

    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    model, tokenizer = load(args.model, args.device)
    prompts = make_prompts(args, tokenizer)
    variants, failed = ready_variants(args.variant or ["now="], model, tokenizer, args, prompts)
    if not variants:
        raise SystemExit("no variant ran")
    params = SamplingParams(max_new_tokens=args.new_tokens, temperature=1.0)
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in variants}
    load_before = os.getloadavg()
    for r in range(args.rounds):
        for name, engine in variants.items():
            runs[name].append(time_call(engine, prompts, params, args.device))
            print(f"round {r} {name}: {runs[name][-1]['tokens_per_s']:.1f} tokens/s "
                  f"({runs[name][-1]['tokens_per_cpu_s']:.1f} per CPU s)", flush=True)
    first = next(iter(variants))
    summary = {name: {"median_tokens_per_s": statistics.median(x["tokens_per_s"] for x in rs),
                      "median_tokens_per_cpu_s": statistics.median(x["tokens_per_cpu_s"] for x in rs),
                      "ratio_to_first": statistics.median(x["tokens_per_s"] / y["tokens_per_s"]
                                                          for x, y in zip(rs, runs[first], strict=True)),
                      "cpu_ratio_to_first": statistics.median(x["tokens_per_cpu_s"] / y["tokens_per_cpu_s"]
                                                              for x, y in zip(rs, runs[first], strict=True))}
               for name, rs in runs.items()}
    result = {"date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"), "argv": sys.argv[1:],
              "model": args.model, "device": args.device, "batch": args.batch, "new_tokens": args.new_tokens,
              "threads": args.threads, "eos": args.eos, "load_average": [load_before, os.getloadavg()],
              "summary": summary, "failed": failed, "runs": runs}
    if args.accuracy:
        result["accuracy"] = dtype_accuracy(model, tokenizer, prompts, args.new_tokens, args.accuracy)
        print(f"{args.accuracy} vs float32: {result['accuracy']}")
    for name, s in summary.items():
        print(f"{name}: {s['median_tokens_per_s']:.1f} tokens/s, {s['median_tokens_per_cpu_s']:.1f} per CPU s, "
              f"x{s['ratio_to_first']:.2f} vs {first} (per CPU s x{s['cpu_ratio_to_first']:.2f})")
    out = args.out or RESULTS / f"{dt.date.today().isoformat()}-decode.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    main()
