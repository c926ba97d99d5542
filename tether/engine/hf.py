"""The in-process Hugging Face engine: batched sampling with a KV cache, in our own decoding loop.

``model.generate`` is not used because the engine needs two things it does not give: a per-step
hook into the next-token distribution (:class:`~tether.engine.base.Intervention`) and the exact
log-probability of each sampled token under the distribution it was drawn from.

One decoding step, for all rows at once::

    logits [N, V] -> processed log-probs (temperature, top-k, top-p) -> intervention.step
    -> token (forced, argmax, or sampled with the call's own torch.Generator)
    -> record token, log mu(token), mask -> intervention.advance -> EOS / stop-string check
    -> one forward of the new tokens against the KV cache (logits of the last position only)

Prompts are left-padded, with position ids counted from the attention mask, so a prompt yields the
same tokens alone or in a batch. A row that finishes (EOS, a stop string) is masked out and dropped from
the forward batch and the KV cache (``compact_below``), so a long tail of a few rows decodes at their
batch size, not the call's. Every step draws one uniform per row of the call, dropped or not, so the
tokens and log-probs do not depend on when rows are dropped. The loop ends when every row has finished
or at ``max_new_tokens``. ``decode="static"`` pre-allocates the KV cache instead (rows then stay to the
end), and ``"compiled"`` also captures the one-token forward as CUDA graphs.

Visual prompts (:class:`~tether.models.vision.VisionPrompt`) add their pixel inputs to the prefill only (the
image tokens' keys and values then sit in the cache) and, for multimodal-RoPE families, 3-D positions
(:mod:`tether.models.vision`); decoding is otherwise the same.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from tether.engine.base import Generation, Intervention, SamplingParams
from tether.engine.decoding import (
    can_select_rows,
    choose_tokens,
    default_eos_token_ids,
    fit_width,
    left_pad,
    pad_token_id,
    process_logits,
    response_texts,
    scatter_rows,
    stop_hits,
)
from tether.models.forward import autocast, distinct_prompts, model_cache_kwarg, new_kv_cache, response_log_probs
from tether.models.lora import BaseModelView
from tether.models.vision import (
    check_vision_model,
    has_images,
    later_positions,
    pixel_inputs,
    prompt_positions,
    text_tokenizer,
    uses_multimodal_rope,
)

if TYPE_CHECKING:
    from tether.config import ModelConfig


class KVDecoder:
    """Last-position logits of a causal LM over a KV cache: the forward pass of every decoding loop
    (the engine's, and a lock-step intervention's own model, e.g. EAPO's prior).

    ``compile_step`` runs the one-token forwards through ``torch.compile(mode="reduce-overhead")`` (CUDA
    graphs); it needs a static cache (:meth:`new_cache` with ``max_len``), whose shapes do not change.
    """

    def __init__(self, model: Any, *, bf16_autocast: bool = False, compile_step: bool = False) -> None:
        self.model, self.bf16_autocast = model, bf16_autocast
        self._cache_arg = model_cache_kwarg(model)
        self._keeps_logits = "logits_to_keep" in inspect.signature(model.forward).parameters
        self._step = torch.compile(model.forward, mode="reduce-overhead", dynamic=False) if compile_step else None
        self._static: tuple[tuple[int, int], Any] | None = None  # (max_len, rows), the static cache of that shape

    def new_cache(self, max_len: int | None = None, rows: int = 0) -> Any:
        """A dynamic KV cache, or a static one of ``max_len`` positions for ``rows`` rows.

        A static cache is kept and reset for the next call of the same shape: its tensors' addresses are
        baked into the captured CUDA graphs, so new ones would make the graphs be recorded again.
        """
        if max_len is None:
            return new_kv_cache(self.model.config)
        if self._static is not None and self._static[0] == (max_len, rows):
            self._static[1].reset()
            return self._static[1]
        from transformers import StaticCache

        cache = StaticCache(config=self.model.config, max_cache_len=max_len)  # allocated at its first forward
        self._static = ((max_len, rows), cache)
        return cache

    def prefill(self, prompt_ids: list[list[int]], input_ids: Tensor, attention_mask: Tensor, position_ids: Tensor,
                cache: Any) -> Tensor:
        """:meth:`next_logits` of the left-padded prompts, each distinct prompt run once: a prompt repeated
        over rows (a GRPO group) has its KV cache indexed out to them (a dynamic cache only: a static one
        holds all rows from its first forward). Visual prompts add their pixels; ``position_ids`` may be
        ``[4, N, L]`` (multimodal RoPE)."""
        unique, inverse = distinct_prompts(prompt_ids)
        if len(unique) == len(prompt_ids) or not can_select_rows(cache):
            return self.next_logits(input_ids, attention_mask, position_ids, cache,
                                    **self._pixels(prompt_ids, input_ids.device))
        first_row = dict(zip(reversed(inverse), range(len(inverse) - 1, -1, -1), strict=True))  # prompt -> first row
        first = torch.tensor([first_row[u] for u in range(len(unique))], device=input_ids.device)
        pixels = self._pixels([prompt_ids[i] for i in first.tolist()], input_ids.device)
        logits = self.next_logits(input_ids[first], attention_mask[first], position_ids.index_select(-2, first),
                                  cache, **pixels)
        rows = torch.tensor(inverse, device=input_ids.device)
        cache.batch_select_indices(rows)
        return logits[rows]

    @staticmethod
    def _pixels(prompt_ids: list[list[int]], device: torch.device) -> dict[str, Tensor]:
        return pixel_inputs(prompt_ids, device) if has_images(prompt_ids) else {}

    def next_logits(self, input_ids: Tensor, attention_mask: Tensor, position_ids: Tensor, cache: Any,
                    **pixels: Tensor) -> Tensor:
        """Next-token logits ``[N, V]`` of the last position; appends to ``cache``. ``pixels``: a visual
        prompt's pixel inputs (prefill only)."""
        kwargs = {self._cache_arg: cache, "use_cache": True, **pixels}
        if self._keeps_logits:
            kwargs["logits_to_keep"] = 1
        forward = self.model
        if self._step is not None and input_ids.shape[1] == 1:
            torch.compiler.cudagraph_mark_step_begin()  # the previous step's graph outputs may be overwritten
            forward = self._step
        with autocast(input_ids.device, self.bf16_autocast):
            out = forward(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, **kwargs)
        # a CUDA graph's output lives in memory its next replay overwrites
        return out.logits[:, -1].clone() if forward is self._step else out.logits[:, -1]


DECODE_MODES = ("dynamic", "static", "compiled")
ROW_MULTIPLE = 4  # the forward batch's row count stays a multiple of this (see HFEngine._drop_finished)
STATIC_LEN_STEP = 128  # a compiled step's cache length is rounded up to this, so calls of similar length share graphs


class HFEngine:
    """:class:`~tether.engine.base.RolloutEngine` over a Hugging Face causal LM, on CPU or one GPU.

    The engine samples with the module it is given. In the trainer that is the policy being trained
    itself, so new weights are visible at once and :meth:`load_weights` is a no-op for them.

    Args:
        model: a Hugging Face causal LM (``AutoModelForCausalLM``).
        tokenizer: its tokenizer (or a vision-language model's processor, whose tokenizer is used);
            ``pad_token_id`` (else EOS) pads responses.
        eos_token_ids: tokens that end a response; default: the tokenizer's EOS and every EOS of the
            model's ``generation_config``.
        bf16_autocast: run the model's forward passes under bfloat16 autocast while generating and scoring. Faster
            only on CPUs with AMX / AVX512-BF16 (or a GPU); on an AVX2-only CPU it was 4.5x slower.
            Log-probs are still computed in float32 from its logits.
        score_rows: rows per forward pass in :meth:`score`.
        logprob_chunk_tokens: response tokens per LM-head call in :meth:`score` (``train.logprob_chunk_tokens``, as
            every trainer forward): bounds its largest tensor, the ``[chunk, vocabulary]`` logits.
        compact_below: once the unfinished rows are at most this fraction of the batch being decoded,
            the finished ones are dropped from it (and from the KV cache); 1 (the default) drops a row as
            soon as it finishes, 0 keeps every row to the end. Results do not depend on it.
        decode: the KV cache and decoding step. ``dynamic``: a growing cache, finished rows dropped;
            ``static``: a cache allocated once for prompt + ``max_new_tokens`` (every row stays to the end);
            ``compiled``: the static cache with the one-token forward compiled into CUDA graphs
            (``torch.compile(mode="reduce-overhead")``), CUDA only.
    """

    def __init__(self, model: Any, tokenizer: Any, *, eos_token_ids: Iterable[int] | None = None,
                 bf16_autocast: bool = False, score_rows: int = 32, compact_below: float = 1.0,
                 decode: str = "dynamic", logprob_chunk_tokens: int = 1024) -> None:
        check_decode_mode(decode, next(model.parameters()).device)
        self.model, self.tokenizer = model, text_tokenizer(tokenizer)
        tokenizer = self.tokenizer
        self.bf16_autocast, self.score_rows, self.compact_below = bf16_autocast, score_rows, compact_below
        self.decode, self.logprob_chunk_tokens = decode, logprob_chunk_tokens
        self.pad_id = pad_token_id(tokenizer)
        if eos_token_ids is None:
            eos_token_ids = default_eos_token_ids(model, tokenizer)
        self.eos_token_ids = sorted(int(e) for e in eos_token_ids)
        self.decoder = KVDecoder(model, bf16_autocast=bf16_autocast, compile_step=decode == "compiled")

    # -- RolloutEngine -------------------------------------------------------------------------

    def generate(self, prompt_ids: list[list[int]], params: SamplingParams, *, seed: int | None = None,
                 intervention: Intervention | None = None) -> Generation:
        """Sample one response per prompt.

        ``sample_log_probs[i, t]`` is the log-probability of the token under the distribution it was
        drawn from: the processed policy distribution (temperature, top-k, top-p), or the intervention's
        ``behaviour_log_probs`` at the steps it returned one. Greedy decoding records the temperature-1
        policy log-prob of the argmax token (not the 0 of the point mass it technically is).

        Args:
            prompt_ids: unpadded token ids of each prompt (at least one token each).
            params: sampling settings; ``stop`` strings end a row like EOS does.
            seed: seeds this call's own ``torch.Generator`` (the global RNG is not touched); None draws
                a fresh seed.
            intervention: optional per-step hook (see :class:`~tether.engine.base.Intervention`).

        Returns:
            A :class:`~tether.engine.base.Generation` whose width is the longest response.
        """
        if not prompt_ids or any(len(p) == 0 for p in prompt_ids):
            raise ValueError("generate needs at least one prompt, each with at least one token")
        model = self.model
        was_training = model.training
        model.eval()
        try:
            with torch.no_grad():
                return self._generate(prompt_ids, params, seed, intervention)
        finally:
            model.train(was_training)

    def score(self, prompt_ids: list[list[int]], response_ids: Tensor, response_mask: Tensor, *,
              temperature: float = 1.0, with_entropy: bool = False) -> Tensor | tuple[Tensor, Tensor]:
        """log-probs ``[N, T]`` of the given response tokens (0 where masked), without autograd.

        The same function as :func:`tether.models.forward.response_log_probs`, in ``score_rows`` rows
        per pass and ``logprob_chunk_tokens`` response tokens per LM-head call, under the autocast it decodes in
        (:func:`~tether.models.forward.autocast`, the trainer's); with ``with_entropy`` it returns
        ``(log_probs, entropy)``.
        """
        was_training = self.model.training
        self.model.eval()
        lps, ents = [], []
        try:
            with torch.no_grad(), autocast(next(self.model.parameters()).device, self.bf16_autocast):
                for s in range(0, len(prompt_ids), self.score_rows):
                    lp, ent = response_log_probs(self.model, prompt_ids[s:s + self.score_rows],
                                                 response_ids[s:s + self.score_rows],
                                                 response_mask[s:s + self.score_rows],
                                                 temperature=temperature, with_entropy=with_entropy,
                                                 chunk_size=self.logprob_chunk_tokens)
                    lps.append(lp)
                    ents.append(ent)
        finally:
            self.model.train(was_training)
        log_probs = torch.cat(lps)
        return (log_probs, torch.cat(ents)) if with_entropy else log_probs

    def load_weights(self, state_dict: dict[str, Tensor]) -> None:
        """Copy weights into the engine's model; free when they are already its own tensors, or when its model is
        a LoRA reference view, which computes with the policy's current tensors at every call."""
        if isinstance(self.model, BaseModelView):
            return
        own = self.model.state_dict()
        if all(k in own and own[k].data_ptr() == v.data_ptr() for k, v in state_dict.items()):
            return
        self.model.load_state_dict(state_dict, strict=True)

    # -- decoding ------------------------------------------------------------------------------

    def _generate(self, prompt_ids: list[list[int]], params: SamplingParams, seed: int | None,
                  intervention: Intervention | None) -> Generation:
        device = next(self.model.parameters()).device
        n, max_new = len(prompt_ids), params.max_new_tokens
        input_ids, prompt_attention, position_ids = left_pad(prompt_ids, self.pad_id, device)
        offsets = None  # a visual prompt's position offset of the tokens after it (multimodal RoPE)
        if has_images(prompt_ids):
            check_vision_model(self.model)
            position_ids, offsets = prompt_positions(self.model, prompt_ids, input_ids, prompt_attention, position_ids)
        mm_rope = uses_multimodal_rope(position_ids)
        p_len = input_ids.shape[1]
        cache_len = self._cache_len(p_len + max_new)
        # then one always-on column per new token (a static cache's spare columns lie beyond every query)
        attention = torch.cat([prompt_attention, prompt_attention.new_ones(n, cache_len - p_len)], dim=1)
        next_pos = torch.tensor([len(p) for p in prompt_ids], device=device)

        generator = torch.Generator(device=device)
        if seed is None:
            generator.seed()
        else:
            generator.manual_seed(seed)
        # ignore_eos: nothing ends a row, decided once here rather than at every decoding step
        eos = torch.tensor([] if params.ignore_eos else self.eos_token_ids, dtype=torch.long, device=device)
        stop = () if params.ignore_eos else params.stop
        tokens = torch.full((n, max_new), self.pad_id, dtype=torch.long, device=device)
        log_mu = torch.zeros(n, max_new, device=device)
        mask = torch.zeros(n, max_new, device=device)
        active = torch.ones(n, dtype=torch.bool, device=device)
        by_stop = torch.zeros(n, dtype=torch.bool, device=device)

        if intervention is not None:
            intervention.start(prompt_ids)
        cache = self.decoder.new_cache(None if self.decode == "dynamic" else cache_len, n)
        compact = self.compact_below > 0 and can_select_rows(cache)
        live = torch.arange(n, device=device)  # rows in the forward batch: finished rows get dropped
        logits = self.decoder.prefill(prompt_ids, input_ids, attention[:, :p_len], position_ids, cache)
        steps = 0
        for t in range(max_new):
            live_lp = process_logits(logits, params)  # [L, V]
            decision = None
            if intervention is not None:  # it sees all N rows; dropped rows carry a uniform distribution
                full = live_lp if len(live) == n else scatter_rows(live_lp, live, n, -math.log(live_lp.shape[1]))
                decision = intervention.step(full, active.clone())
            token = scatter_rows(choose_tokens(live_lp, live, n, params, generator), live, n, self.pad_id)
            if decision is None:
                chosen = scatter_rows(live_lp.gather(1, token[live, None]).squeeze(1), live, n, 0.0)
            else:
                forced = decision.forced_tokens.to(device)
                token = torch.where(forced >= 0, forced, token)
                chosen = decision.behaviour_log_probs.to(device).gather(1, token[:, None]).squeeze(1).float()
            token = token.masked_fill(~active, self.pad_id)
            tokens[:, t] = token
            log_mu[:, t] = chosen.masked_fill(~active, 0.0)
            mask[:, t] = active.float()
            if intervention is not None:
                intervention.advance(token)
            steps = t + 1
            finished = active & torch.isin(token, eos)
            if stop:
                hit = stop_hits(self.tokenizer, tokens, t, active, stop)
                by_stop |= hit & ~finished
                finished |= hit
            active &= ~finished
            if t == max_new - 1 or not bool(active.any()):
                break
            if compact and bool(finished.any()):
                live = self._drop_finished(live, active, cache)
            positions = later_positions(next_pos[live, None], offsets[live]) if mm_rope else next_pos[live, None]
            width = cache_len if self.decode != "dynamic" else p_len + t + 1  # a static cache's mask spans it all
            rows_attention = attention if len(live) == n else attention[live]
            logits = self.decoder.next_logits(token[live, None], rows_attention[:, :width], positions, cache)
            next_pos += 1

        tokens, log_mu, mask = tokens[:, :steps], log_mu[:, :steps], mask[:, :steps]
        extra = intervention.finish() if intervention is not None else {}
        return Generation(
            response_ids=tokens, response_mask=mask, sample_log_probs=log_mu,
            texts=response_texts(self.tokenizer, tokens, mask, by_stop, stop), truncated=active.clone(),
            token={k: fit_width(v.to(device), steps) for k, v in extra.items()})

    def _cache_len(self, needed: int) -> int:
        """Positions the KV cache holds: ``needed``, rounded up for a compiled step so its shapes repeat."""
        if self.decode != "compiled":
            return needed
        return -(-needed // STATIC_LEN_STEP) * STATIC_LEN_STEP

    def _drop_finished(self, live: Tensor, active: Tensor, cache: Any) -> Tensor:
        """The rows left in the forward batch once finished ones are dropped (when few enough are still going).

        The batch keeps a multiple of :data:`ROW_MULTIPLE` rows, finished ones filling up: CPU matrix
        products round differently at other row counts (measured: 1-3 rows on one thread, and 5-7 and
        9-11 on two), and then a row's log-probs would depend on which others are still going.
        """
        keep = active[live]
        going = int(keep.sum())
        size = min(len(live), -(-going // ROW_MULTIPLE) * ROW_MULTIPLE)
        if size == len(live) or going > self.compact_below * len(live):
            return live
        fillers = (~keep).nonzero().squeeze(1)[:size - going]
        keep[fillers] = True
        rows = keep.nonzero().squeeze(1)
        cache.batch_select_indices(rows)
        return live[rows]

def check_decode_mode(decode: str, device: torch.device) -> None:
    """Refuse an unknown ``decode`` mode, and ``compiled`` off a CUDA device, before any work."""
    if decode not in DECODE_MODES:
        raise ValueError(f"HFEngine: unknown decode mode {decode!r}; one of: {', '.join(DECODE_MODES)}")
    if decode == "compiled" and device.type != "cuda":
        raise ValueError(f"HFEngine(decode='compiled') needs a CUDA GPU (the decoding step is captured as CUDA "
                         f"graphs) and the model is on {device.type}; use decode='dynamic' or 'static'")


def build_hf_engine(model: Any, tokenizer: Any, model_cfg: ModelConfig, *, compact_below: float = 1.0,
                    score_rows: int = 32, decode: str = "dynamic", dtype: str | None = None,
                    logprob_chunk_tokens: int = 1024) -> HFEngine:
    """``rollout.engine: hf``: the in-process engine over ``model`` itself, so new weights cost nothing to load; or,
    with a ``dtype`` (``rollout.dtype``) other than the model's, over a copy of it in that dtype
    (:func:`rollout_copy`), which :meth:`HFEngine.load_weights` refreshes after every update.

    ``compact_below``, ``score_rows``, ``decode`` and ``logprob_chunk_tokens`` (``train.logprob_chunk_tokens``,
    :func:`~tether.engine.registry.build_engine` passes it) are :class:`HFEngine`'s; bf16 autocast follows
    ``model.bf16_autocast``.
    """
    sampler = model if dtype is None or getattr(torch, dtype) == next(model.parameters()).dtype \
        else rollout_copy(model, getattr(torch, dtype))
    return HFEngine(sampler, tokenizer, bf16_autocast=model_cfg.bf16_autocast, compact_below=compact_below,
                    score_rows=score_rows, decode=decode, logprob_chunk_tokens=logprob_chunk_tokens)


def rollout_copy(model: Any, dtype: torch.dtype) -> Any:
    """A frozen copy of ``model`` in ``dtype`` to sample from: the trainer keeps its own precision, the engine reads
    half the bytes per decoding step. Its weights are the policy's cast (``load_weights`` casts on copy)."""
    import copy

    return copy.deepcopy(model).to(dtype).eval().requires_grad_(False)


def cpu_flags(cpuinfo: str = "/proc/cpuinfo") -> set[str] | None:
    """This CPU's feature flags (``avx2``, ``avx512_bf16``, ...); None when they cannot be read (not Linux)."""
    try:
        with open(cpuinfo) as f:
            return set(next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), []))
    except OSError:
        return None


def speed_flags(cpuinfo: str = "/proc/cpuinfo") -> list[str]:
    """The flags of this CPU that decide how fast float32 and bfloat16 run on it, sorted (empty when its flags
    cannot be read): what a benchmark records beside its timings."""
    return sorted((cpu_flags(cpuinfo) or set()) & {"avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile"})


def native_bfloat16_cpu(cpuinfo: str = "/proc/cpuinfo") -> bool | None:
    """Whether this CPU computes bfloat16 natively (the ``avx512_bf16`` or ``amx_bf16`` flag); None when its flags
    cannot be read (not Linux)."""
    flags = cpu_flags(cpuinfo)
    return None if flags is None else bool(flags & {"avx512_bf16", "amx_bf16"})
