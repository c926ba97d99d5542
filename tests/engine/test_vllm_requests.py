"""The requests the vLLM engine hands to ``vllm.LLM.generate``, checked against a stand-in ``vllm`` module (vLLM is
not installed here; tests/integrations/test_vllm_engine.py runs the real one where it can).

Visual prompts must reach vLLM as its token prompt with multi-modal data: the chat template's ids with one
placeholder per image, and the PIL images themselves (tether/engine/vllm.py's docstring gives the reading of
vLLM's source behind this).
"""

from __future__ import annotations

import sys
import types
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch

from tether.engine.base import SamplingParams
from tether.engine.vllm import VLLMEngine, vllm_request
from tether.envs import make_env
from tether.envs.base import parse_tagged_action
from tether.models.vision import VisionPrompt, encode_vision_chat, tiny_vlm


@dataclass
class FakeLogprob:
    logprob: float


@dataclass
class FakeCompletion:
    token_ids: list[int]
    logprobs: list[dict[int, FakeLogprob]]
    text: str = "x"
    finish_reason: str = "stop"


@dataclass
class FakeOutput:
    outputs: list[FakeCompletion] = field(default_factory=list)
    prompt_logprobs: list[Any] = field(default_factory=list)


class FakeSamplingParams:
    def __init__(self, **kwargs: Any) -> None:
        self.kwargs = kwargs


def vllm_text(text: str, stop: list[str] | None, include_stop_str_in_output: bool) -> str:
    """A completion's text as vLLM returns it: at a stop string, cut before it, or after it when it is included."""
    for s in stop or []:
        if s in text:
            return text[:text.find(s) + (len(s) if include_stop_str_in_output else 0)]
    return text


class FakeLLM:
    """Records every ``generate`` call; expands image placeholders as vLLM does, ``expand`` tokens per image; each
    completion's text is ``text``, cut at a stop string as vLLM cuts it."""

    image_token_id = -1
    expand = 1
    text = "x"

    def __init__(self, **kwargs: Any) -> None:
        self.kwargs, self.calls = kwargs, []

    def generate(self, prompts: list[dict], params: Any, use_tqdm: bool = False) -> list[FakeOutput]:
        self.calls.append((prompts, params))
        outs = []
        for i, p in enumerate(prompts):
            row = (params[i] if isinstance(params, list) else params).kwargs
            text = vllm_text(self.text, row.get("stop"), row.get("include_stop_str_in_output", False))
            ids = [t for t in p["prompt_token_ids"]
                   for _ in range(self.expand if t == self.image_token_id and "multi_modal_data" in p else 1)]
            # the prompt log-prob at expanded position j is -j/100: a misread position shows in the value
            prompt_logprobs = [None] + [{t: FakeLogprob(-j / 100)} for j, t in enumerate(ids) if j]
            sampled = [5, 6]
            outs.append(FakeOutput([FakeCompletion(sampled, [{t: FakeLogprob(-0.25)} for t in sampled], text)],
                                   prompt_logprobs))
        return outs


@pytest.fixture
def fake_vllm(monkeypatch):
    module = types.ModuleType("vllm")
    module.LLM, module.SamplingParams = FakeLLM, FakeSamplingParams
    module.inputs = types.SimpleNamespace(TokensPrompt=dict)  # vLLM's TokensPrompt is a TypedDict
    monkeypatch.setitem(sys.modules, "vllm", module)
    return module


@pytest.fixture(scope="module")
def qwen():
    return tiny_vlm("qwen2_5_vl", seed=0)


def _frames() -> list:
    env = make_env("sokoban_visual")
    frames = [env.reset(seed).observation.images[0] for seed in (0, 1)]
    env.close()
    return frames


def _collapse(ids: list[int], image_token_id: int) -> list[int]:
    """Each run of image tokens as one: the processor's expansion undone."""
    return [t for i, t in enumerate(ids) if not (t == image_token_id and i and ids[i - 1] == image_token_id)]


@pytest.mark.parametrize("family", ["qwen2_5_vl", "idefics3"])
def test_template_ids_hold_one_placeholder_per_image(family):
    model, processor = tiny_vlm(family, seed=0)
    frames = _frames()
    prompt = encode_vision_chat(processor, "Look <image> then <image> now", frames)
    image_id = model.config.image_token_id
    assert prompt.template_ids.count(image_id) == 2 < prompt.count(image_id)
    assert prompt.template_ids == processor.tokenizer(processor.apply_chat_template(
        [{"role": "user", "content": [{"type": "text", "text": "Look "}, {"type": "image"},
                                      {"type": "text", "text": " then "}, {"type": "image"},
                                      {"type": "text", "text": " now"}]}],
        add_generation_prompt=True, tokenize=False), add_special_tokens=False).input_ids
    if family == "qwen2_5_vl":  # <|vision_start|><|image_pad|><|vision_end|>: vLLM expands the pad token alone
        assert _collapse(list(prompt), image_id) == prompt.template_ids


def test_generate_sends_unexpanded_ids_and_the_pil_images(fake_vllm, qwen):
    _, processor = qwen
    a, b = _frames()
    visual = encode_vision_chat(processor, "Compare <image> and <image>.", [a, b])
    engine = VLLMEngine("path/to/checkpoint", processor, enable_sleep_mode=False, dtype="float32")
    assert engine.pad_id == processor.tokenizer.pad_token_id  # the processor's tokenizer
    gen = engine.generate([[1, 2, 3], visual], SamplingParams(max_new_tokens=4), seed=7)
    ((requests, params),) = engine.llm.calls
    assert requests == [{"prompt_token_ids": [1, 2, 3]},
                        {"prompt_token_ids": visual.template_ids, "multi_modal_data": {"image": [a, b]}}]
    assert requests[1]["multi_modal_data"]["image"][0] is a  # the images themselves, not copies
    assert [p.kwargs["logprobs"] for p in params] == [0, 0] and params[0].kwargs["seed"] != params[1].kwargs["seed"]
    assert gen.response_ids.tolist() == [[5, 6], [5, 6]]
    assert torch.equal(gen.sample_log_probs, torch.full((2, 2), -0.25))


def test_ignore_eos_and_stop_strings_reach_vllm(fake_vllm, qwen):
    _, processor = qwen
    engine = VLLMEngine("path/to/checkpoint", processor, enable_sleep_mode=False)
    engine.generate([[1, 2, 3]], SamplingParams(max_new_tokens=4, stop=("</a>",)), seed=7)
    engine.generate([[1, 2, 3]], SamplingParams(max_new_tokens=4, stop=("</a>",), ignore_eos=True), seed=7)
    (_, (stopping,)), (_, (ignoring,)) = engine.llm.calls
    assert (stopping.kwargs["stop"], stopping.kwargs["ignore_eos"]) == (["</a>"], False)
    assert (ignoring.kwargs["stop"], ignoring.kwargs["ignore_eos"]) == (None, True)


def test_a_stop_string_ends_the_text_as_in_the_hf_engine(fake_vllm, qwen):
    """vLLM drops a stop string from the text unless ``include_stop_str_in_output``; HFEngine keeps it, and an agent's
    action parser needs it: without it every ``<action>up</action>`` came back as ``<action>up``, an invalid action."""
    _, processor = qwen
    engine = VLLMEngine("path/to/checkpoint", processor, enable_sleep_mode=False)
    engine.llm.text = "<action>up</action> and on"
    gen = engine.generate([[1, 2, 3]], SamplingParams(max_new_tokens=4, stop=("</action>",)), seed=7)
    assert gen.texts == ["<action>up</action>"]
    assert parse_tagged_action(gen.texts[0], ["up", "down"]) == ("up", True)
    # no stop string: the text as sampled
    plain = engine.generate([[1, 2, 3]], SamplingParams(max_new_tokens=4), seed=7)
    assert plain.texts == ["<action>up</action> and on"]


def test_score_reads_the_response_after_vllms_expanded_prompt(fake_vllm, qwen):
    model, processor = qwen
    visual = encode_vision_chat(processor, "Where is the box? <image>", _frames()[:1])
    engine = VLLMEngine("path/to/checkpoint", processor, enable_sleep_mode=False)
    engine.llm.image_token_id = model.config.image_token_id
    engine.llm.expand = visual.count(model.config.image_token_id)  # as many as the processor made
    prompts = [[1, 2, 3], visual]
    responses = torch.tensor([[7, 8, 9], [10, 11, 0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    scores = engine.score(prompts, responses, mask)
    ((requests, params),) = engine.llm.calls
    assert requests == [{"prompt_token_ids": [1, 2, 3, 7, 8, 9]},
                        {"prompt_token_ids": [*visual.template_ids, 10, 11],
                         "multi_modal_data": {"image": list(visual.images)}}]
    assert params.kwargs == {"max_tokens": 1, "temperature": 1.0, "prompt_logprobs": 0}
    # the response's first token sits where the processor's expanded prompt ends, as in the HF forward
    want = torch.tensor([[-0.03, -0.04, -0.05], [-len(visual) / 100, -(len(visual) + 1) / 100, 0.0]])
    torch.testing.assert_close(scores, want)


def test_score_refuses_a_temperature_vllms_prompt_log_probs_ignore(fake_vllm, qwen):
    """vLLM's prompt log-probs come from the raw logits: at temperature 0.7 ``score`` returned the temperature-1
    values unchanged (here the stand-in's -0.03, -0.04 where 0.7 would give others)."""
    _, processor = qwen
    engine = VLLMEngine("path/to/checkpoint", processor, enable_sleep_mode=False)
    responses, mask = torch.tensor([[7, 8]]), torch.ones(1, 2)
    with pytest.raises(ValueError, match="ignore the temperature"):
        engine.score([[1, 2, 3]], responses, mask, temperature=0.7)
    assert engine.llm.calls == []
    torch.testing.assert_close(engine.score([[1, 2, 3]], responses, mask), torch.tensor([[-0.03, -0.04]]))


def test_a_visual_prompt_without_its_template_ids_is_refused():
    bare = VisionPrompt([1, 2], {"pixel_values": torch.zeros(1, 3)})
    with pytest.raises(ValueError, match="unexpanded ids and its images"):
        vllm_request(bare)
    assert vllm_request([4, 5], [6]) == {"prompt_token_ids": [4, 5, 6]}
