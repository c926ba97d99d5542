"""SEED stage 1 on images: SFT rows that carry their frames through the one SFT loop (tether/recipes/sft.py), on tiny
random VLMs of real architectures, and the whole stage on visual Sokoban."""

from __future__ import annotations

import json
import math

import pytest
import torch
from PIL import Image

from tests.models.helpers import sokoban_frames
from tests.rollout.helpers import seed_sft_config
from tether.config import SFTSettings
from tether.envs import IMAGE_PLACEHOLDER, make_env
from tether.models.vision import (
    VisionPrompt,
    chat_content,
    pixel_inputs,
    tiny_vlm,
)
from tether.recipes.seed_sft import run_skill_sft
from tether.recipes.sft import evaluate_nll, nll_sum, train_sft
from tether.sft_data import Example, encode_examples, row_example, write_examples


def _examples() -> list[Example]:
    a, b = sokoban_frames()
    return [Example("Step 0\nObservation: <image>\nStep 1\nObservation: <image>\nAnalyze.",
                    '{"episode_skill": "push the box left"}', images=(a, b)),
            Example("Step 0\nObservation: <image>\nAnalyze.", '{"episode_skill": "avoid walls"}', images=(b,))]


def test_an_image_row_holds_the_processors_pixels_for_its_images(vlm):
    _, processor = vlm
    ex = _examples()[0]
    ((prompt, response),), dropped = encode_examples([ex], processor, max_length=4096)
    assert isinstance(prompt, VisionPrompt) and dropped == 0
    rendered = processor.apply_chat_template([{"role": "user", "content": chat_content(ex.prompt)}],
                                             add_generation_prompt=True, tokenize=False)
    want = processor(text=[rendered], images=[list(ex.images)], add_special_tokens=False, return_tensors="pt")
    assert list(prompt) == want["input_ids"][0].tolist()
    assert prompt.pixels.keys() and all(torch.equal(prompt.pixels[k], want[k]) for k in prompt.pixels)
    tokenizer = processor.tokenizer
    assert response == [*tokenizer(ex.response, add_special_tokens=False).input_ids, tokenizer.eos_token_id]


def test_image_rows_with_a_text_tokenizer_are_refused(tokenizer):
    with pytest.raises(ValueError, match="carries images, but the model came with a text tokenizer"):
        encode_examples(_examples(), tokenizer, max_length=4096)


def test_the_loss_is_transformers_own_on_the_response_tokens_alone():
    model, processor = tiny_vlm("qwen2_5_vl", seed=0)
    ((prompt, response),), _ = encode_examples(_examples()[:1], processor, max_length=4096)
    ids = torch.tensor([[*prompt, *response]])
    labels = ids.clone()
    labels[0, :len(prompt)] = -100  # transformers' loss, with the prompt masked out
    kwargs = pixel_inputs([prompt], "cpu") | {"mm_token_type_ids": (ids == model.config.image_token_id).long()}
    with torch.no_grad():
        want = model(input_ids=ids, labels=labels, **kwargs).loss * len(response)
        got = nll_sum(model, [(prompt, response)], processor.tokenizer.pad_token_id)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_sft_steps_on_image_rows_lower_the_loss_and_train_the_vision_tower(vlm):
    model, processor = vlm
    model = type(model)(model.config).eval()  # a fresh copy: the module-scoped model stays untouched
    model.load_state_dict(vlm[0].state_dict())
    rows, _ = encode_examples(_examples(), processor, max_length=4096)
    pad = processor.tokenizer.pad_token_id
    before_loss = evaluate_nll(model, rows, pad, micro=2)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    settings = SFTSettings(epochs=6, batch_size=2, micro_batch_size=1, lr=3e-3, warmup_ratio=0.0)
    result = train_sft(model, processor, rows, rows, settings)
    moved = {n for n, p in model.named_parameters() if not torch.equal(before[n], p.detach())}
    assert result["steps"] == 6 and result["val_loss"] < before_loss - 0.5
    assert any("visual" in n or "vision" in n for n in moved)  # the gradient reaches the image tower
    assert any("lm_head" in n or "language_model" in n or "text_model" in n for n in moved)


def test_written_image_rows_read_back_pixel_for_pixel(tmp_path):
    examples = _examples()
    write_examples(tmp_path / "train.jsonl", examples)
    rows = [json.loads(line) for line in (tmp_path / "train.jsonl").read_text().splitlines()]
    assert rows[0]["images"] == ["frames/train-0-0.png", "frames/train-0-1.png"]
    back = [row_example(row, tmp_path) for row in rows]
    for got, want in zip(back, examples, strict=True):
        assert (got.prompt, got.response) == (want.prompt, want.response)
        assert [im.tobytes() for im in got.images] == [im.tobytes() for im in want.images]


def test_stage_one_on_visual_sokoban_trains_on_the_episodes_frames(tmp_path):
    model, processor = tiny_vlm("qwen2_5_vl", seed=0)
    cfg = seed_sft_config(tmp_path, "env.max_turns=2", "env.history=1", "rollout.max_new_tokens=4",
                          f"run_dir={tmp_path / 'sft'}",
                          env={"name": "sokoban_visual", "kwargs": {"max_solution_steps": 4}},
                          methods={"seed": {"analysis_max_new_tokens": 4}},
                          sft={"tasks": 2, "rollouts_per_task": 1, "epochs": 1, "batch_size": 2,
                               "micro_batch_size": 1, "eval_examples": 1, "val_fraction": 0.0})
    summary = run_skill_sft(cfg, policy=model, tokenizer=processor)  # rollouts and the probe with the tiny VLM
    assert summary["kept"] == summary["trajectories"] == summary["train_examples"] == 2  # rule analyses parse
    assert summary["steps"] == 1 and math.isfinite(summary["train_loss"])
    assert not math.isnan(summary["parse_rate_after"])  # the probe analysed a prompt with its frames
    data = tmp_path / "sft" / "data"
    records = [json.loads(line) for line in (data / "records.jsonl").read_text().splitlines()]
    for row in (json.loads(line) for line in (data / "train.jsonl").read_text().splitlines()):
        # seed_visual: one frame per step, each where that step's observation was
        record = next(r for r in records if r["prompt"] == row["prompt"])
        assert len(row["images"]) == row["prompt"].count(IMAGE_PLACEHOLDER) == record["turns"] == record["images"]
        with Image.open(data / row["images"][0]) as frame:
            start = make_env("sokoban_visual", max_solution_steps=4)
            seen = start.reset(start.train_seeds(2)[records.index(record)]).observation.images[0]
            assert frame.convert("RGB").tobytes() == seen.tobytes()


def test_tether_sft_trains_on_jsonl_rows_with_images(tmp_path):
    from tether.config import load_command_config
    from tether.recipes.sft import run_sft

    write_examples(tmp_path / "pairs.jsonl", _examples())
    cfg = load_command_config("sft", data={
        "run_dir": str(tmp_path / "sft"), "model": {"name": "tiny-idefics3"}, "env": {"name": "sokoban_visual"},
        "logging": {"tensorboard": False}, "train": {"device": "cpu"},
        "sft": {"data": "jsonl", "path": str(tmp_path / "pairs.jsonl"), "val_fraction": 0.0, "batch_size": 2,
                "micro_batch_size": 1, "epochs": 1}})
    model, processor = tiny_vlm("idefics3", seed=0)
    summary = run_sft(cfg, policy=model, tokenizer=processor)
    assert summary["train_examples"] == 2 and summary["steps"] == 1 and math.isfinite(summary["train_loss"])
    rows = [json.loads(line) for line in (tmp_path / "sft" / "data" / "train.jsonl").read_text().splitlines()]
    assert sorted(len(r["images"]) for r in rows) == [1, 2]  # the run's own record of its pairs keeps the frames


def test_prompt_tokens_keeps_the_end_of_a_text_prompt_and_never_cuts_an_image_prompt(vlm, tokenizer):
    # stage 1 trains on the analyzer prompts stage 2 feeds: left-truncated, images whole
    from tether.models import encode_chat

    text = Example("Step 0\nObservation: a long trajectory " * 20 + "Analyze.", '{"episode_skill": "x"}')
    full = encode_chat(tokenizer, text.prompt)
    ((cut, _),), _ = encode_examples([text], tokenizer, max_length=4096, prompt_tokens=16)
    assert cut == full[-16:] and len(full) > 16
    assert encode_examples([text], tokenizer, max_length=4096)[0][0][0] == full
    _, processor = vlm
    image = _examples()[1]
    ((prompt, _),), _ = encode_examples([image], processor, max_length=4096, prompt_tokens=4)
    assert list(prompt) == list(encode_examples([image], processor, max_length=4096)[0][0][0]) and len(prompt) > 4
