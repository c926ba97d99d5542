"""Data parallelism over ``torch.distributed``: one code path for 1 process and N processes.

:mod:`tether.distributed.strategy` lays the policy out (replicated, or sharded by
:mod:`tether.distributed.fsdp`); :mod:`tether.distributed.data_parallel` splits rollouts and rows by
rank; :mod:`tether.distributed.device` picks this rank's device. See docs/scaling.md.
"""

from tether.distributed.data_parallel import DataParallel, ShardedEngine, concat_generations, rank_seed, split_evenly
from tether.distributed.device import resolve_device
from tether.distributed.strategy import MicroBatch, Replicate, Strategy, build_strategy

__all__ = ["DataParallel", "MicroBatch", "Replicate", "ShardedEngine", "Strategy", "build_strategy",
           "concat_generations", "rank_seed", "resolve_device", "split_evenly"]
