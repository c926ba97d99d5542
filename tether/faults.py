"""How a run reports the faults it contains (a reward function's, an environment's) without flooding the console.

A contained fault does not stop the run: it is counted in a metric (``reward/faults``, ``env/faults``), and
:class:`FaultLog` tells the user once per kind of fault. The first fault of each kind (a reward term; an env's phase
and error type) is one warning on the console and one JSONL row of its details (its traceback, where it has one) in
the run's ``health`` folder; later faults of that kind are only counted. Only rank 0 writes the file, so a
``torchrun`` run has one row per kind, not one per rank.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Hashable, Mapping
from pathlib import Path
from typing import Any

from tether.files import append_jsonl


class FaultLog:
    """The first fault of each kind: a warning and a row of ``path``.

    Args:
        path: the JSONL file of the first fault of each kind (in the run's ``health`` folder); None: nowhere (a
            task scored outside a run), the warning only.
    """

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._seen: set[Hashable] = set()

    def first(self, kind: Hashable, row: Mapping[str, Any], warning: str, *, stacklevel: int = 2) -> bool:
        """Report a fault of ``kind`` if it is the first of its kind: ``row`` appended to the file and ``warning``
        (with where the details are) shown. Returns whether it was reported."""
        if kind in self._seen:
            return False
        self._seen.add(kind)
        where = ""
        if self.path is not None and os.environ.get("RANK", "0") == "0":
            append_jsonl(self.path, [row])
            where = f"; details in {self.path}"
        warnings.warn(f"{warning}{where}", stacklevel=stacklevel + 1)
        return True
