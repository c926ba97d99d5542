"""Fixtures for the rollout tests: a trainer on a tiny random model, optionally with the scripted engine."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.rollout.helpers import ScriptedEngine
from tether.trainer import Trainer


@pytest.fixture
def agent_trainer(tiny_policy):
    """``agent_trainer(cfg, scripted=True)``: a Trainer on a fresh tiny model; ``scripted`` swaps in ScriptedEngine."""

    def build(cfg, scripted: bool = True, **engine_kwargs):
        model, tok = tiny_policy
        trainer = Trainer(cfg, policy=model, tokenizer=tok)
        if scripted:
            trainer.use_engine(ScriptedEngine(tok, **engine_kwargs))
        return trainer

    return build


@pytest.fixture(scope="session")
def tw_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """TextWorld cache: $TETHER_CACHE/textworld if set (fast reruns), else a fresh session folder."""
    root = os.environ.get("TETHER_CACHE")
    return Path(root) / "textworld" if root else tmp_path_factory.mktemp("tw-cache")
