"""The one AdamW of tether's trainers (RL and SFT): PyTorch's fused kernel where it runs, as Hugging Face's Trainer
(and so TRL) picks by default (``adamw_torch_fused``).

The fused kernel updates each parameter in one pass over its weight, gradient and two moments; the default
multi-tensor path makes several passes and allocates a parameter-sized temporary. On SmolLM2-135M on this
project's 2-core CPU a step takes 0.10 s fused against 0.55-0.65 s (docs/benchmarks.md); the two agree to float32
rounding (about 1e-7 after three steps), not bit for bit. A checkpoint keeps the implementation it was written
with: ``load_state_dict`` restores the saved ``fused``/``foreach`` flags, so a resumed run steps as it began.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

# Devices whose parameters PyTorch's fused AdamW accepts (torch.optim.adamw's _get_fused_kernels_supported_devices).
FUSED_DEVICES = frozenset({"cpu", "cuda", "mps", "xpu", "hpu"})


def adamw(params: Iterable[torch.nn.Parameter], *, lr: float, betas: tuple[float, float],
          weight_decay: float) -> torch.optim.AdamW:
    """AdamW over ``params``, fused when every one is a floating-point tensor on a device with the fused kernel
    (otherwise PyTorch's default implementation)."""
    params = list(params)
    fused = bool(params) and all(p.is_floating_point() and p.device.type in FUSED_DEVICES for p in params)
    return torch.optim.AdamW(params, lr=lr, betas=betas, weight_decay=weight_decay, fused=fused or None)
