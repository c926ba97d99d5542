"""Behaviour guard for refactors: short runs on tiny random models, printed as SHA-256 digests.

Each run goes through the CLI in its own process (``tether ...``) and is summarised by two digests: its
``metrics.jsonl`` with the timing fields (``perf/*``) removed, and its final weights (every tensor of the
safetensors files, by name). A refactor that claims to keep behaviour must print the same lines before and after::

    python scripts/dev/behaviour_guard.py > before.txt   # on the unmodified branch
    python scripts/dev/behaviour_guard.py > after.txt
    diff before.txt after.txt

Lines prefixed ``eval`` digest ``tether eval``'s printed metrics (what a change of eval's seeds moves). Runs take
a few minutes on two CPU cores; ``--only NAME`` runs one.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TINY = "tiny-64x2"  # tether.models.loading.tiny_model_dir: a random Llama with the SmolLM2 tokenizer, cached
QUIET = ["logging.tensorboard=false", "logging.progress=false"]
PARITY = ["task.name=parity", "task.kwargs={}"]  # the built-in toy task: rewards vary on random weights

# name -> (command, config, overrides). The run directory is appended as run_dir=...
RUNS: dict[str, tuple[str, str, list[str]]] = {
    "quickstart": ("train", "configs/quickstart.yaml", [
        f"model.name={TINY}", *PARITY, "rollout.prompts_per_step=2", "rollout.group_size=4",
        "rollout.max_new_tokens=6", "optim.micro_batch_size=8", "optim.lr=1e-3", "val.every=2", "val.samples=2",
        "train.steps=4", "train.save_every=2"]),
    "agent_grpo": ("train", "configs/agents/frozenlake_grpo.yaml", [
        f"model.name={TINY}", "env.max_turns=3", "env.train_tasks=8", "env.val_tasks=2",
        "rollout.prompts_per_step=2", "rollout.group_size=3", "rollout.max_new_tokens=8", "optim.lr=1e-3",
        "val.every=2", "train.steps=3", "train.save_every=0"]),
    "armor_reset": ("train", "configs/armor/tiny/armor_reset.yaml", [
        f"model.name={TINY}", *PARITY, "rollout.prompts_per_step=2", "rollout.group_size=4",
        "rollout.gen_batch_prompts=2", "rollout.max_new_tokens=4", "rollout.overlong.enabled=false",
        "optim.micro_batch_size=16", "optim.lr=1e-3", "val.every=2", "val.samples=2", "train.steps=4",
        "train.save_every=0", "methods.armor.tau=2"]),
    "eapo": ("train", "configs/eapo/eapo_token.yaml", [
        f"model.name={TINY}", *PARITY, "methods.eapo.prior=tiny-64x1", "rollout.prompts_per_step=2",
        "rollout.group_size=4", "rollout.max_new_tokens=6", "optim.micro_batch_size=8", "optim.lr=1e-3",
        "val.every=2", "val.samples=2", "train.steps=3", "train.save_every=0"]),
    "seed": ("train", "configs/seed/thin_ice/seed.yaml", [
        f"model.name={TINY}", "env.max_turns=3", "env.train_tasks=8", "env.val_tasks=2",
        "rollout.prompts_per_step=2", "rollout.group_size=3", "rollout.max_new_tokens=8", "optim.lr=1e-3",
        "methods.seed.analysis_max_new_tokens=16", "methods.seed.analysis_context_length=2048",
        "val.every=2", "train.steps=3", "train.save_every=0"]),
    "opsd": ("train", "configs/seed/thin_ice/grpo_opsd.yaml", [
        f"model.name={TINY}", "env.max_turns=3", "env.train_tasks=8", "env.val_tasks=2",
        "rollout.prompts_per_step=2", "rollout.group_size=3", "rollout.max_new_tokens=8", "optim.lr=1e-3",
        "val.every=2", "train.steps=3", "train.save_every=0"]),
    "sft": ("sft", "configs/agents/frozenlake_sft.yaml", [
        f"model.name={TINY}", "env.train_tasks=8", "env.val_tasks=2", "sft.examples=null", "sft.epochs=1",
        "sft.batch_size=8", "sft.micro_batch_size=8", "sft.lr=1e-3", "sft.val_fraction=0.2", "sft.max_steps=3"]),
    "seed_sft": ("seed-sft", "configs/seed/sft.yaml", [
        f"model.name={TINY}", "env.max_turns=3", "env.train_tasks=8", "env.val_tasks=2",
        "rollout.max_new_tokens=8", "methods.seed.analysis_max_new_tokens=16", "sft.tasks=2",
        "sft.rollouts_per_task=2", "sft.epochs=1", "sft.batch_size=4", "sft.micro_batch_size=4", "sft.lr=1e-3",
        "sft.max_length=2048", "sft.eval_examples=1"]),
}
EVALS = {"quickstart": "checkpoints/step_000004", "agent_grpo": "checkpoints/step_000003"}


def metrics_digest(path: Path) -> str:
    """SHA-256 of metrics.jsonl with the timing fields (``perf/*``, and seconds: ``*_s``) left out."""
    lines = []
    for line in path.read_text().splitlines():
        row = json.loads(line)
        lines.append(json.dumps({k: v for k, v in row.items() if not k.startswith("perf/") and not k.endswith("_s")},
                                sort_keys=True))
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()


def weights_digest(run_dir: Path) -> str:
    """SHA-256 over every tensor of the run's newest safetensors files (the final weights), by tensor name."""
    from safetensors.torch import load_file

    files = sorted(run_dir.rglob("*.safetensors"), key=lambda p: (p.stat().st_mtime_ns, str(p)))
    if not files:
        return "no-weights"
    newest = files[-1].parent
    h = hashlib.sha256()
    for f in sorted(newest.glob("*.safetensors")):
        for name, tensor in sorted(load_file(f).items()):
            h.update(name.encode())
            h.update(tensor.float().contiguous().numpy().tobytes())
    return f"{h.hexdigest()} ({newest.relative_to(run_dir)})"


def tether(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    cli = [sys.executable, "-c", "from tether.cli import app; app()"]
    return subprocess.run([*cli, *args], cwd=ROOT, env=env, capture_output=True, text=True, check=False)


def run(name: str, work: Path) -> list[str]:
    command, config, overrides = RUNS[name]
    run_dir = work / name
    done = tether(command, config, *overrides, *([] if command == "seed-sft" else QUIET), f"run_dir={run_dir}")
    if done.returncode != 0:
        return [f"{name} FAILED rc={done.returncode}: {done.stderr.strip().splitlines()[-1:]}"]
    metrics = next(iter(sorted(run_dir.rglob("metrics.jsonl"))), None)
    out = [f"{name} metrics {metrics_digest(metrics) if metrics else 'none'}",
           f"{name} weights {weights_digest(run_dir)}"]
    if name in EVALS:
        ev = tether("eval", str(run_dir / EVALS[name]))
        result = ev.stdout if ev.returncode == 0 else f"FAILED {ev.stderr.strip().splitlines()[-1:]}"
        out.append(f"eval {name} {hashlib.sha256(result.encode()).hexdigest()} {' '.join(result.split())}")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", action="append", choices=sorted(RUNS), help="run only this one (repeatable)")
    parser.add_argument("--keep", type=Path, help="keep the run directories here")
    args = parser.parse_args()
    names = args.only or list(RUNS)
    with tempfile.TemporaryDirectory() as tmp:
        work = args.keep or Path(tmp)
        for name in names:
            for line in run(name, work):
                print(line, flush=True)


if __name__ == "__main__":
    main()
