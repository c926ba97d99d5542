"""README's miniature lab runs to the end in its order: each checkpoint a command reads is written by a command
above it (a `tether sft CONFIG` writes RUN_DIR/checkpoint)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
CHECKPOINT = re.compile(r"runs/[\w./-]+/checkpoint")


def lab_commands() -> list[list[str]]:
    """The `tether` commands of the README's "The miniature lab" shell block, comments dropped."""
    section = (ROOT / "README.md").read_text().split("## The miniature lab", 1)[1]
    block = section.split("```bash", 1)[1].split("```", 1)[0]
    return [line.split("#", 1)[0].split() for line in block.splitlines() if line.startswith("tether ")]


def checkpoints_read(path: str) -> set[str]:
    """Each checkpoint a config, or a protocol's arms (their configs and overrides), names: comments left out."""
    data = yaml.safe_load((ROOT / path).read_text())
    texts = [json.dumps(data)] + [(ROOT / arm["config"]).read_text() for arm in data.get("arms", {}).values()]
    return {hit for text in texts for hit in CHECKPOINT.findall(json.dumps(yaml.safe_load(text)))}


def test_the_miniature_lab_writes_each_checkpoint_before_a_command_reads_it():
    written: set[str] = set()
    commands = lab_commands()
    assert [c[1] for c in commands][-1] == "experiment"
    for command in commands:
        config = command[2]
        unwritten = checkpoints_read(config) - written
        assert not unwritten, f"README: `{' '.join(command)}` reads {sorted(unwritten)}, which nothing above writes"
        if command[1] == "sft":
            written.add(f"{yaml.safe_load((ROOT / config).read_text())['run_dir']}/checkpoint")
