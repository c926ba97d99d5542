"""Joining a Ray cluster, shared by the Ray rollout engine and the Ray environment workers.

Ray is optional (``pip install -e '.[ray]'``) and imported only here, when something asks for it.
"""

from __future__ import annotations

import importlib.util
import math
import os
from types import ModuleType

from tether.engine.base import EngineUnavailableError


def check_ray_available(key: str) -> None:
    """Raise :class:`EngineUnavailableError` naming the setting ``key`` that asked for Ray, when it is missing."""
    if importlib.util.find_spec("ray") is None:
        raise EngineUnavailableError(f"{key} needs Ray: pip install -e '.[ray]' (ray==2.60.0); or change {key}")


def connect(key: str, address: str | None = None, local_cpus: float = 1.0) -> ModuleType:
    """The ``ray`` module, initialised: this process's session if there is one, else the cluster at ``address``
    (or ``$RAY_ADDRESS``; ``"auto"`` is the one ``ray start`` runs on this node), else a new local instance with
    ``local_cpus`` CPUs (rounded up) and no dashboard."""
    check_ray_available(key)
    import ray

    if not ray.is_initialized():
        address = address or os.environ.get("RAY_ADDRESS")
        ray.init(address=address, num_cpus=None if address else math.ceil(local_cpus), include_dashboard=False)
    return ray
