"""A data set of one's own with images (TRL's ``image``/``images`` columns, image content parts): prompts rendered
by the policy's processor and chat template, an RL step on them, and validate's refusal of a text policy."""

from __future__ import annotations

import json
import math
from pathlib import Path

import datasets
import pytest
import torch
from PIL import Image

from tests.trainer.helpers import tiny_config
from tether.checks import check_config
from tether.config import ConfigError, load_config
from tether.models import load_policy
from tether.models.vision import VisionPrompt
from tether.rollout.single_turn import SingleTurnCollector
from tether.tasks.dataset_task import DatasetTask

COLOURS = [(255, 0, 0), (0, 128, 0), (0, 0, 255), (200, 200, 0), (0, 200, 200), (90, 30, 160)]


def png(folder: Path, i: int) -> Path:
    """A small image of one colour with a white square, saved as ``folder/imgs/<i>.png``."""
    image = Image.new("RGB", (40 + 4 * i, 32), COLOURS[i % len(COLOURS)])
    image.paste((255, 255, 255), (i, 2, i + 8, 10))
    (folder / "imgs").mkdir(parents=True, exist_ok=True)
    path = folder / "imgs" / f"{i}.png"
    image.save(path)
    return path


def image_rows(folder: Path, n: int = 6) -> list[dict]:
    """Rows whose ``image`` is a path relative to the data file, all with the same question."""
    return [{"prompt": "What colour is this?", "image": str(png(folder, i).relative_to(folder)), "answer": str(i)}
            for i in range(n)]


def jsonl(folder: Path, rows: list[dict]) -> Path:
    path = folder / "data.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def reference(processor, messages: list[dict], images: list) -> tuple[list[int], torch.Tensor]:
    """The processor's own encoding of ``messages`` with ``images``: what a Qwen2.5-VL user writes by hand."""
    text = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    out = processor(text=[text], images=[images], add_special_tokens=False, return_tensors="pt")
    return out["input_ids"][0].tolist(), out["pixel_values"]


def collector(task: DatasetTask, processor, tmp_path: Path) -> SingleTurnCollector:
    cfg = load_config(data={"run_dir": str(tmp_path / "run"), "task": {"name": "parity"}})
    return SingleTurnCollector(task, processor, cfg)


def opened(path: Path) -> Image.Image:
    with Image.open(path) as image:
        return image.convert("RGB")


@pytest.mark.parametrize("conversational", [False, True])
def test_image_paths_relative_to_the_data_file_place_each_image_before_the_text(tmp_path, conversational):
    """A jsonl row's ``image`` (a path relative to the file, read from another working directory) becomes the user
    message [image, text] (a text prompt's, or a conversation's first user message without image parts), encoded
    exactly as the processor encodes it; rows with the same text and other images are other prompts (neither dropped
    as overlapping nor sharing one encoding), and rewards keep the column as it is."""
    data = tmp_path / "data"
    rows = image_rows(data)
    if conversational:
        rows = [{**row, "prompt": [{"role": "system", "content": "Answer in one word."},
                                   {"role": "user", "content": row["prompt"]}]} for row in rows]
    path = jsonl(data, rows)
    system = None if conversational else "Answer in one word."
    task = DatasetTask(path=str(path), val_size=2, system_prompt=system)
    assert task.image_column == "image" and task.num_overlap_dropped == 0 and len(task.train) == 4
    _, processor = load_policy("tiny-qwen2.5-vl")
    rollouts = collector(task, processor, tmp_path)
    seen = set()
    for item in task.train + task.val:
        i = int(item.answer)
        assert item.images == (str(data / "imgs" / f"{i}.png"),) and item.meta["columns"]["image"] == f"imgs/{i}.png"
        ids = rollouts.prompt_ids(item)
        messages = [{"role": "system", "content": [{"type": "text", "text": "Answer in one word."}]},
                    {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What colour is this?"}]}]
        want_ids, want_pixels = reference(processor, messages, [opened(data / "imgs" / f"{i}.png")])
        assert isinstance(ids, VisionPrompt) and list(ids) == want_ids
        assert torch.equal(ids.pixels["pixel_values"], want_pixels)
        seen.add(ids.pixels_key)
    assert len(seen) == 6


@pytest.mark.parametrize("stored", ["parquet", "save_to_disk"])
def test_an_image_feature_and_image_parts_of_a_conversation(tmp_path, stored):
    """A ``datasets.Dataset`` with an ``images`` column of the Image feature (bytes, as a parquet file or a
    save_to_disk directory holds them) and conversations whose user message has two image parts: each image goes to
    its part, in order, as the processor renders them. The parts are as Arrow stores a Hub data set's, every key on
    every part (``"image": None`` on a text part, which Qwen2-VL's own template would take for an image)."""
    pngs = [png(tmp_path, i) for i in range(7)]
    pictures = [opened(path) for path in pngs]

    def part(kind: str, text: str | None = None) -> dict:
        return {"type": kind, "text": text, "image": None}

    rows = {"prompt": [[{"role": "user", "content": [part("text", "Left:"), part("image"), part("text", "Right:"),
                                                     part("image")]}] for _ in range(6)],
            "images": [[{"bytes": pngs[i].read_bytes()}, {"bytes": pngs[i + 1].read_bytes()}] for i in range(6)],
            "answer": [str(i) for i in range(6)]}
    dataset = datasets.Dataset.from_dict(rows).cast_column("images", datasets.Sequence(datasets.Image()))
    source = tmp_path / ("d.parquet" if stored == "parquet" else "saved")
    dataset.to_parquet(source) if stored == "parquet" else dataset.save_to_disk(source)
    for png_file in pngs:
        png_file.unlink()  # the data holds the images' bytes
    task = DatasetTask(path=str(source), val_size=2)
    assert task.image_column == "images"
    _, processor = load_policy("tiny-idefics3")
    rule = "c['type'] == 'image'"
    assert rule in processor.chat_template
    processor.chat_template = processor.chat_template.replace(rule, f"{rule} or 'image' in c")  # Qwen2-VL's own rule
    item = task.train[0]
    i = int(item.answer)
    assert all(isinstance(image, bytes) for image in item.images)
    ids = collector(task, processor, tmp_path).prompt_ids(item)
    clean = [{"role": "user", "content": [{"type": "text", "text": "Left:"}, {"type": "image"},
                                          {"type": "text", "text": "Right:"}, {"type": "image"}]}]
    want_ids, want_pixels = reference(processor, clean, pictures[i:i + 2])
    assert list(ids) == want_ids and torch.equal(ids.pixels["pixel_values"], want_pixels)


def test_one_rl_step_on_an_image_data_set(tmp_path):
    """GRPO on a jsonl of images with a tiny Qwen2.5-VL: the step runs, and the vision tower learns."""
    path = jsonl(tmp_path, image_rows(tmp_path))
    cfg = tiny_config(tmp_path, "rollout.prompts_per_step=1", "rollout.group_size=2", "rollout.max_new_tokens=4",
                      "algorithm.entropy_coef=0.01", model={"name": "tiny-qwen2.5-vl"},
                      task={"name": "dataset", "kwargs": {"path": str(path), "val_size": 2, "reward_wrong": -1.0,
                                                          "reward_correct": 1.0}})
    from tether.trainer import Trainer

    policy, processor = load_policy("tiny-qwen2.5-vl")
    trainer = Trainer(cfg, policy=policy, tokenizer=processor)
    before = {n: p.detach().clone() for n, p in trainer.policy.named_parameters()}
    metrics = trainer.train_step()
    moved = {n for n, p in trainer.policy.named_parameters() if not torch.equal(before[n], p.detach())}
    assert any("visual" in n for n in moved)
    assert metrics["train/rows"] == 2 and math.isfinite(metrics["actor/pg_loss"])


@pytest.mark.parametrize("text_model", ["char-64x1", "tiny-64x2"])
@pytest.mark.parametrize("conversational", [False, True])
def test_validate_refuses_image_rows_for_a_text_policy_naming_where_they_are(tmp_path, conversational, text_model):
    """An image data set with a text model: one line before any model loads, naming the column (or the messages'
    image parts); a vision-language model passes. A text model with a context (tiny-64x2, SmolLM2) met the prompt
    length check first, which encoded the images with its tokenizer: a TypeError traceback."""
    rows = image_rows(tmp_path)
    if conversational:
        rows = [{"prompt": [{"role": "user", "content": [{"type": "image", "path": row["image"]},
                                                         {"type": "text", "text": row["prompt"]}]}],
                 "answer": row["answer"]} for row in rows]
    data = {"run_dir": str(tmp_path / "run"), "model": {"name": text_model},
            "task": {"name": "dataset", "kwargs": {"path": str(jsonl(tmp_path, rows)), "val_size": 2}}}
    where = "the image parts of its messages" if conversational else "column 'image'"
    with pytest.raises(ConfigError) as err:
        check_config(load_config(data=data))
    assert str(err.value) == (f"task.kwargs: the data's prompts carry images ({where}), but model.name={text_model} "
                              "is a text model (no vision_config): use a vision-language model (e.g. "
                              "Qwen/Qwen2.5-VL-3B-Instruct; tiny-qwen2.5-vl for a smoke run), or a format_fn that "
                              "returns no images")
    data["model"]["name"] = "tiny-qwen2.5-vl"
    check_config(load_config(data=data))


def test_a_missing_or_unreadable_image_is_one_line_naming_the_row(tmp_path):
    rows = image_rows(tmp_path)
    rows[3]["image"] = "imgs/nope.png"
    with pytest.raises(ValueError, match=r"^row 3 of .*data\.jsonl: image: image 0: image file .*imgs/nope\.png does "
                                         r"not exist$"):
        DatasetTask(path=str(jsonl(tmp_path, rows)), val_size=2)
    rows[3]["image"] = "data.jsonl"
    with pytest.raises(ValueError, match=r"^row 3 of .*: image: image 0: .*data\.jsonl: not an image PIL can read"):
        DatasetTask(path=str(jsonl(tmp_path, rows)), val_size=2)
    rows[3]["image"] = "A" * 50_000  # an image's text (base64, say) in a path's place: not printed whole
    with pytest.raises(ValueError, match=r"^row 3 of .*: image: image 0: image file .{200}\.\.\. "
                                         r"\(50[0-9]{3} characters\) does not exist$"):
        DatasetTask(path=str(jsonl(tmp_path, rows)), val_size=2)


@pytest.mark.parametrize("data", ["task", "rejection"])
def test_sft_from_an_image_data_set_is_refused_not_trained_on_its_texts_alone(tmp_path, data):
    """tether sft's examples of a task are its prompts' texts: the images were dropped silently."""
    from tether.config import load_command_config
    from tether.sft_data import sft_examples

    path = jsonl(tmp_path, image_rows(tmp_path))
    sft = {"data": data, **({"sampler": "tiny-qwen2.5-vl"} if data == "rejection" else {})}
    cfg = load_command_config("sft", data={"run_dir": str(tmp_path / "sft"), "model": {"name": "tiny-qwen2.5-vl"},
                                           "task": {"name": "dataset", "kwargs": {"path": str(path), "val_size": 2}},
                                           "sft": sft})
    with pytest.raises(ConfigError, match=rf"^sft\.data={data}: the task's prompts carry images \(image\), which "):
        sft_examples(cfg)


def test_the_collector_refuses_a_text_tokenizer_for_image_rows(tmp_path, tokenizer):
    """Where the policy is brought (tether eval, a script), the collector names the images, not a failure later."""
    task = DatasetTask(path=str(jsonl(tmp_path, image_rows(tmp_path))), val_size=2)
    with pytest.raises(ValueError, match=r"^the task's prompts carry images \(image\), but the policy .* came with a "
                                         r"text tokenizer: use a vision-language model"):
        collector(task, tokenizer, tmp_path)


def test_validate_counts_an_image_prompts_expanded_tokens_against_the_context(tmp_path):
    """A row whose text fits tiny-qwen2.5-vl's context but whose image's tokens push it past: validate refuses it,
    naming the row, its column and the lengths the processor gives (before, validate passed it and the HF engine
    generated past the context without a word)."""
    from tether.models.vision import TINY_VLM_CONTEXT, tiny_vlm_processor

    rows = image_rows(tmp_path, n=4)
    rows[0]["prompt"] = " ".join(["word"] * (TINY_VLM_CONTEXT - 16))
    Image.new("RGB", (112, 112), COLOURS[0]).save(tmp_path / "imgs" / "0.png")  # the most pixels: 16 tokens
    path = jsonl(tmp_path, rows)
    cfg = tiny_config(tmp_path, "rollout.max_new_tokens=4", model={"name": "tiny-qwen2.5-vl"},
                      task={"name": "dataset", "kwargs": {"path": str(path), "val_size": 1}})
    processor = tiny_vlm_processor("qwen2_5_vl")
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": rows[0]["prompt"]}]}]
    want_ids, _ = reference(processor, messages, [opened(tmp_path / "imgs" / "0.png")])
    image_tokens = want_ids.count(processor.image_token_id)
    assert image_tokens == 16 and len(want_ids) - image_tokens < TINY_VLM_CONTEXT < len(want_ids)
    with pytest.raises(ConfigError) as err:
        check_config(cfg)
    assert (f"the prompt at row 0 of {path}, column 'image' (1 image(s): {image_tokens} tokens) is {len(want_ids)} "
            f"tokens with the chat template; the context of tiny-qwen2.5-vl is {TINY_VLM_CONTEXT} tokens"
            ) in str(err.value)


def test_longest_prompts_of_a_data_set_take_the_largest_images_too(tmp_path):
    """An image's tokens grow with its pixels, not the text: the row with the largest image is among the prompts the
    context check encodes even when every other row's text is longer; each comes as the collector sends it."""
    rows = image_rows(tmp_path, n=6)
    for row in rows[1:]:
        row["prompt"] = "a longer question about the picture?"
    Image.new("RGB", (300, 200), (1, 2, 3)).save(tmp_path / "imgs" / "0.png")
    path = jsonl(tmp_path, rows)
    found = DatasetTask.longest_prompts(2, path=str(path), system_prompt="Be brief.", prompt_template="Q: {question}")
    assert [where for where, *_ in found] == [f"row {i} of {path}, column 'image'" for i in (1, 2, 0, 5)]
    assert found[2][1:] == ("Q: What colour is this?", "Be brief.", (str(tmp_path / "imgs" / "0.png"),))
