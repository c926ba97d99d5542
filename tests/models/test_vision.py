"""Vision-language policies (tether/models/vision.py): visual prompts through the HF engine and the
log-prob forward, against transformers' own forward, on tiny random models of real architectures."""

from __future__ import annotations

import pickle

import pytest
import torch

from tests.models.helpers import sokoban_frames
from tether.engine.base import InterventionStep, SamplingParams
from tether.engine.hf import HFEngine
from tether.models.forward import distinct_prompts, response_log_probs
from tether.models.vision import (
    VisionPrompt,
    chat_content,
    encode_vision_chat,
    pixel_inputs,
    tiny_vlm,
)


def _prompts(processor) -> list[VisionPrompt]:
    """Four rows: two frames, a copy of the first row (a group), and a longer text with both frames."""
    a, b = sokoban_frames()
    first = encode_vision_chat(processor, "Where is the box? <image>", [a])
    return [first, encode_vision_chat(processor, "Where is the box? <image>", [b]),
            encode_vision_chat(processor, "Where is the box? <image>", [a]),
            encode_vision_chat(processor, "Compare <image> and then <image> please, step by step.", [a, b])]


def test_chat_content_puts_image_slots_where_the_placeholders_are():
    assert chat_content("<image>\nFormula: 5") == [{"type": "image"}, {"type": "text", "text": "\nFormula: 5"}]


def test_encoded_prompt_expands_image_tokens_and_keys_on_pixels(vlm):
    model, processor = vlm
    rows = _prompts(processor)
    image_id = model.config.image_token_id
    per_image = rows[0].count(image_id)
    assert per_image > 1 and rows[3].count(image_id) == 2 * per_image
    assert list(rows[0]) == list(rows[1]) and rows[0].pixels_key != rows[1].pixels_key  # same tokens, other image
    assert distinct_prompts(rows)[1] == [0, 1, 0, 2]
    with pytest.raises(ValueError, match="1 image placeholders for 2 images"):
        encode_vision_chat(processor, "<image>", sokoban_frames())


def _reference_log_probs(model, prompt: VisionPrompt, response: list[int]) -> torch.Tensor:
    """transformers' own forward of one row (its own positions, its own batching of one image set)."""
    ids = torch.tensor([list(prompt) + response])
    kwargs = dict(pixel_inputs([prompt], "cpu"))
    if "image_grid_thw" in kwargs:  # Qwen's processor marks image tokens for the model's rope index
        kwargs["mm_token_type_ids"] = (ids == model.config.image_token_id).long()
    with torch.no_grad():
        logits = model(input_ids=ids, **kwargs).logits[0].float()
    lp = logits.log_softmax(-1)[len(prompt) - 1:-1]
    return lp.gather(1, torch.tensor(response)[:, None]).squeeze(1)


def test_engine_samples_with_images_and_logs_transformers_log_probs(vlm):
    model, processor = vlm
    rows = _prompts(processor)
    engine = HFEngine(model, processor, eos_token_ids=[], compact_below=0.5)
    gen = engine.generate(rows, SamplingParams(max_new_tokens=6, temperature=1.0), seed=3)
    assert gen.response_ids.shape == (4, 6)
    for i, prompt in enumerate(rows):
        ref = _reference_log_probs(model, prompt, gen.response_ids[i].tolist())
        torch.testing.assert_close(gen.sample_log_probs[i], ref, atol=2e-5, rtol=1e-4)
    # the forward behind training takes the same pixels: batched equals per row equals the engine
    batched, _ = response_log_probs(model, rows, gen.response_ids, gen.response_mask)
    for i, prompt in enumerate(rows):
        alone, _ = response_log_probs(model, [prompt], gen.response_ids[i:i + 1], gen.response_mask[i:i + 1])
        torch.testing.assert_close(batched[i], alone[0], atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(batched, gen.sample_log_probs, atol=2e-5, rtol=1e-4)


def test_images_change_the_policy(vlm):
    model, processor = vlm
    rows = _prompts(processor)
    gen = HFEngine(model, processor, eos_token_ids=[]).generate(rows[:2], SamplingParams(max_new_tokens=3),
                                                                 seed=0)
    same_response = gen.response_ids[:1].expand(2, -1)
    lp, _ = response_log_probs(model, rows[:2], same_response, gen.response_mask[:1].expand(2, -1))
    assert not torch.allclose(lp[0], lp[1])  # identical tokens, different frames


def test_log_prob_forward_has_gradients_into_the_vision_tower(vlm):
    model, processor = vlm
    rows = _prompts(processor)[:2]
    model.train()
    try:
        lp, _ = response_log_probs(model, rows, torch.tensor([[5, 6], [7, 8]]), torch.ones(2, 2))
        lp.sum().backward()
    finally:
        model.eval()
    vision = [p for n, p in model.named_parameters() if "visual" in n or "vision" in n]
    assert vision and any(p.grad is not None and p.grad.abs().sum() > 0 for p in vision)
    model.zero_grad(set_to_none=True)


def test_images_for_a_text_model_are_a_clear_error(tiny_policy):
    _, processor = tiny_vlm("idefics3")
    text_model, tokenizer = tiny_policy
    rows = _prompts(processor)[:1]
    with pytest.raises(ValueError, match="has no vision tower"):
        response_log_probs(text_model, rows, torch.tensor([[5]]), torch.ones(1, 1))
    with pytest.raises(ValueError, match="has no vision tower"):
        HFEngine(text_model, tokenizer).generate(rows, SamplingParams(max_new_tokens=1), seed=0)


@pytest.mark.parametrize("family", ["idefics3", "qwen2_5_vl"])
def test_load_policy_reads_a_saved_vlm_through_the_auto_classes(tmp_path, family):
    """A tiny-qwen2.5-vl checkpoint's processor (image-only: no torchvision here) read back as its bare tokenizer,
    and `tether eval` of the run died in an AttributeError."""
    from tether.models import load_policy

    model, processor = tiny_vlm(family, seed=1)
    model.save_pretrained(tmp_path)
    processor.save_pretrained(tmp_path)
    loaded, loaded_processor = load_policy(str(tmp_path))
    assert type(loaded) is type(model) and type(loaded_processor) is type(processor)
    assert loaded_processor.tokenizer.padding_side == "left"
    rows = [encode_vision_chat(loaded_processor, "Where? <image>", sokoban_frames()[:1])]
    assert list(rows[0]) == list(encode_vision_chat(processor, "Where? <image>", sokoban_frames()[:1]))
    response = torch.tensor([[5, 6, 7]])
    ours, _ = response_log_probs(loaded, rows, response, torch.ones(1, 3))
    theirs, _ = response_log_probs(model, rows, response, torch.ones(1, 3))
    torch.testing.assert_close(ours, theirs)


class ForceToken:
    """Forces ``token`` in row 0 at step 1, drawn from the policy's own distribution (so mu = pi)."""

    def __init__(self, token: int) -> None:
        self.token = token

    def start(self, prompt_ids):
        self.t, self.prompts = 0, prompt_ids

    def step(self, policy_log_probs, active):
        forced = torch.full((policy_log_probs.shape[0],), -1)
        if self.t == 1:
            forced[0] = self.token
        return InterventionStep(behaviour_log_probs=policy_log_probs, forced_tokens=forced)

    def advance(self, tokens):
        self.t += 1

    def finish(self):
        return {}


def test_intervention_hook_runs_unchanged_with_images(vlm):
    model, processor = vlm
    rows = _prompts(processor)[:2]
    hook = ForceToken(token=42)
    gen = HFEngine(model, processor, eos_token_ids=[]).generate(rows, SamplingParams(max_new_tokens=4), seed=1,
                                                                intervention=hook)
    assert hook.prompts is rows and gen.response_ids[0, 1] == 42
    for i, prompt in enumerate(rows):  # the decoding after the forced token still sees the image
        ref = _reference_log_probs(model, prompt, gen.response_ids[i].tolist())
        torch.testing.assert_close(gen.sample_log_probs[i], ref, atol=2e-5, rtol=1e-4)


def test_a_sampled_image_token_in_the_response_is_text_to_the_update_as_to_the_engine(vlm):
    # A random policy samples its image token (configs/agents/sokoban_visual_grpo.yaml's step 4 did): the engine
    # decodes it as text, so the update must not count it as one more image placeholder.
    model, processor = vlm
    rows = _prompts(processor)[:2]
    image_id = model.config.image_token_id
    gen = HFEngine(model, processor, eos_token_ids=[]).generate(rows, SamplingParams(max_new_tokens=4), seed=1,
                                                                intervention=ForceToken(token=image_id))
    assert gen.response_ids[0, 1] == image_id
    lp, _ = response_log_probs(model, rows, gen.response_ids, gen.response_mask)
    torch.testing.assert_close(lp, gen.sample_log_probs, atol=2e-5, rtol=1e-4)


def test_vision_prompt_survives_pickling():
    _, processor = tiny_vlm("idefics3")
    prompt = _prompts(processor)[0]
    back = pickle.loads(pickle.dumps(prompt))  # Ray ships prompts to engine actors this way
    assert list(back) == list(prompt) and back.pixels_key == prompt.pixels_key
    assert torch.equal(back.pixels["pixel_values"], prompt.pixels["pixel_values"])
