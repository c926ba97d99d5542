"""The start every command shares (``train``, ``eval``, ``sft``, ``seed-sft``): the device, the threads, the seed.

The device is resolved against the machine first, so a missing GPU stops a command before it loads a model or
writes a file; then ``train.threads`` and the global seed (``seed``) are set, before any model exists (a LoRA
adapter's initialisation draws from that seed). Sampling seeds are not global: :mod:`tether.seeding`.
"""

from __future__ import annotations

import torch

from tether.config import Config
from tether.distributed import resolve_device


def start_run(cfg: Config) -> torch.device:
    """Resolve ``train.device`` on this machine (raises ``ConfigError`` naming the key), set ``train.threads`` and
    seed torch's global generator with ``seed``. Returns the device."""
    device = resolve_device(cfg.train.device)
    if cfg.train.threads:
        torch.set_num_threads(cfg.train.threads)
    torch.manual_seed(cfg.seed)
    return device
