"""Data parallelism over ``torch.distributed``: one code path for 1 process and N processes.

:mod:`tether.distributed.strategy` lays the policy out (replicated, or sharded by
:mod:`tether.distributed.fsdp`); :mod:`tether.distributed.data_parallel` splits rollouts and rows by
rank; :mod:`tether.distributed.device` picks this rank's device. See docs/scaling.md.
:func:`build_strategy` is here, above both strategies, so that :mod:`~tether.distributed.strategy` (the base and
the replicated one) never imports :mod:`~tether.distributed.fsdp`, which builds on it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from tether.distributed.data_parallel import DataParallel, ShardedEngine, concat_generations, split_evenly
from tether.distributed.device import resolve_device
from tether.distributed.strategy import Replicate, Strategy
from tether.seeding import rank_seed

if TYPE_CHECKING:
    from tether.config import DistributedConfig

__all__ = ["DataParallel", "Replicate", "ShardedEngine", "Strategy", "build_strategy",
           "concat_generations", "rank_seed", "resolve_device", "split_evenly"]


def build_strategy(cfg: DistributedConfig, device: torch.device) -> Strategy:
    """Join ``torchrun``'s process group (if any) and return the configured strategy, which places models on
    ``device`` (this rank's, from :func:`~tether.distributed.device.resolve_device`).

    Raises:
        ConfigError: the strategy cannot run in this launch (e.g. fsdp2 without a process group).
    """
    if cfg.strategy == "fsdp2":
        from tether.distributed.fsdp import FSDP2

        return FSDP2(DataParallel.from_env(device, join_alone=True), device, param_dtype=cfg.param_dtype,
                     reduce_dtype=cfg.reduce_dtype)
    return Replicate(DataParallel.from_env(device), device)
