"""Vision-language policies: prompts that carry images, their pixel inputs, and the model families' positions.

A visual prompt is a :class:`VisionPrompt`: the token ids the model's processor made (each image's
placeholder already expanded to the image's token count) plus the processed pixel tensors those tokens
refer to. It *is* a ``list[int]``, so it flows unchanged wherever prompt ids flow (the collector's rows,
:class:`~tether.rollout.batch.RolloutBatch`'s ``select``/``concat``, the trainer's micro-batches); the two
places that run the model, the HF engine and :func:`tether.models.forward.response_log_probs`, look for its
pixels. Images are processed once, when the prompt is encoded; every later forward reuses the tensors.

Pixel tensors of several rows are collated the way each family's processor batches them
(:func:`pixel_inputs`): tensors with a leading image axis (Qwen2-VL's flattened patches ``[P, D]`` and
``image_grid_thw [n, 3]``) are concatenated; per-row tensors (Idefics3 / SmolVLM's ``pixel_values [1, n,
C, H, W]`` and ``pixel_attention_mask``) are padded with all-zero images, which those models skip.

Positions: Qwen2-VL and Qwen2.5-VL use multimodal RoPE (3-D positions over an image's grid); their
positions come from the model's own ``get_rope_index`` (:func:`prompt_positions`), laid out as
transformers' ``generate`` passes them (``[4, N, L]``: text positions, then the three rotary axes). A
token after the prompt sits at its text position plus the row's offset (``rope_deltas``). Other families
use plain positions.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch import Tensor

from tether.envs.base import IMAGE_PLACEHOLDER, Observation

# Processor outputs that are not pixel inputs: the token ids are the prompt itself, and the mask and
# Qwen's token types are rebuilt for whatever batch the prompt ends up in.
_TEXT_KEYS = frozenset({"input_ids", "attention_mask", "mm_token_type_ids", "token_type_ids"})


class VisionPrompt(list):
    """Prompt token ids (a ``list[int]``) with the processed pixel inputs their image tokens refer to.

    Attributes:
        pixels: the processor's pixel tensors for this one prompt (CPU), e.g. ``pixel_values`` and
            ``image_grid_thw``.
        pixels_key: a digest of the pixels: two prompts with the same ids and key are the same prompt
            (a GRPO group's copies), which the engine and the forward run once.
        message: the user message it encodes (with its image placeholders), or None.
        images: the PIL images it was encoded with: a method that rewrites the message (SEED's skill
            insertion) encodes the new message with the same images.
        template_ids: the chat-templated ids *before* the processor expanded each image's placeholder
            (one placeholder per image, as the chat template writes it), or None. vLLM takes these with
            the PIL images and expands the placeholders itself (:mod:`tether.engine.vllm`).
    """

    def __init__(self, ids: Sequence[int], pixels: dict[str, Tensor], *, message: str | None = None,
                 images: Sequence[Any] = (), template_ids: Sequence[int] | None = None) -> None:
        super().__init__(int(i) for i in ids)
        self.pixels, self.message, self.images = pixels, message, tuple(images)
        self.template_ids = None if template_ids is None else [int(i) for i in template_ids]
        digest = hashlib.sha1()
        for name in sorted(pixels):
            digest.update(name.encode())
            digest.update(pixels[name].numpy().tobytes())
        self.pixels_key = digest.hexdigest()


def observation_images(observations: Sequence[Any]) -> list[Any]:
    """The images of a sequence of observations (text observations have none), in order."""
    return [image for obs in observations if isinstance(obs, Observation) for image in obs.images]


def encode_message(tokenizer_or_processor: Any, text: str, images: Sequence[Any] = ()) -> list[int]:
    """:func:`encode_vision_chat` when there are images, else :func:`tether.models.encode_chat`."""
    from tether.models.chat import encode_chat

    if images:
        return encode_vision_chat(tokenizer_or_processor, text, images)
    return encode_chat(tokenizer_or_processor, text)


def has_images(prompts: Sequence[Sequence[int]]) -> bool:
    """True when any prompt carries pixel inputs."""
    return any(isinstance(p, VisionPrompt) for p in prompts)


def is_processor(tokenizer_or_processor: Any) -> bool:
    """True for a multimodal processor (it has an image processor), False for a plain tokenizer."""
    return getattr(tokenizer_or_processor, "image_processor", None) is not None


def text_tokenizer(tokenizer_or_processor: Any) -> Any:
    """The tokenizer inside a processor, or the tokenizer itself."""
    return getattr(tokenizer_or_processor, "tokenizer", None) or tokenizer_or_processor


def chat_content(text: str) -> list[dict[str, str]]:
    """A message's content parts: text, with an image slot where each :data:`IMAGE_PLACEHOLDER` was.

    >>> chat_content("See <image> now")
    [{'type': 'text', 'text': 'See '}, {'type': 'image'}, {'type': 'text', 'text': ' now'}]
    """
    parts: list[dict[str, str]] = []
    for i, piece in enumerate(text.split(IMAGE_PLACEHOLDER)):
        if i:
            parts.append({"type": "image"})
        if piece:
            parts.append({"type": "text", "text": piece})
    return parts


def encode_vision_chat(processor: Any, text: str, images: Sequence[Any]) -> VisionPrompt:
    """A one-user-message chat prompt with images, through the model's own processor and chat template.

    Args:
        processor: a transformers multimodal processor (``AutoProcessor``) with a chat template.
        text: the message, with one :data:`IMAGE_PLACEHOLDER` per image.
        images: PIL images, in the order of the placeholders.

    Returns:
        The prompt's token ids, ending where the assistant's reply begins, with its pixel inputs (and the
        same ids before the placeholders were expanded, ``template_ids``).

    Raises:
        ValueError: placeholders and images differ in number.
    """
    if text.count(IMAGE_PLACEHOLDER) != len(images):
        raise ValueError(f"{text.count(IMAGE_PLACEHOLDER)} image placeholders for {len(images)} images")
    prompt = encode_vision_messages(processor, [{"role": "user", "content": chat_content(text)}], images)
    prompt.message = text
    return prompt


def image_parts(messages: Sequence[dict[str, Any]]) -> int:
    """How many image parts (``{"type": "image"}``) the messages' contents hold."""
    return sum(isinstance(part, dict) and part.get("type") == "image" for m in messages
               if isinstance(m["content"], list) for part in m["content"])


def encode_vision_messages(processor: Any, messages: Sequence[dict[str, Any]], images: Sequence[Any]) -> VisionPrompt:
    """A chat prompt whose contents hold image parts (``{"type": "image"}``), through the model's own processor and
    chat template: the rendering of :func:`encode_vision_chat`, for a whole conversation.

    Args:
        processor: a transformers multimodal processor (``AutoProcessor``) with a chat template.
        messages: ``{"role", "content"}`` dicts; a content is a string or parts (text and image). A string becomes
            one text part: multimodal templates loop over the parts (SmolVLM's would loop over a string's letters).
            Each part goes to the template with its type and text alone: Qwen2-VL's takes any part with an
            ``image`` key for an image, and Arrow gives a data set's text parts ``"image": None``.
        images: PIL images, one per image part, in order.

    Returns:
        As :func:`encode_vision_chat` (``message`` None).

    Raises:
        ValueError: image parts and images differ in number.
    """
    if image_parts(messages) != len(images):
        raise ValueError(f"{image_parts(messages)} image parts for {len(images)} images")
    parts = [{"role": m["role"], "content": [{"type": "text", "text": m["content"]}] if isinstance(m["content"], str)
              else [{"type": "image"} if p["type"] == "image" else {"type": "text", "text": p["text"]}
                    for p in m["content"]]} for m in messages]
    rendered = processor.apply_chat_template(parts, add_generation_prompt=True, tokenize=False)
    # The template writes its own special tokens; images go as one sample's list, as every processor takes them.
    out = processor(text=[rendered], images=[list(images)] if images else None, add_special_tokens=False,
                    return_tensors="pt")
    pixels = {k: v for k, v in out.items() if k not in _TEXT_KEYS and isinstance(v, Tensor)}
    unexpanded = text_tokenizer(processor)(rendered, add_special_tokens=False).input_ids
    return VisionPrompt(out["input_ids"][0].tolist(), pixels, images=images, template_ids=unexpanded)


def pixel_inputs(prompts: Sequence[Sequence[int]], device: torch.device | str,
                 names: Sequence[str] | None = None) -> dict[str, Tensor]:
    """The pixel keyword arguments of a batch of prompts, collated as the family's processor batches them
    (only ``names``, when given).

    Tensors of 4 or more dimensions are per row (``[1, n_images, ...]``): padded with zeros to the most
    images and stacked. Lower-dimensional ones are per image or per patch and are concatenated.
    Prompts without images add nothing (or zero padding).
    """
    rows = [p.pixels if isinstance(p, VisionPrompt) else {} for p in prompts]
    names = sorted({k for r in rows for k in r} if names is None else {k for r in rows for k in r} & set(names))
    out = {}
    for name in names:
        present = [r[name] for r in rows if name in r]
        if present[0].dim() >= 4:
            n = max(t.shape[1] for t in present)
            blank = present[0].new_zeros(1, n, *present[0].shape[2:])
            out[name] = torch.cat([_pad_images(r.get(name, blank), n) for r in rows])
        else:
            out[name] = torch.cat(present)
    return {k: v.to(device) for k, v in out.items()}


def _pad_images(x: Tensor, n: int) -> Tensor:
    if x.shape[1] == n:
        return x
    return torch.cat([x, x.new_zeros(x.shape[0], n - x.shape[1], *x.shape[2:])], dim=1)


def check_vision_model(model: Any) -> None:
    """Raise ValueError unless ``model`` can take images (its config has a vision tower)."""
    if getattr(model.config, "vision_config", None) is None:
        raise ValueError(f"the prompts carry images, but the model ({type(model).__name__}, model_type "
                         f"{getattr(model.config, 'model_type', '?')!r}) has no vision tower; use a vision-language "
                         "model (e.g. Qwen/Qwen2.5-VL-3B-Instruct) or the env's observation='text'")


def _rope_index_owner(model: Any) -> Any:
    """The module with Qwen-VL's ``get_rope_index`` (the base model), or None for plain positions."""
    base = getattr(model, getattr(model, "base_model_prefix", ""), model)
    return base if hasattr(base, "get_rope_index") else None


def prompt_positions(model: Any, prompts: Sequence[Sequence[int]], input_ids: Tensor, attention_mask: Tensor,
                     position_ids: Tensor) -> tuple[Tensor, Tensor]:
    """Positions of a padded batch of visual prompts, and each row's offset for the tokens after them.

    Args:
        model: the vision-language model.
        prompts: the N rows' prompts (their images' grids place the image tokens).
        input_ids, attention_mask, position_ids: ``[N, L]``, the text positions counted from the mask.

    Returns:
        (``position_ids``: unchanged for plain families, ``[4, N, L]`` for multimodal RoPE; ``offsets [N]``:
        what a later token adds to its text position, 0 for plain families).
    """
    owner = _rope_index_owner(model)
    grids = pixel_inputs(prompts, input_ids.device, names=("image_grid_thw",))
    if owner is None or "image_grid_thw" not in grids:
        return position_ids, torch.zeros(input_ids.shape[0], dtype=torch.long, device=input_ids.device)
    image_tokens = (input_ids == model.config.image_token_id).long()  # what the processor's token types mark
    rope, deltas = owner.get_rope_index(input_ids, image_tokens, image_grid_thw=grids["image_grid_thw"],
                                        attention_mask=attention_mask)
    return torch.cat([position_ids[None], rope.to(position_ids)]), deltas.view(-1).to(position_ids)


@contextlib.contextmanager
def prompt_only_placeholders(model: Any, input_ids: Tensor, prompt_part: Tensor) -> Iterator[Tensor]:
    """Within the block, the model's input embeddings embed ``input_ids`` as they are; yields the ids to pass
    it, in which only the prompt's image tokens are image tokens.

    A policy may sample its image token (a random or early policy does): the engine decoded it as text, its
    own embedding at a text position, since only the prefill takes pixels. The model's forward counts image
    tokens over the whole row (and the rope index marks them), so a row with one in its response would have
    more placeholders than image features. Those response tokens become the pad id in the ids the model
    matches against, while a pre-hook on its input embeddings hands them the real ids (the families' forwards
    take ``input_ids`` or ``inputs_embeds``, not both). The embedding itself still runs inside the model's
    forward: after a sharded model gathers its weights, under a LoRA view's adapter state. Rows without such a
    token pass through untouched.

    Args:
        model: the vision-language model.
        input_ids: ``[N, L]`` prompt and response ids.
        prompt_part: ``[N, L]`` bool, True on prompt tokens.
    """
    in_response = (input_ids == model.config.image_token_id) & ~prompt_part
    if not bool(in_response.any()):
        yield input_ids
        return
    masked = input_ids.masked_fill(in_response, model.config.get_text_config().pad_token_id or 0)

    def real_ids(module: Any, args: tuple[Any, ...]) -> tuple[Any, ...] | None:
        ids = args[0] if args else None
        if isinstance(ids, Tensor) and ids.shape == masked.shape and torch.equal(ids, masked):
            return (input_ids, *args[1:])
        return None

    handle = model.get_input_embeddings().register_forward_pre_hook(real_ids)
    try:
        yield masked
    finally:
        handle.remove()


def vision_logits(model: Any, prompts: Sequence[Sequence[int]], input_ids: Tensor, attention_mask: Tensor,
                  position_ids: Tensor, prompt_part: Tensor) -> Tensor:
    """The logits ``[N, L, V]`` of a vision-language model over padded ``[prompt | response]`` rows: each row's
    pixels once, as the engine's prefill took them, the positions of :func:`prompt_positions`, and image tokens
    from the prompts only (:func:`prompt_only_placeholders`).

    Args:
        model: the vision-language model.
        prompts: the N rows' prompts (:class:`VisionPrompt` rows carry the pixels).
        input_ids, attention_mask, position_ids: ``[N, L]``, text positions counted from the mask.
        prompt_part: ``[N, L]`` bool, True on prompt tokens.
    """
    pixels = pixel_inputs(prompts, input_ids.device)
    with prompt_only_placeholders(model, input_ids, prompt_part) as ids:
        positions, _ = prompt_positions(model, prompts, ids, attention_mask, position_ids)
        return model(input_ids=ids, attention_mask=attention_mask, position_ids=positions, use_cache=False,
                     **pixels).logits


def later_positions(position_ids: Tensor, offsets: Tensor) -> Tensor:
    """Multimodal-RoPE positions ``[4, N, K]`` of tokens after the prompt, from their text positions ``[N, K]``."""
    rope = (position_ids + offsets[:, None])[None].expand(3, -1, -1)
    return torch.cat([position_ids[None], rope])


def uses_multimodal_rope(positions: Tensor) -> bool:
    """True for the ``[4, N, L]`` layout of :func:`prompt_positions`."""
    return positions.dim() == 3


def load_vision_policy(name_or_path: str, *, dtype: torch.dtype) -> tuple[Any, Any]:
    """A vision-language model and its processor, through transformers' Auto classes (offline, as
    :func:`tether.models.load_policy`). Returns (model in eval mode, processor whose tokenizer pads on the left)."""
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from tether.models.loading import prepare_tokenizer

    model = AutoModelForImageTextToText.from_pretrained(name_or_path, dtype=dtype)
    processor = AutoProcessor.from_pretrained(name_or_path)
    if not hasattr(processor, "image_processor") and model.config.model_type == "qwen2_5_vl":
        # a Qwen2.5-VL processor saved without its video processor (tether's image-only one, as every checkpoint of
        # tiny-qwen2.5-vl) reads back as its bare tokenizer where torchvision is missing
        processor = _image_only_qwen_processor().from_pretrained(name_or_path)
    if not hasattr(processor, "image_processor"):  # model_load_errors makes it one line naming the key
        raise OSError(f"{name_or_path}: its processor loads as a bare tokenizer (no image processor); a "
                      "vision-language policy needs its processor saved beside it (processor.save_pretrained)")
    prepare_tokenizer(processor.tokenizer)
    return model.eval(), processor


# -- tiny random models of real architectures, for tests and CPU smoke runs ------------------------

# A ChatML template over content parts: what the families' own templates render, minus their system prompts.
TINY_CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m['content'] is string %}{{ m['content'] }}{% else %}{% for c in m['content'] %}"
    "{% if c['type'] == 'image' %}{{ image_slot }}{% else %}{{ c['text'] }}{% endif %}{% endfor %}{% endif %}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")

TINY_VLM_FAMILIES = ("qwen2_5_vl", "idefics3")
TINY_VLM_CONTEXT = 4096  # max_position_embeddings of both tiny VLMs' text models


def tiny_vlm(family: str = "qwen2_5_vl", seed: int = 0, *, tokenizer: Any = None) -> tuple[Any, Any]:
    """A randomly initialised small vision-language model of a real architecture, with its real processor.

    ``qwen2_5_vl``: Qwen2.5-VL (2 text layers of width 64, a 2-block vision tower, images resized to at most
    112x112 pixels = 16 image tokens). ``idefics3``: Idefics3, SmolVLM's architecture (a Llama text model,
    a SigLIP tower on 64x64 images = 4 image tokens). Both use the SmolLM2 tokenizer with the family's image
    tokens added. The global RNG is left untouched.

    Returns:
        (model in eval mode, processor).
    """
    processor = tiny_vlm_processor(family, tokenizer=tokenizer)
    build = _tiny_qwen2_5_vl if family == "qwen2_5_vl" else _tiny_idefics3
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = build(processor)
    return model.eval(), processor


def tiny_vlm_processor(family: str = "qwen2_5_vl", *, tokenizer: Any = None) -> Any:
    """The processor of :func:`tiny_vlm`, built alone (no model): what the context check encodes prompts with."""
    from tether.models.loading import prepare_tokenizer, smollm2_tokenizer

    if family not in TINY_VLM_FAMILIES:
        raise ValueError(f"unknown tiny VLM family {family!r}; known: {', '.join(TINY_VLM_FAMILIES)}")
    tokenizer = prepare_tokenizer(tokenizer if tokenizer is not None else smollm2_tokenizer())
    build = _tiny_qwen2_5_vl_processor if family == "qwen2_5_vl" else _tiny_idefics3_processor
    return build(tokenizer)


def _text_fields(tokenizer: Any) -> dict[str, Any]:
    return dict(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=TINY_VLM_CONTEXT,
                initializer_range=0.1, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                pad_token_id=tokenizer.pad_token_id)


def _tiny_qwen2_5_vl_processor(tokenizer: Any) -> Any:
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    tokenizer.add_special_tokens({"additional_special_tokens": ["<|vision_start|>", "<|vision_end|>",
                                                                "<|image_pad|>", "<|video_pad|>"]})
    template = TINY_CHAT_TEMPLATE.replace("{{ image_slot }}", "<|vision_start|><|image_pad|><|vision_end|>")
    return _image_only_qwen_processor()(image_processor=Qwen2VLImageProcessorPil(min_pixels=28 * 28 * 4,
                                                                                   max_pixels=28 * 28 * 16),
                                          tokenizer=tokenizer, chat_template=template)


def _tiny_qwen2_5_vl(processor: Any) -> Any:
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    tokenizer = processor.tokenizer
    text = _text_fields(tokenizer) | {"rope_scaling": {"type": "mrope", "mrope_section": [2, 3, 3]}}
    vision = dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64,
                  fullatt_block_indexes=[1], window_size=56, patch_size=14, spatial_merge_size=2, temporal_patch_size=2)
    config = Qwen2_5_VLConfig(text_config=text, vision_config=vision, image_token_id=processor.image_token_id,
                              video_token_id=processor.video_token_id,
                              vision_start_token_id=tokenizer.convert_tokens_to_ids("<|vision_start|>"),
                              bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                              pad_token_id=tokenizer.pad_token_id)
    return Qwen2_5_VLForConditionalGeneration(config)


@functools.cache  # one class: a processor read back from a checkpoint is of the type of the one saved
def _image_only_qwen_processor() -> type:
    """Qwen2.5-VL's processor without its video processor.

    transformers requires the video processor, whose class needs torchvision, and this CPU machine's
    torchvision wheels are built for CUDA torch. Images never touch it: a processor whose constructor
    does not take one (transformers reads a processor's parts from its ``__init__`` signature) encodes
    images exactly as the full one, and saves without it.
    """
    from transformers import Qwen2_5_VLProcessor

    class ImageOnlyQwen2_5_VLProcessor(Qwen2_5_VLProcessor):
        def __init__(self, image_processor: Any = None, tokenizer: Any = None, chat_template: Any = None,
                     **kwargs: Any) -> None:
            super().__init__(image_processor, tokenizer, None, chat_template=chat_template, **kwargs)

    return ImageOnlyQwen2_5_VLProcessor


def _tiny_idefics3_processor(tokenizer: Any) -> Any:
    from transformers import Idefics3Processor
    from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil

    tokenizer.add_special_tokens({"additional_special_tokens": ["<fake_token_around_image>", "<image>",
                                                                "<global-img>"]})
    image_processor = Idefics3ImageProcessorPil(do_image_splitting=False, size={"longest_edge": 64},
                                                max_image_size={"longest_edge": 64})
    return Idefics3Processor(image_processor=image_processor, tokenizer=tokenizer, image_seq_len=4,
                             chat_template=TINY_CHAT_TEMPLATE.replace("{{ image_slot }}", "<image>"))


def _tiny_idefics3(processor: Any) -> Any:
    from transformers import Idefics3Config, Idefics3ForConditionalGeneration

    tokenizer = processor.tokenizer
    config = Idefics3Config(text_config={"model_type": "llama", **_text_fields(tokenizer)},
                            vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                               num_attention_heads=2, image_size=64, patch_size=16),
                            image_token_id=tokenizer.convert_tokens_to_ids("<image>"), scale_factor=2,
                            pad_token_id=tokenizer.pad_token_id)
    return Idefics3ForConditionalGeneration(config)
