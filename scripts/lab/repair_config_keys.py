"""Give back the int mapping keys that a run's ``config.yaml`` lost before d01056a.

Until then the tracker rewrote ``RUN/config.yaml`` from a JSON-mode dump, so a task or env argument keyed by ints
(``inner_carries: {0: 1.0}``) came out keyed by digit strings (``'0': 1.0``), and ``tether eval --config
RUN/config.yaml`` (which the lab runs for every endpoint) refused it. This rewrites, under ``task.kwargs`` and
``env.kwargs`` only, every mapping whose keys are all digit strings with int keys, and changes nothing else; a
file with nothing to change is left as it is. Each rewritten file is checked by loading it the way ``tether eval``
does.

    python scripts/lab/repair_config_keys.py runs/lab/eapo3/replication/*/seed*
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import yaml

from tether.checks import load_checked_config
from tether.config import config_command
from tether.files import write_text_atomic


def int_keys(value: Any) -> Any:
    """``value`` with every mapping whose keys are all digit strings keyed by ints, at any depth."""
    if isinstance(value, dict):
        digits = bool(value) and all(isinstance(k, str) and k.lstrip("-").isdigit() for k in value)
        return {(int(k) if digits else k): int_keys(v) for k, v in value.items()}
    if isinstance(value, list):
        return [int_keys(v) for v in value]
    return value


def repair(path: Path) -> bool:
    """Rewrite ``path`` (a run's ``config.yaml``) if it has digit-string keys under ``task.kwargs`` or
    ``env.kwargs``; True if it did."""
    text = path.read_text()
    header = text.splitlines()[0] if text.startswith("#") else ""
    config = yaml.safe_load(text)
    repaired = dict(config)
    for section in ("task", "env"):
        if isinstance(config.get(section), dict) and "kwargs" in config[section]:
            repaired[section] = {**config[section], "kwargs": int_keys(config[section]["kwargs"])}
    if repaired == config:  # {0: 1.0} != {'0': 1.0}: equal only when no key changed
        return False
    write_text_atomic(path, (header + "\n" if header else "") + yaml.safe_dump(repaired, sort_keys=False))
    load_checked_config(path, command=config_command(path))  # as tether eval --config reads it
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="run directories (each with a config.yaml)")
    args = parser.parse_args()
    for run in args.runs:
        path = run / "config.yaml"
        print(f"{path}: {'repaired' if repair(path) else 'nothing to change'}")


if __name__ == "__main__":
    main()
