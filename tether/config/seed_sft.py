"""``sft`` of a ``tether seed-sft`` config: SEED stage 1's settings (seed.md Sec. 1.1; docs/methods/seed.md).

The hyperparameters are tether's one SFT loop's (:class:`~tether.config.sections.SFTSettings`,
:mod:`tether.recipes.sft`) with the paper's values as defaults; the pipeline that uses them (rollouts, labels, SFT)
is the recipe :mod:`tether.recipes.seed_sft`. The analyzer prompt options stage 2 shares stay in ``methods.seed``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from tether.config.base import Section
from tether.config.sections import SFTSettings


class OpenAISettings(Section):
    """The OpenAI-compatible analyzer (:class:`~tether.methods.seed.openai_analyzer.OpenAIAnalyzer`)."""

    base_url_env: str = Field("OPENAI_BASE_URL", description="env var holding the base URL, e.g. http://host/v1")
    model_env: str = Field("OPENAI_MODEL", description="env var holding the model name")
    api_key_env: str = Field("OPENAI_API_KEY", description="env var holding the key (may be unset)")
    max_completion_tokens: int = Field(1024, ge=1, description="the stage-1 scripts' SKILL_MAX_COMPLETION_TOKENS")
    parse_retries: int = Field(2, ge=1, description="attempts per trajectory (repair prompt after the first)")
    api_retries: int = Field(5, ge=1, description="attempts per request on HTTP or network errors")
    timeout_s: float = Field(120.0, gt=0, description="seconds one request may take")
    workers: int = Field(4, ge=1, description="concurrent requests")


class SkillSFTSettings(SFTSettings):
    """``sft`` of ``tether seed-sft``: SEED's stage 1. The SFT hyperparameters are the one SFT loop's
    (:mod:`tether.recipes.sft`), with the paper's values as defaults (ALFWorld, Qwen2.5-3B, 8 GPUs)."""

    tasks: int = Field(180, ge=1, description="training tasks rolled out (paper: 180), the first of env.train_tasks")
    rollouts_per_task: int = Field(8, ge=1, description="trajectories per task (paper: 8)")
    temperature: float | None = Field(None, gt=0, description="rollout temperature (default rollout.temperature; "
                                                              "paper: 0.4 ALFWorld, 1.0 Sokoban)")
    rollout_batch_tasks: int = Field(8, ge=1, description="tasks played at once")
    analyzer: Literal["rule", "openai"] = Field("rule", description="who labels the trajectories")
    openai: OpenAISettings = Field(default_factory=OpenAISettings, description="analyzer=openai: the endpoint")
    epochs: int = Field(3, ge=1, description="paper: 3")
    batch_size: int = Field(8, ge=1, description="examples per optimiser step (paper: 8)")
    micro_batch_size: int = Field(1, ge=1, description="examples per forward/backward (paper: 1)")
    lr: float = Field(5e-6, gt=0, description="paper: 5e-6 (text models)")
    weight_decay: float = Field(0.01, ge=0, description="AdamW weight decay")
    warmup_ratio: float = Field(0.1, ge=0, le=1, description="linear warm-up share, then cosine decay to 0")
    max_length: int = Field(8192, ge=16, description="prompt + response tokens; longer examples are dropped "
                                                     "(paper: 8192 ALFWorld)")
    val_fraction: float = Field(0.1, ge=0, lt=1, description="held-out share of the records (paper: 0.1)")
    data_seed: int = Field(2026, description="split shuffle seed (paper: 2026)")
    eval_examples: int = Field(16, ge=0, description="val prompts analysed greedily before and after SFT to "
                                                     "measure the parse rate (0: skip)")
    replay_data: str | None = Field(None, description="JSONL of {prompt, response} pairs mixed into the training "
                                    "examples, e.g. an action warm start's data (tether sft with data=solver "
                                    "writes run_dir/data/train.jsonl). Not in the paper: it keeps a small model "
                                    "acting while it learns to analyse")
    replay_examples: int | None = Field(None, ge=1, description="replay pairs drawn (seeded by data_seed; "
                                                                "default: all of them)")
