"""Cost as responses grow: tether and TRL, each alone in its own process, at several completion budgets.

    bash benchmarks/setup_trl.sh                      # once: benchmarks/.venv-trl with TRL and tether
    benchmarks/.venv-trl/bin/python benchmarks/bench_lengths.py --steps 3 --warmup 1 \\
        --tether-override optim.max_tokens_per_micro_batch=1024 \
        --tether-override train.gradient_checkpointing=true            # `make bench`

For each ``--max-new-tokens`` budget (default 24, 96 and 256) the script runs ``bench_trl.py --only tether`` and
then ``bench_trl.py --only trl`` (the quickstart's task and sizes, every setting matched as docs/benchmarks.md
lists), each in a fresh child process, and reads that child's peak resident set from the operating system
(``os.wait4``: ``ru_maxrss``, model loading, sampling, scoring and updates together). One table gives each
trainer's median seconds per RL step, their ratio (TRL / tether: > 1 means tether is faster), the peak memory of
each and the tokens sampled per step; one JSON file (``--out``, default
``benchmarks/results/<date>-lengths.json``, rewritten after every cell) keeps the table, every child's own
results and the load average. ``--only tether`` runs tether's cells alone (tether's own ``.venv`` suffices).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
BENCH_TRL = Path(__file__).resolve().parent / "bench_trl.py"
RESULTS = Path(__file__).resolve().parent / "results"
TRAINERS = ("tether", "trl")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--max-new-tokens", type=int, nargs="+", default=[24, 96, 256], help="completion budgets")
    p.add_argument("--steps", type=int, default=3, help="timed RL steps per cell (default 3)")
    p.add_argument("--warmup", type=int, default=1, help="untimed RL steps per cell before them (default 1)")
    p.add_argument("--prompts-per-step", type=int, default=None, help="default: the quickstart's (4)")
    p.add_argument("--group-size", type=int, default=None, help="default: the quickstart's (8)")
    p.add_argument("--threads", type=int, default=2, help="torch CPU threads (default 2)")
    p.add_argument("--tether-override", action="append", default=[], metavar="KEY=VALUE",
                   help="a tether config override (repeatable), e.g. optim.max_tokens_per_micro_batch=1024")
    p.add_argument("--only", choices=TRAINERS, default=None, help="run one trainer's cells only")
    p.add_argument("--out", type=Path, default=None, help="default: benchmarks/results/<date>-lengths.json")
    return p.parse_args(argv)


def child_command(args: argparse.Namespace, trainer: str, tokens: int, out: Path) -> list[str]:
    cmd = [sys.executable, str(BENCH_TRL), "--only", trainer, "--max-new-tokens", str(tokens),
           "--steps", str(args.steps), "--warmup", str(args.warmup), "--threads", str(args.threads), "--out", str(out)]
    for flag in ("prompts_per_step", "group_size"):
        if getattr(args, flag) is not None:
            cmd += [f"--{flag.replace('_', '-')}", str(getattr(args, flag))]
    for override in args.tether_override:
        cmd += ["--tether-override", override]
    return cmd


def run_cell(cmd: list[str]) -> tuple[float, int]:
    """Run one child to its end, its output passed through; its peak resident set in GiB and its exit status.

    ``os.wait4`` gives the rusage of that child alone, where ``RUSAGE_CHILDREN`` would be the maximum over every
    child this process has waited for.
    """
    proc = subprocess.Popen(cmd, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    _, status, usage = os.wait4(proc.pid, 0)
    return usage.ru_maxrss / 2**20, os.waitstatus_to_exitcode(status)  # Linux reports kilobytes


def failure(code: int) -> str:
    """A failed cell's entry: a child the kernel killed (SIGKILL) here is the out-of-memory killer's work, which a
    sweep over lengths exists to find, so the sweep records it and goes on."""
    return f"exit status {code}" + (" (SIGKILL: out of memory)" if code == -9 else "")


def table_rows(cells: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per completion budget: each trainer's median s/step, peak GiB and tokens/step, and the ratio."""
    rows = []
    for tokens in dict.fromkeys(c["max_new_tokens"] for c in cells):
        row: dict[str, Any] = {"max_new_tokens": tokens}
        for c in cells:
            if c["max_new_tokens"] == tokens:
                name = c["trainer"]
                row[f"{name}_peak_gb"] = c["peak_rss_gb"]
                if "failed" in c:
                    row[f"{name}_failed"] = c["failed"]
                else:
                    row.update({f"{name}_step_s": c["step_s"], f"{name}_tokens": c["tokens"]})
        if "tether_step_s" in row and "trl_step_s" in row:
            row["trl_over_tether"] = row["trl_step_s"] / row["tether_step_s"]
        rows.append(row)
    return rows


def format_table(rows: list[dict[str, Any]]) -> str:
    columns = [("new tokens", "max_new_tokens", "{}"), ("tether s/step", "tether_step_s", "{:.2f}"),
               ("TRL s/step", "trl_step_s", "{:.2f}"), ("TRL/tether", "trl_over_tether", "{:.2f}"),
               ("tether peak GB", "tether_peak_gb", "{:.2f}"), ("TRL peak GB", "trl_peak_gb", "{:.2f}"),
               ("tether tok/step", "tether_tokens", "{:.0f}"), ("TRL tok/step", "trl_tokens", "{:.0f}")]
    lines = ["| " + " | ".join(label for label, _, _ in columns) + " |", "|" + "---|" * len(columns)]
    for row in rows:
        cells = [fmt.format(row[key]) if key in row else _missing(row, key) for _, key, fmt in columns]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _missing(row: dict[str, Any], key: str) -> str:
    trainer = key.split("_", 1)[0]
    return f"failed: {row[f'{trainer}_failed']}" if key.endswith("step_s") and f"{trainer}_failed" in row else "-"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    out = args.out or RESULTS / f"{dt.date.today().isoformat()}-lengths.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    trainers = [args.only] if args.only else list(TRAINERS)
    load_start = os.getloadavg()[0]
    result: dict[str, Any] = {"date": dt.datetime.now().isoformat(timespec="seconds"),
                              "command": " ".join([Path(sys.executable).name, *sys.argv]),
                              "settings": vars(args) | {"out": str(out)}, "cells": []}
    with tempfile.TemporaryDirectory(prefix="tether-lengths-") as work:
        for tokens in args.max_new_tokens:
            for trainer in trainers:
                child_out = Path(work) / f"{tokens}-{trainer}.json"
                cmd = child_command(args, trainer, tokens, child_out)
                peak, code = run_cell(cmd)
                cell: dict[str, Any] = {"max_new_tokens": tokens, "trainer": trainer, "peak_rss_gb": peak}
                if code:
                    cell["failed"] = failure(code)
                    print(f"{' '.join(cmd)} failed with {cell['failed']}; the sweep goes on", file=sys.stderr)
                else:
                    child = json.loads(child_out.read_text())
                    cell.update({k: child["summary"][trainer][k] for k in ("step_s", "tokens")}, child=child)
                result["cells"].append(cell)
                result["rows"] = table_rows(result["cells"])
                result["load_average"] = [load_start, os.getloadavg()[0]]
                # written after every cell: a long sweep stopped early keeps what it measured
                out.write_text(json.dumps(result, indent=2) + "\n")
    print("\n" + format_table(result["rows"]))
    print(f"\nwrote {out}; load average {load_start:.1f} -> {os.getloadavg()[0]:.1f}")
    return result


if __name__ == "__main__":
    main()
