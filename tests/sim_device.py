"""A second device on a CPU-only machine, so that tests catch device mixing without a GPU.

:class:`SimulatedDevice` is a ``TorchFunctionMode`` that treats ``torch.device("cpu", 0)`` (``SIM``) as an
accelerator distinct from the host ``cpu``. The data stays in host memory; what the mode tracks is where each
tensor *would* live:

* a tensor is on ``SIM`` when it was moved there (``.to(SIM)``, ``Module.to(SIM)``), created there
  (``device=SIM``, or ``device=x.device`` of a tensor on ``SIM``), or computed from a tensor on ``SIM``;
  ``x.device`` reports ``SIM`` for it. A move (to or from ``SIM``) always copies, as it would between devices;
* an op that mixes a tensor on ``SIM`` with a host tensor of one element or more raises, as CUDA does
  ("Expected all tensors to be on the same device"). As on CUDA, host 0-dim tensors mix freely, an on-device
  tensor may be indexed by host indices, and copies (``copy_``, slice assignment) may cross devices.

Backward runs in C++ and is not seen, but gradients are marked when read through ``p.grad`` of a parameter on
``SIM``, so the optimiser's step is checked too.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten
from torch.utils.weak import WeakTensorKeyDictionary

SIM = torch.device("cpu", 0)
HOST = torch.device("cpu")

_DEVICE_GET = torch.Tensor.device.__get__
_DATA_SET = torch.Tensor.data.__set__
_MOVES = {torch.Tensor.to, torch.Tensor.cpu}
# Copies may cross devices (and Module.to compares tensors before swapping them); indexing takes host indices on
# any device.
_COPIES = {torch.Tensor.copy_, torch.Tensor.__setitem__, torch._has_compatible_shallow_copy_type}
_INDEXING = {torch.Tensor.__getitem__, torch.Tensor.__setitem__}


class DeviceMixingError(RuntimeError):
    """An op met tensors on the simulated device and on the host."""


def _tensors(tree: Any) -> list[torch.Tensor]:
    return [x for x in tree_flatten(tree)[0] if isinstance(x, torch.Tensor)]


class SimulatedDevice(TorchFunctionMode):
    """``with SimulatedDevice() as sim:`` -- see the module docstring. ``sim.is_on(t)``: is ``t`` on ``SIM``?"""

    def __init__(self) -> None:
        super().__init__()
        self._on = WeakTensorKeyDictionary()
        self.ops_on_device = 0  # ops that ran on SIM: a test can check the mode saw work at all

    def is_on(self, t: torch.Tensor) -> bool:
        return t in self._on

    def _mark(self, out: Any) -> Any:
        for t in _tensors(out):
            self._on[t] = True
        return out

    def _device_of(self, value: Any) -> torch.device | None:
        """The (simulated) device a ``.to`` argument names, or None for a dtype-only conversion."""
        if isinstance(value, torch.Tensor):
            return SIM if self.is_on(value) else HOST
        if isinstance(value, (str, torch.device)):
            return torch.device(value)
        return None

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func == _DEVICE_GET:  # method-wrappers are made per access: compare, not identity
            return SIM if self.is_on(args[0]) else func(*args)
        if func == _DATA_SET:  # Module.to swaps a parameter's data: the parameter moves with it
            func(*args)
            if self.is_on(args[1]):
                self._mark(args[0])
            return None
        if func in _MOVES:
            return self._move(func, args, kwargs)
        tensors = _tensors((args, kwargs))
        on = [t for t in tensors if self.is_on(t)]
        if func not in _COPIES:
            self._check(func, args, on, tensors)
        out = func(*args, **kwargs)
        if "device" in kwargs and kwargs["device"] is not None:
            target_on = torch.device(kwargs["device"]) == SIM
        else:
            target_on = bool(on)
        if target_on:
            self.ops_on_device += 1
            self._mark(out)
        return out

    def _check(self, func: Any, args: tuple, on: list[torch.Tensor], tensors: list[torch.Tensor]) -> None:
        if not on:
            return
        if func in _INDEXING:  # host indices into a tensor on the device are fine, the other way round is not
            if self.is_on(args[0]):
                return
            host_self = [args[0]]
        else:
            host_self = [t for t in tensors if not self.is_on(t) and t.dim() > 0]
        if host_self:
            name = getattr(func, "__qualname__", repr(func))
            shapes = [tuple(t.shape) for t in host_self]
            raise DeviceMixingError(f"{name}: tensors on the simulated device {SIM} meet host tensors of shapes "
                                    f"{shapes} (Expected all tensors to be on the same device)")

    def _move(self, func: Any, args: tuple, kwargs: dict) -> Any:
        src = args[0]
        target = HOST if func is torch.Tensor.cpu else None
        for value in (*args[1:], kwargs.get("device"), kwargs.get("other")):
            if target is None:
                target = self._device_of(value)
        out = func(*args, **kwargs)
        if target is None:  # dtype only: stays where it is
            return self._mark(out) if self.is_on(src) else out
        to_sim = target == SIM
        if to_sim != self.is_on(src) and out is src:
            out = out.clone()  # a move between devices copies
        return self._mark(out) if to_sim else out
