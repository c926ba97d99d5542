"""What the multi-process tests share: a fixed batch, prompts, and one ``mp.spawn`` of workers (two gloo ranks on
the CPU; one NCCL rank in tests/trainer/test_cuda.py)."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from tether.engine.base import SamplingParams
from tether.rollout.batch import RolloutBatch

WORLD = 2
ROWS = 10  # mini-batches of 5 rows: rank 0 takes 3 (micro-batches of 2 and 1), rank 1 takes 2
UPDATE = ("optim.mini_batches=2", "optim.micro_batch_size=2", "algorithm.kl.coef=0.1", "optim.grad_clip=1e9")
PROMPTS = [[1, 2, 3], [4, 5], [6, 7, 8, 9], [10], [11, 12, 13]]
SAMPLING = SamplingParams(max_new_tokens=5)


def fixed_batch() -> RolloutBatch:
    """A batch that needs no sampling: the same on every rank and in one process."""
    g = torch.Generator().manual_seed(0)
    lengths = torch.tensor([6, 3, 5, 1, 6, 4, 2, 6, 5, 3])
    mask = (torch.arange(6)[None] < lengths[:, None]).float()
    return RolloutBatch(
        # rows 2k and 2k+1 repeat one prompt, so micro-batches also run packed rows
        prompt_ids=[[1 + i // 2, 20 + i // 2, 300 + i // 2][: 1 + (i // 2) % 3] for i in range(ROWS)],
        response_ids=torch.randint(0, 2000, (ROWS, 6), generator=g) * mask.long(),
        response_mask=mask, sample_log_probs=torch.zeros(ROWS, 6),
        group_ids=torch.tensor([0] * 5 + [1] * 5), rewards=torch.rand(ROWS, generator=g),
        correct=torch.zeros(ROWS, dtype=torch.bool), source=torch.zeros(ROWS, dtype=torch.long))


def _run(rank: int, work: Callable[[int, Path], dict[str, Any]], init_file: str, out_dir: str, world: int,
         backend: str) -> None:
    torch.set_num_threads(1)
    # A rank that skips a collective fails the test after 2 minutes instead of hanging for gloo's 30.
    dist.init_process_group(backend, init_method=f"file://{init_file}", rank=rank, world_size=world,
                            timeout=timedelta(minutes=2))
    result = work(rank, Path(out_dir))
    torch.save(result, Path(out_dir) / f"rank{rank}.pt")
    dist.destroy_process_group()


def spawn_ranks(work: Callable[[int, Path], dict[str, Any]], world: int = WORLD,
                backend: str = "gloo") -> Iterator[tuple[list[dict[str, Any]], Path]]:
    """Run ``work(rank, out_dir)`` in ``world`` processes of one group; yields (each rank's result, out_dir)."""
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_run, args=(work, os.path.join(tmp, "init"), tmp, world, backend), nprocs=world, join=True)
        yield [torch.load(Path(tmp) / f"rank{r}.pt", weights_only=False) for r in range(world)], Path(tmp)
