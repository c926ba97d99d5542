"""The vLLM engine: its intervention error always; the engine itself only with vLLM and a GPU."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from tether.engine.base import InterventionUnsupportedError, SamplingParams
from tether.engine.vllm import VLLMEngine


def test_intervention_raises_a_clear_error_without_building_vllm():
    engine = VLLMEngine.__new__(VLLMEngine)  # no vllm.LLM needed for the check
    with pytest.raises(InterventionUnsupportedError, match="HFEngine"):
        engine.generate([[1]], SamplingParams(), intervention=object())


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None or not torch.cuda.is_available(),
                    reason="needs vLLM and a CUDA GPU (not installed / absent on the CPU test machine)")
def test_generate_log_probs_match_score(tokenizer):
    engine = VLLMEngine("HuggingFaceTB/SmolLM2-135M-Instruct", tokenizer, gpu_memory_utilization=0.2)
    gen = engine.generate([[1, 2, 3]] * 2, SamplingParams(max_new_tokens=8), seed=0)
    scored = engine.score([[1, 2, 3]] * 2, gen.response_ids, gen.response_mask)
    torch.testing.assert_close(scored * gen.response_mask, gen.sample_log_probs * gen.response_mask,
                               atol=1e-2, rtol=0)
