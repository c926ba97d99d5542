"""Rollouts on Ray actors: N engine replicas, each with its own copy of the weights, on one node or many.

:class:`RayEngine` is a :class:`~tether.engine.base.RolloutEngine` on the trainer's side. It starts
``num_actors`` :class:`EngineWorker` actors, each holding an :class:`~tether.engine.hf.HFEngine` over a
model rebuilt from the policy's config and weights, and:

* ``generate`` splits the prompts into contiguous shares (:func:`~tether.distributed.split_evenly`), one per
  actor; actor ``i`` samples its share with seed ``rank_seed(seed, i)``, the data-parallel convention with the
  actor index as the rank. The shares are concatenated in order, so the result equals an in-process
  ``HFEngine`` run share by share with those seeds (tested bit for bit on CPU);
* ``score`` splits the rows the same way;
* ``load_weights`` puts one CPU copy of the state dict in Ray's object store and every actor loads it.

Interventions (EAPO's lock-step prior) are not supported: the hook is a stateful Python object that would
have to run inside each actor in lock-step with its decoding loop. ``rollout.engine: ray`` with such a
method is refused when the config is read. Ray is imported only when this engine is built.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from tether.distributed.data_parallel import concat_generations, split_evenly
from tether.distributed.ray_cluster import check_ray_available, connect
from tether.engine.base import (
    Generation,
    Intervention,
    InterventionUnsupportedError,
    SamplingParams,
)
from tether.engine.hf import HFEngine, default_eos_token_ids, pad_token_id
from tether.models.lora import serving_state_dict
from tether.seeding import rank_seed

if TYPE_CHECKING:
    from tether.config import ModelConfig


def check_ray_engine_available() -> None:
    """Raise :class:`~tether.engine.base.EngineUnavailableError` when Ray is not installed."""
    check_ray_available("rollout.engine=ray")


def _cpu(state_dict: dict[str, Tensor]) -> dict[str, Tensor]:
    """Detached CPU tensors (the same tensors when they already are): what goes into the object store."""
    return {k: v.detach().cpu() for k, v in state_dict.items()}


class EngineWorker:
    """The body of one Ray actor: an :class:`HFEngine` over a model rebuilt from ``model_config``.

    Args:
        model_config: the policy's ``transformers`` config; the architecture is rebuilt from it.
        dtype: parameter dtype of the policy.
        tokenizer: the policy's tokenizer.
        weights: the policy's state dict (CPU tensors).
        device: where this actor's model lives (``cuda`` when Ray gave it a GPU).
        threads: torch CPU threads of this actor; 1 keeps N actors from oversubscribing the cores.
        engine_kwargs: :class:`HFEngine` options (EOS ids, bf16 autocast, compaction, score rows, log-prob chunk).
    """

    def __init__(self, model_config: Any, dtype: torch.dtype, tokenizer: Any, weights: dict[str, Tensor], *,
                 device: str, threads: int, engine_kwargs: dict[str, Any]) -> None:
        from transformers import AutoModelForCausalLM

        torch.set_num_threads(threads)
        model = AutoModelForCausalLM.from_config(model_config, dtype=dtype)
        # Parameters keep requires_grad as in the trainer's policy: on CPU a frozen module takes another
        # matmul path whose results differ in the last bits (~5e-7), and the samples must match in-process ones.
        model.to(device).eval()
        self.engine = HFEngine(model, tokenizer, **engine_kwargs)
        self.engine.load_weights(weights)

    def ready(self) -> bool:
        """Answers once the constructor has finished (so a failing actor fails the engine's start)."""
        return True

    def generate(self, prompt_ids: list[list[int]], params: SamplingParams, seed: int | None) -> Generation:
        return self.engine.generate(prompt_ids, params, seed=seed).to("cpu")

    def score(self, prompt_ids: list[list[int]], response_ids: Tensor, response_mask: Tensor, *, temperature: float,
              with_entropy: bool) -> Tensor | tuple[Tensor, Tensor]:
        device = self.engine.model.device
        out = self.engine.score(prompt_ids, response_ids.to(device), response_mask.to(device),
                                temperature=temperature, with_entropy=with_entropy)
        return (out[0].cpu(), out[1].cpu()) if with_entropy else out.cpu()

    def load_weights(self, state_dict: dict[str, Tensor]) -> None:
        self.engine.load_weights(state_dict)


class RayEngine:
    """A :class:`~tether.engine.base.RolloutEngine` whose ``generate`` and ``score`` run on Ray actors.

    Uses this process's Ray session, else joins the cluster at ``address`` (or ``$RAY_ADDRESS``; ``"auto"``:
    the one ``ray start`` runs on this node), else starts a local instance sized for the actors.

    Args:
        model: the policy (its config, dtype and weights are copied to every actor).
        tokenizer: its tokenizer.
        num_actors: engine replicas; each samples a contiguous share of every batch.
        num_cpus_per_actor: Ray CPUs each actor reserves.
        num_gpus_per_actor: Ray GPUs each actor reserves; > 0 puts its model on ``cuda``.
        threads: torch CPU threads in each actor.
        address: Ray cluster address; None starts (or reuses) a local one.
        bf16_autocast, compact_below, score_rows, logprob_chunk_tokens: :class:`HFEngine` options of every actor.
    """

    def __init__(self, model: Any, tokenizer: Any, *, num_actors: int = 2, num_cpus_per_actor: float = 1.0,
                 num_gpus_per_actor: float = 0.0, threads: int = 1, address: str | None = None,
                 bf16_autocast: bool = False, compact_below: float = 1.0, score_rows: int = 32,
                 logprob_chunk_tokens: int = 1024) -> None:
        if num_actors < 1:
            raise ValueError(f"rollout.engine_kwargs.num_actors must be >= 1, got {num_actors}")
        ray = connect("rollout.engine=ray", address, local_cpus=num_actors * num_cpus_per_actor)
        self._ray = ray
        self.tokenizer = tokenizer
        self.pad_id = pad_token_id(tokenizer)
        self.device = next(model.parameters()).device
        engine_kwargs = {"eos_token_ids": default_eos_token_ids(model, tokenizer), "bf16_autocast": bf16_autocast,
                         "compact_below": compact_below, "score_rows": score_rows,
                         "logprob_chunk_tokens": logprob_chunk_tokens}
        worker = ray.remote(EngineWorker).options(num_cpus=num_cpus_per_actor, num_gpus=num_gpus_per_actor)
        weights, tok = ray.put(_cpu(serving_state_dict(model))), ray.put(tokenizer)  # plain names, LoRA merged
        dtype = next(model.parameters()).dtype
        self.actors = [worker.remote(model.config, dtype, tok, weights, device="cuda" if num_gpus_per_actor else "cpu",
                                     threads=threads, engine_kwargs=engine_kwargs) for _ in range(num_actors)]
        ray.get([a.ready.remote() for a in self.actors])

    def _shares(self, n: int) -> list[tuple[int, Any, int, int]]:
        """(actor index, actor, lo, hi) for every actor with a non-empty share of ``n`` rows."""
        bounds = split_evenly(n, len(self.actors))
        return [(i, actor, lo, hi) for i, (actor, (lo, hi)) in enumerate(zip(self.actors, bounds, strict=True))
                if hi > lo]

    def generate(self, prompt_ids: list[list[int]], params: SamplingParams, *, seed: int | None = None,
                 intervention: Intervention | None = None) -> Generation:
        """Each actor samples its contiguous share with ``rank_seed(seed, actor index)``; rows in prompt order."""
        if intervention is not None:
            raise InterventionUnsupportedError(
                "rollout.engine=ray cannot run a per-step intervention (it would have to run inside every actor "
                "in lock-step with its decoding loop); use rollout.engine=hf for this method")
        if not prompt_ids:
            raise ValueError("generate needs at least one prompt")
        calls = [actor.generate.remote(prompt_ids[lo:hi], params, None if seed is None else rank_seed(seed, i))
                 for i, actor, lo, hi in self._shares(len(prompt_ids))]
        # on the CPU, as the actors return it: the collectors build the batch there (RolloutBatch)
        return concat_generations(self._ray.get(calls), self.pad_id)

    def score(self, prompt_ids: list[list[int]], response_ids: Tensor, response_mask: Tensor, *,
              temperature: float = 1.0, with_entropy: bool = False) -> Tensor | tuple[Tensor, Tensor]:
        """log-probs ``[N, T]`` (and entropies with ``with_entropy``), each actor scoring its share of rows."""
        ids, mask = response_ids.cpu(), response_mask.cpu()
        parts = self._ray.get([actor.score.remote(prompt_ids[lo:hi], ids[lo:hi], mask[lo:hi], temperature=temperature,
                                                  with_entropy=with_entropy)
                               for _, actor, lo, hi in self._shares(len(prompt_ids))])
        if with_entropy:
            return (torch.cat([p[0] for p in parts]).to(self.device), torch.cat([p[1] for p in parts]).to(self.device))
        return torch.cat(parts).to(self.device)

    def load_weights(self, state_dict: dict[str, Tensor]) -> None:
        """One object-store copy of ``state_dict``, loaded by every actor; returns when all have it."""
        weights = self._ray.put(_cpu(state_dict))
        self._ray.get([actor.load_weights.remote(weights) for actor in self.actors])


def build_ray_engine(model: Any, tokenizer: Any, model_cfg: ModelConfig, *, num_actors: int = 2,
                     num_cpus_per_actor: float = 1.0, num_gpus_per_actor: float = 0.0, threads: int = 1,
                     address: str | None = None, compact_below: float = 1.0, score_rows: int = 32,
                     logprob_chunk_tokens: int = 1024) -> RayEngine:
    """``rollout.engine: ray``: :class:`RayEngine` with these settings; bf16 autocast follows ``model``, and
    ``logprob_chunk_tokens`` is ``train.logprob_chunk_tokens`` (:func:`~tether.engine.registry.build_engine`)."""
    return RayEngine(model, tokenizer, num_actors=num_actors, num_cpus_per_actor=num_cpus_per_actor,
                     num_gpus_per_actor=num_gpus_per_actor, threads=threads, address=address,
                     bf16_autocast=model_cfg.bf16_autocast, compact_below=compact_below, score_rows=score_rows,
                     logprob_chunk_tokens=logprob_chunk_tokens)
