"""What the LM head's written-out backward (tether.models.head) saves: the head alone, and the whole update.

    .venv/bin/python benchmarks/bench_head.py --reps 6 --threads 2 [--ignore-eos] [bench_trl.py's flags]

The quickstart's trainer as ``bench_trl.py`` builds it samples one batch, scores it and makes its advantages.

1. **The head alone**, on that batch's response-token count: SmolLM2's head over random hidden states, forward
   and backward of log-probs and entropies (the loss pass), in three modes, alternating: ``autograd`` (the chunk
   through ``nn.Linear``, ``logsumexp``, ``gather`` and ``softmax``, checkpointed: tether before), ``recomputed``
   and ``kept`` (:func:`tether.models.head.linear_log_probs` recomputing or keeping the logits).
2. **The whole update** of that batch, from the same restored weights and AdamW state each time
   (``bench_checkpointing.py``'s method), with the decoder layers kept: the head ``kept`` (tether now, where the
   layers are kept), or through ``autograd`` (what a forward hook on the head still gets, and every head got before).

Results go to ``--out`` as JSON: each rep's seconds (and the update's peak), medians, and ratios to ``kept`` with
their 95% paired-bootstrap intervals (docs/benchmarks.md).
"""

from __future__ import annotations

import contextlib
import copy
import datetime as dt
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_checkpointing
import bench_trl

from tether.models.forward import head_log_probs

HEAD_MODES = {"autograd": None, "recomputed": False, "kept": True}  # -> keep_logits (None: the hooked head)
UPDATE_MODES = ("autograd", "kept")


@contextlib.contextmanager
def head_through_autograd(head: torch.nn.Module, on: bool) -> Iterator[None]:
    """While ``on``, a forward hook that does nothing: a hooked head is called, so its chunks run through autograd
    (checkpointed) as every head's did before tether.models.head."""
    handle = head.register_forward_hook(lambda *_: None) if on else None
    try:
        yield
    finally:
        if handle is not None:
            handle.remove()


def head_pass(head: torch.nn.Module, hidden: torch.Tensor, targets: torch.Tensor, mode: str) -> float:
    """Seconds of one forward and backward of the head's log-probs and entropies (the entropy a metric, as in
    the quickstart's loss) over ``hidden [1, M, H]``."""
    hidden = hidden.detach().requires_grad_()
    head.weight.grad = None
    start = time.perf_counter()
    with head_through_autograd(head, HEAD_MODES[mode] is None):
        log_probs, _ = head_log_probs(head, hidden, targets, torch.ones_like(targets), temperature=1.0,
                                            with_entropy=True, chunk_size=1024,
                                            keep_logits=bool(HEAD_MODES[mode]))
        log_probs.sum().backward()  # the entropy is a metric there: no gradient reaches it
    return time.perf_counter() - start


def timed_update(trainer: Any, batch: Any, mode: str) -> dict[str, float]:
    with head_through_autograd(trainer.policy.get_output_embeddings(), mode == "autograd"):
        return bench_checkpointing.timed_update(trainer, batch, recompute=False)


def summary(seconds: dict[str, list[float]]) -> dict[str, Any]:
    """Medians, and each mode's median over ``kept``'s with its interval (reps resampled in pairs)."""
    out: dict[str, Any] = {n: {"median_s": float(np.median(s))} for n, s in seconds.items()}
    for n in seconds:
        if n != "kept":
            out[n]["over_kept"] = out[n]["median_s"] / out["kept"]["median_s"]
            out[n]["over_kept_95ci"] = bench_trl.ratio_interval([{"step_s": s} for s in seconds[n]],
                                                                [{"step_s": s} for s in seconds["kept"]], warmup=0)
    return out


def described(name: str, mode: dict[str, Any]) -> str:
    """``name 1.234 s (1.63x [1.58, 1.68])``: a mode's median and its ratio to ``kept`` with the interval."""
    text = f"{name} {mode['median_s']:.3f} s"
    if "over_kept" in mode:
        lo, hi = mode["over_kept_95ci"]
        text += f" ({mode['over_kept']:.2f}x [{lo:.2f}, {hi:.2f}])"
    return text


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args, reps = bench_checkpointing.parsed(argv, reps=6)
    cfg = bench_trl.tether_config(args, "/tmp/tether-bench-head")
    trainer = bench_trl.TetherBench(cfg, bench_trl.model_dir(cfg.model.name)).trainer
    batch = bench_checkpointing.prepared_batch(trainer)
    tokens = int(batch.response_mask.sum())

    head = trainer.policy.get_output_embeddings()
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(1, tokens, head.in_features, generator=g)
    targets = torch.randint(0, head.out_features, (1, tokens), generator=g)
    head_s: dict[str, list[float]] = {n: [] for n in HEAD_MODES}
    for rep in range(-1, reps):  # rep -1 warms up
        for name in (list(HEAD_MODES) if rep % 2 == 0 else list(reversed(HEAD_MODES))):
            s = head_pass(head, hidden, targets, name)
            if rep >= 0:
                head_s[name].append(s)
        if rep >= 0:
            print(f"head, rep {rep + 1}: " + ", ".join(f"{n} {head_s[n][-1]:.3f} s" for n in HEAD_MODES), flush=True)
    head.weight.grad = None

    timed_update(trainer, batch, "kept")  # warm-up: AdamW's state now exists
    policy_state = copy.deepcopy(trainer.policy.state_dict())
    optimizer_state = copy.deepcopy(trainer.optimizer.state_dict())
    updates: dict[str, list[dict[str, float]]] = {n: [] for n in UPDATE_MODES}
    for rep in range(reps):
        for name in (UPDATE_MODES if rep % 2 == 0 else tuple(reversed(UPDATE_MODES))):
            bench_checkpointing.restore(trainer, policy_state, optimizer_state)
            updates[name].append(timed_update(trainer, batch, name))
        print(f"update, rep {rep + 1}: " + ", ".join(
            f"{n} {updates[n][-1]['s']:.2f} s, {updates[n][-1]['peak_gb']:.2f} GB" for n in UPDATE_MODES), flush=True)

    update_summary = summary({n: [r["s"] for r in updates[n]] for n in UPDATE_MODES})
    for n in UPDATE_MODES:
        update_summary[n]["median_peak_gb"] = float(np.median([r["peak_gb"] for r in updates[n]]))
    result = {"date": dt.datetime.now().isoformat(timespec="seconds"), "command": " ".join(["python", *sys.argv]),
              "settings": vars(args) | {"reps": reps, "config": str(args.config), "out": str(args.out)},
              "environment": bench_trl.environment(), "tokens": tokens, "rows": len(batch),
              "head": summary(head_s), "update": update_summary,
              "runs": {"head_s": head_s, "update": updates}}
    out = args.out or bench_trl.RESULTS / f"{dt.date.today()}-head.json"
    out.write_text(json.dumps(result, indent=1, default=str))
    for part in ("head", "update"):
        print(f"{part} ({tokens} response tokens): " + ", ".join(described(n, v) for n, v in result[part].items()))
    print(f"wrote {out}")
    return result


if __name__ == "__main__":
    main()
