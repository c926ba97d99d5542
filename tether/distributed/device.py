"""``train.device`` -> the device this process trains on, checked against the machine before any model loads.

Under ``torchrun`` each rank takes the GPU of its ``LOCAL_RANK`` (``auto`` and ``cuda``), as DDP, verl and TRL
(accelerate) do; choose the GPUs themselves with ``CUDA_VISIBLE_DEVICES``.
"""

from __future__ import annotations

import os

import torch

from tether.config import ConfigError


def resolve_device(spec: str) -> torch.device:
    """The device ``train.device`` names on this machine (the spec is already validated by the config).

    Args:
        spec: ``auto`` (``cuda:LOCAL_RANK`` when CUDA is available, else ``cpu``), ``cpu``, ``cuda``
            (``cuda:LOCAL_RANK``) or ``cuda:N`` (one process only).

    Raises:
        ConfigError: CUDA is asked for and unavailable, the GPU does not exist, or ``cuda:N`` under torchrun.
    """
    if spec == "cpu" or (spec == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        reason = ("this torch build has no CUDA support" if torch.version.cuda is None else
                  f"torch {torch.__version__} (CUDA {torch.version.cuda}) sees no GPU (CUDA_VISIBLE_DEVICES="
                  f"{os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')})")
        raise ConfigError(f"train.device={spec}: {reason}; allowed here: auto or cpu")
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if spec.startswith("cuda:") and world_size > 1:
        raise ConfigError(f"train.device={spec} would put all {world_size} torchrun ranks on one GPU; use auto or "
                          "cuda (each rank takes GPU LOCAL_RANK) and pick GPUs with CUDA_VISIBLE_DEVICES")
    index = int(spec.removeprefix("cuda:")) if spec.startswith("cuda:") else local_rank
    count = torch.cuda.device_count()
    if index >= count:
        source = f"LOCAL_RANK={local_rank}" if spec in ("auto", "cuda") else f"GPU {index}"
        raise ConfigError(f"train.device={spec}: {source} but this machine shows {count} GPU(s) (cuda:0..cuda:"
                          f"{count - 1}); start at most {count} processes per node, or pick an existing GPU")
    return torch.device("cuda", index)
