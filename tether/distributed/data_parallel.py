"""Data parallelism for the RL step: rollouts split across ranks, gradients summed, one code path.

Under ``torchrun`` every rank holds the whole policy (replicated, DDP semantics) and the same
:class:`~tether.rollout.batch.RolloutBatch`:

* **rollouts** -- :class:`ShardedEngine` wraps the engine: each ``generate`` call samples only this
  rank's contiguous share of the prompts (seed mixed with the rank), then all ranks gather the parts,
  so collectors, method hooks, filters and advantages run unchanged on the full batch;
* **update** -- each rank runs the micro-batches of its share of every mini-batch (planned by
  :mod:`tether.trainer.micro_batches`). The loss of a micro-batch is already normalised by the *whole*
  mini-batch's token and sequence counts (every rank holds the mini-batch, so those counts are global
  without a collective), hence the per-rank gradients are partial sums of the single-process gradient:
  :meth:`DataParallel.all_reduce_grads` *sums* them (one flat all-reduce per optimiser step) before
  clipping, so the clipped gradient, the optimiser step and the parameters are those of one process, up to
  summation order;
* **metrics** are partial sums (a mean's value times its units, and its units: response tokens, rows or the
  subset it averages over), summed over ranks the same way (:meth:`DataParallel.sum_metrics`; a ``*_max`` /
  ``*_min`` takes the largest / smallest rank's); rank 0 alone logs and writes checkpoints.

The policy stays a plain module (no DDP wrapper): the engine, the methods (ARMOR's reference reset,
SEED's teacher pass) and checkpointing see the same object as in one process. The wrapper's gain --
overlapping the all-reduce with backward -- is left for the GPU path. Sharded training is
:mod:`tether.distributed.fsdp`; :mod:`tether.distributed.strategy` picks one of the two.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor

from tether.engine.base import Generation, Intervention, SamplingParams
from tether.seeding import rank_seed


def split_evenly(n: int, parts: int) -> list[tuple[int, int]]:
    """``[lo, hi)`` bounds of ``parts`` contiguous shares of ``n`` items; sizes differ by at most one.

    >>> split_evenly(5, 2)
    [(0, 3), (3, 5)]
    """
    base, extra = divmod(n, parts)
    bounds, lo = [], 0
    for r in range(parts):
        hi = lo + base + (1 if r < extra else 0)
        bounds.append((lo, hi))
        lo = hi
    return bounds


def extremum(key: str) -> Callable[[Any, Any], Any] | None:
    """How the parts of a metric named ``*_max`` or ``*_min`` combine over micro-batches, ranks and mini-batches: the
    larger or the smaller of two (floats, or 0-dim tensors compared on their device without a host sync), since a
    sum or a mean of maxima is no maximum; None for any other metric, whose parts are summed or averaged."""
    if key.endswith("_max"):
        return lambda a, b: torch.maximum(a, b) if isinstance(a, Tensor) else max(a, b)
    if key.endswith("_min"):
        return lambda a, b: torch.minimum(a, b) if isinstance(a, Tensor) else min(a, b)
    return None


class DataParallel:
    """This process's place in the data-parallel group; a no-op object in a single process.

    Args:
        rank: this process's rank.
        world_size: number of processes; 1 means no ``torch.distributed`` call is ever made.
    """

    def __init__(self, rank: int = 0, world_size: int = 1) -> None:
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is outside world size {world_size}")
        self.rank, self.world_size = rank, world_size

    @classmethod
    def from_env(cls, device: torch.device, *, join_alone: bool = False) -> DataParallel:
        """Join the process group ``torchrun`` describes (``WORLD_SIZE`` > 1), or run alone.

        An already initialised default group is reused. The backend follows this rank's ``device``: NCCL
        for a GPU, gloo for the CPU.

        Args:
            device: this rank's device (:func:`~tether.distributed.device.resolve_device`); a GPU becomes
                the current CUDA device, which NCCL, FSDP2's mesh and bare ``"cuda"`` allocations use.
            join_alone: also join the one-process group of ``torchrun --nproc_per_node 1``: sharding
                (FSDP2) needs a process group and a device mesh even on one GPU.
        """
        if device.type == "cuda":
            torch.cuda.set_device(device)
        if dist.is_available() and dist.is_initialized():
            return cls(dist.get_rank(), dist.get_world_size())
        world = int(os.environ.get("WORLD_SIZE", "1"))
        if world <= 1 and not (join_alone and "MASTER_ADDR" in os.environ):
            return cls()
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
        return cls(dist.get_rank(), dist.get_world_size())

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def barrier(self) -> None:
        if self.enabled:
            dist.barrier()

    def first_failure(self, failure: str | None) -> tuple[int, str] | None:
        """Every rank says how its part went (None: it succeeded); all get the same answer: the lowest failing
        rank and its message, or None. Collective, and a barrier too: a rank whose part failed still reaches it,
        so no other rank waits at a later collective for a rank that has left."""
        if not self.enabled:
            return None if failure is None else (self.rank, failure)
        gathered: list[str | None] = [None] * self.world_size
        dist.all_gather_object(gathered, failure)
        return next(((rank, line) for rank, line in enumerate(gathered) if line is not None), None)

    # -- the update ----------------------------------------------------------------------------

    def all_reduce_grads(self, params: Iterable[Tensor]) -> None:
        """Sum every parameter's gradient over ranks (missing gradients count as zeros), in place."""
        if not self.enabled:
            return
        params = [p for p in params if p.requires_grad]
        flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in params])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        offset = 0
        for p in params:
            chunk = flat[offset:offset + p.numel()].view_as(p)
            offset += p.numel()
            if p.grad is None:
                p.grad = chunk.clone()
            else:
                p.grad.copy_(chunk)

    def sum_metrics(self, metrics: dict[str, Any]) -> dict[str, Any]:
        """Sum per-rank partial metrics by key (a rank without rows contributes nothing); a ``*_max`` / ``*_min``
        metric is the largest / smallest rank's (:func:`extremum`)."""
        if not self.enabled:
            return metrics
        local = {k: float(v) for k, v in metrics.items()}
        gathered: list[dict[str, float] | None] = [None] * self.world_size
        dist.all_gather_object(gathered, local)
        out: dict[str, float] = {}
        for part in gathered:
            for k, v in (part or {}).items():
                pick = extremum(k)
                out[k] = pick(out[k], v) if pick is not None and k in out else out.get(k, 0.0) + v
        return out

    # -- rollouts ------------------------------------------------------------------------------

    def rollout_engine(self, engine: Any) -> Any:
        """``engine`` itself in one process; a :class:`ShardedEngine` over it in N processes."""
        return ShardedEngine(engine, self) if self.enabled else engine


def _pad_to(x: Tensor, width: int, value: float) -> Tensor:
    return x if x.shape[1] >= width else F.pad(x, (0, width - x.shape[1]), value=value)


def concat_generations(parts: list[Generation], pad_id: int) -> Generation:
    """Stack generations row-wise, right-padding to the widest (``pad_id`` for tokens, 0 elsewhere)."""
    width = max(g.response_ids.shape[1] for g in parts)
    keys = sorted({k for g in parts for k in g.token})
    token = {}
    for k in keys:
        token[k] = torch.cat([_pad_to(g.token[k], width, 0) if k in g.token
                              else g.response_mask.new_zeros(g.response_mask.shape[0], width) for g in parts])
    return Generation(
        response_ids=torch.cat([_pad_to(g.response_ids, width, pad_id) for g in parts]),
        response_mask=torch.cat([_pad_to(g.response_mask, width, 0) for g in parts]),
        sample_log_probs=torch.cat([_pad_to(g.sample_log_probs, width, 0) for g in parts]),
        texts=[t for g in parts for t in g.texts],
        truncated=torch.cat([g.truncated for g in parts]),
        token=token,
    )


class ShardedEngine:
    """A :class:`~tether.engine.base.RolloutEngine` that splits ``generate`` across data-parallel ranks.

    Every rank must call :meth:`generate` with the same prompts (they do: each holds the same prompt
    stream and seeds). Rank ``r`` samples its contiguous share with seed ``rank_seed(seed, r)``; the
    shares are gathered in rank order, so every rank returns the same full :class:`Generation`. An
    intervention sees only its rank's rows (it is built per call and must be row-local, as EAPO's is).
    ``score`` and ``load_weights`` act on the local engine; other attributes are the local engine's.
    """

    def __init__(self, engine: Any, dp: DataParallel) -> None:
        self.engine, self.dp = engine, dp

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)

    def generate(self, prompt_ids: list[list[int]], params: SamplingParams, *, seed: int | None = None,
                 intervention: Intervention | None = None) -> Generation:
        lo, hi = split_evenly(len(prompt_ids), self.dp.world_size)[self.dp.rank]
        local = None
        if hi > lo:
            local = self.engine.generate(prompt_ids[lo:hi], params,
                                         seed=None if seed is None else rank_seed(seed, self.dp.rank),
                                         intervention=intervention).to("cpu")
        gathered: list[Generation | None] = [None] * self.dp.world_size
        dist.all_gather_object(gathered, local)
        # on the CPU, where it was gathered: the collectors build the batch there (RolloutBatch)
        return concat_generations([g for g in gathered if g is not None], self.engine.pad_id)

    def score(self, prompt_ids: list[list[int]], response_ids: Tensor, response_mask: Tensor, **kwargs: Any) -> Any:
        return self.engine.score(prompt_ids, response_ids, response_mask, **kwargs)

    def load_weights(self, state_dict: dict[str, Tensor]) -> None:
        self.engine.load_weights(state_dict)
