"""What every rollout engine offers, and the per-step sampling intervention hook.

An engine turns prompts into sampled responses with the log-probability of each sampled token
under the distribution it was actually drawn from. The in-process Hugging Face engine
(:mod:`tether.engine.hf`) implements this on CPU or one GPU; the Ray engine (:mod:`tether.engine.ray_engine`)
and the vLLM engine (:mod:`tether.engine.vllm`) implement the same protocol without interventions, which
need lock-step access to the logits. ``rollout.engine`` picks one (:mod:`tether.engine.registry`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import torch
from torch import Tensor

if TYPE_CHECKING:
    from tether.config import RolloutConfig, ValConfig


class InterventionUnsupportedError(NotImplementedError):
    """The engine cannot run a per-step sampling intervention (only the in-process HF engine can)."""


class EngineUnavailableError(RuntimeError):
    """The configured engine cannot run on this machine (a package or a GPU is missing)."""


@dataclass(frozen=True)
class SamplingParams:
    """How to sample. ``top_k=0`` and ``top_p=1.0`` switch those filters off."""

    max_new_tokens: int = 64
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    greedy: bool = False
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False  # every row samples max_new_tokens: EOS and ``stop`` end nothing (equal-work benchmarks)


def sampling_params(rollout: RolloutConfig, val: ValConfig | None = None) -> SamplingParams:
    """A config's sampling: a training rollout's (``rollout``), or with ``val`` validation's, for every collector.

    Validation samples with ``val``'s temperature, top-p and greedy alone: no top-k (``val`` has none) and EOS always
    honoured (``rollout.ignore_eos`` is for training's equal-work benchmarks). The response budget and the stop
    strings are ``rollout``'s in both, so a validated response is cut where a trained one is.
    """
    if val is None:
        return SamplingParams(max_new_tokens=rollout.max_new_tokens, temperature=rollout.temperature,
                              top_p=rollout.top_p, top_k=rollout.top_k, stop=tuple(rollout.stop),
                              ignore_eos=rollout.ignore_eos)
    return SamplingParams(max_new_tokens=rollout.max_new_tokens, temperature=val.temperature, top_p=val.top_p,
                          top_k=0, greedy=val.greedy, stop=tuple(rollout.stop))


@dataclass
class Generation:
    """Result of :meth:`RolloutEngine.generate` for N prompts, on whichever device the engine sampled on (the
    collectors move it to the CPU).

    Attributes:
        response_ids: sampled tokens, right-padded with the pad id. [N, T] long
        response_mask: 1.0 on generated tokens up to and including EOS or the stop string. [N, T]
        sample_log_probs: log mu(y_t), the log-prob of each token under the distribution it was
            sampled from (the processed policy distribution, or an intervention's). [N, T]
        texts: decoded responses (special tokens removed, cut at a stop string).
        token: per-token tensors an intervention recorded (e.g. ``gate_mask``). [N, T] each
        truncated: True where the response hit max_new_tokens without EOS or a stop string. [N]
    """

    response_ids: Tensor
    response_mask: Tensor
    sample_log_probs: Tensor
    texts: list[str]
    truncated: Tensor
    token: dict[str, Tensor] = field(default_factory=dict)

    def to(self, device: torch.device | str) -> Generation:
        """The same generation with every tensor on ``device`` (itself when they already are)."""
        if self.response_ids.device == torch.device(device):
            return self
        return Generation(response_ids=self.response_ids.to(device), response_mask=self.response_mask.to(device),
                          sample_log_probs=self.sample_log_probs.to(device), texts=self.texts,
                          truncated=self.truncated.to(device), token={k: v.to(device) for k, v in self.token.items()})


@dataclass
class InterventionStep:
    """An intervention's decision at one decoding step.

    Attributes:
        behaviour_log_probs: log of the marginal distribution each row's token is drawn from at
            this step; rows it leaves alone carry the policy's own log-probs. [N, V]
        forced_tokens: a token the intervention drew itself (e.g. from a prior), or -1 where the
            engine samples from the policy distribution. [N] long
    """

    behaviour_log_probs: Tensor
    forced_tokens: Tensor


@runtime_checkable
class Intervention(Protocol):
    """Per-step hook into decoding (EAPO's injection uses it).

    The engine calls ``start`` once with the prompts, then per step ``step`` with the policy's
    processed next-token log-probs (after temperature, top-k and top-p) and the rows still
    generating, then ``advance`` with the tokens chosen, and ``finish`` at the end. ``step`` must
    decide from the prefix only: the token of this step is not known when it is called.
    """

    def start(self, prompt_ids: list[list[int]]) -> None: ...

    def step(self, policy_log_probs: Tensor, active: Tensor) -> InterventionStep | None: ...

    def advance(self, tokens: Tensor) -> None: ...

    def finish(self) -> dict[str, Tensor]: ...


@runtime_checkable
class RolloutEngine(Protocol):
    """generate / score / load new weights."""

    def generate(self, prompt_ids: list[list[int]], params: SamplingParams, *, seed: int | None = None,
                 intervention: Intervention | None = None) -> Generation: ...

    def score(self, prompt_ids: list[list[int]], response_ids: Tensor, response_mask: Tensor, *,
              temperature: float = 1.0) -> Tensor: ...

    def load_weights(self, state_dict: dict[str, Tensor]) -> None:
        """Make the engine sample with these weights; the trainer calls it after every update."""
        ...
