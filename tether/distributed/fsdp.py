"""Sharded training with FSDP2 (``torch.distributed.fsdp.fully_shard``) under ``torchrun``.

Parameters, gradients and optimiser state are sharded over the ranks, one FSDP group per decoder
layer plus the root (embeddings, final norm, LM head). Every rank still holds the same
:class:`~tether.rollout.batch.RolloutBatch`, so everything but the layout is as in
:mod:`tether.distributed.data_parallel`:

* **rollouts** -- a sharded module needs an all-gather per layer in every forward, and the ranks
  decode different rows for different numbers of steps. Instead of decoding in lock-step (one
  all-gather of the whole model per token) each ``generate`` call first gathers the whole model on
  every rank (:func:`gathered`: one all-gather per group), decodes its share of the prompts with no
  collective at all, and frees the gathered copy afterwards; the engine samples with the training
  weights themselves, so nothing is copied or refreshed after an update;
* **scoring** (old, reference, teacher log-probs) runs the full batch on every rank, so the forwards
  line up by construction; the LM-head pass of :func:`tether.models.forward.plain_head_pass` runs as a
  registered forward method of the root, so the root's parameters are gathered around it and their
  gradients reduced after it, as for ``model(...)``;
* **update** -- each rank runs its share of the rows of every mini-batch; ranks with fewer
  micro-batches run padding ones with weight 0 so that every rank makes the same forward/backward
  calls. Gradients are *summed* by the reduce-scatter (divide factor 1: the loss is already normalised
  by the whole mini-batch), so the step equals the single-process one up to summation order;
* **checkpoints** -- ``torch.distributed.checkpoint`` writes one file per rank (model, optimiser and a
  moved reference); ``best/`` gathers the full state dict to rank 0 and writes a plain HF directory.

The frozen reference model is sharded the same way (it is as large as the policy and only scored or
sampled from); EAPO's prior stays a whole module on every rank (it runs inside the local decoding loop).
"""

from __future__ import annotations

import contextlib
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import Tensor, nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard, register_fsdp_forward_method
from torch.distributed.tensor import DTensor

from tether.config import ConfigError
from tether.distributed.data_parallel import DataParallel
from tether.engine.base import Generation, Intervention, SamplingParams
from tether.models.forward import SHARDED_PASS, plain_head_pass
from tether.models.layers import decoder_layers
from tether.models.lora import BaseModelView, is_lora, save_adapter

SHARDED_DIR = "sharded"  # the DCP directory inside a step checkpoint


def fsdp_modules(model: nn.Module) -> list[FSDPModule]:
    return [m for m in model.modules() if isinstance(m, FSDPModule)]


@contextlib.contextmanager
def gathered(model: nn.Module) -> Iterator[None]:
    """Every FSDP group of ``model`` unsharded on every rank for the duration; collective on entry.

    Inside, forwards issue no collective, so ranks may call the model different numbers of times
    (decoding). On exit the groups are resharded and the default schedule restored: non-root groups
    reshard after each forward, the root stays gathered from forward to backward.
    """
    modules = fsdp_modules(model)
    for m in modules:
        m.unshard()
    model.set_reshard_after_forward(False)
    try:
        yield
    finally:
        model.set_reshard_after_forward(True)
        model.set_reshard_after_forward(False, recurse=False)
        for m in modules:
            m.reshard()


class GatheredEngine:
    """An engine over a sharded model whose ``generate`` runs inside :func:`gathered`.

    It wraps the rank-splitting engine (not the other way round): the gather is a collective, so every
    rank must enter it, including a rank whose share of the prompts is empty.
    """

    def __init__(self, engine: Any, model: nn.Module) -> None:
        self.engine, self.model = engine, model

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)

    def generate(self, prompt_ids: list[list[int]], params: SamplingParams, *, seed: int | None = None,
                 intervention: Intervention | None = None) -> Generation:
        with gathered(self.model):
            return self.engine.generate(prompt_ids, params, seed=seed, intervention=intervention)


def _dtype(name: str | None) -> torch.dtype | None:
    return None if name is None else getattr(torch, name)


class FSDP2:
    """The :class:`~tether.distributed.strategy.Strategy` of sharded training; see the module docstring.

    Args:
        dp: this process's place in the group (the group must be initialised, see ``torchrun``).
        device: this rank's device; its type is the mesh's (a GPU is already the current CUDA device).
        param_dtype: dtype of gathered parameters in forward/backward (None: the stored dtype).
        reduce_dtype: dtype of the gradient reduce-scatter (None: ``param_dtype``).

    Raises:
        ConfigError: no process group (not launched by ``torchrun``).
    """

    name = "fsdp2"
    lock_step = True  # every forward all-gathers and every backward reduce-scatters: ranks make the same calls

    def __init__(self, dp: DataParallel, device: torch.device, *, param_dtype: str | None = None,
                 reduce_dtype: str | None = None) -> None:
        if not dist.is_initialized():
            raise ConfigError("distributed.strategy=fsdp2 needs torch.distributed: launch with torchrun "
                              "(torchrun --nproc_per_node N -m tether.cli train CONFIG; N=1 on one GPU), "
                              "or set distributed.strategy=replicate")
        self.dp = dp
        self.mesh = init_device_mesh(device.type, (dp.world_size,))
        self.mp_policy = MixedPrecisionPolicy(param_dtype=_dtype(param_dtype), reduce_dtype=_dtype(reduce_dtype))

    def prepare(self, model: nn.Module) -> nn.Module:
        # fully_shard moves each group's parameters and buffers to the mesh's device (the current CUDA device)
        # as it shards them, so the whole model never sits on one GPU unsharded.
        for layer in decoder_layers(model):
            fully_shard(layer, mesh=self.mesh, mp_policy=self.mp_policy)
        fully_shard(model, mesh=self.mesh, mp_policy=self.mp_policy)
        for module in fsdp_modules(model):
            # Sum, not average: each rank's loss is already divided by the whole mini-batch's counts.
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)  # a plain SUM (gloo has no PREMUL_SUM)
        setattr(model, SHARDED_PASS, types.MethodType(plain_head_pass, model))
        register_fsdp_forward_method(model, SHARDED_PASS)
        return model

    def rollout_engine(self, engine: Any) -> Any:
        return GatheredEngine(self.dp.rollout_engine(engine), engine.model)

    def clip_grad_norm(self, model: nn.Module, max_norm: float) -> Tensor:
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        return norm.full_tensor() if isinstance(norm, DTensor) else norm

    def save_training_state(self, directory: Path, policy: nn.Module, optimizer: torch.optim.Optimizer,
                            ref: nn.Module | None) -> dict[str, Any]:
        model_state, optim_state = _policy_state(policy, optimizer)
        parts = {"model": model_state, "optim": optim_state}
        if ref is not None:
            parts["ref"] = _reference_state(ref)
        dcp.save(parts, checkpoint_id=directory / SHARDED_DIR)
        return {"sharded_parts": sorted(parts)}

    def load_training_state(self, directory: Path, state: dict[str, Any], policy: nn.Module,
                            optimizer: torch.optim.Optimizer, ref: nn.Module | None) -> bool:
        model_state, optim_state = _policy_state(policy, optimizer)  # this rank's shards
        parts = {"model": model_state, "optim": optim_state}
        has_ref = "ref" in state["sharded_parts"]
        if has_ref:
            parts["ref"] = _reference_state(ref)
        dcp.load(parts, checkpoint_id=directory / SHARDED_DIR)  # fills the shards of ``parts`` in place
        # not strict: a LoRA policy's frozen weights are not in the checkpoint (dcp.load has checked every key)
        set_state_dict(policy, optimizer, model_state_dict=parts["model"], optim_state_dict=parts["optim"],
                       options=StateDictOptions(ignore_frozen_params=is_lora(policy), strict=False))
        if has_ref and isinstance(ref, BaseModelView):
            ref.load_adapter_state(parts["ref"])
        elif has_ref:
            set_model_state_dict(ref, parts["ref"])
        return has_ref

    def save_pretrained(self, directory: Path, model: nn.Module) -> None:
        """A plain Hugging Face directory on rank 0 (the whole state gathered there), or for a LoRA policy its
        adapters alone in PEFT's format."""
        options = StateDictOptions(full_state_dict=True, cpu_offload=True, ignore_frozen_params=is_lora(model))
        full = get_model_state_dict(model, options=options)
        if not self.dp.is_main:  # the others received an empty dict
            return
        if is_lora(model):
            save_adapter(model, directory, full)
        else:
            model.save_pretrained(directory, state_dict=full, safe_serialization=True)


def _policy_state(policy: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[dict[str, Any], dict[str, Any]]:
    """This rank's shards of the policy and optimiser state. A LoRA policy's hold its trained adapters only: the
    frozen base is ``model.name``, which a resumed run loads again (``ignore_frozen_params`` alone would keep a
    tied LM head, which ``named_parameters`` lists once, under the embedding's name)."""
    if not is_lora(policy):
        return get_state_dict(policy, optimizer)
    model_state, optim_state = get_state_dict(policy, optimizer, options=StateDictOptions(ignore_frozen_params=True))
    trained = {name for name, p in policy.named_parameters() if p.requires_grad}
    return {k: v for k, v in model_state.items() if k in trained}, optim_state


def _reference_state(ref: Any) -> dict[str, Any]:
    """The sharded state of a moved reference: a model's, or a LoRA reference's own adapter."""
    return ref.adapter_state() if isinstance(ref, BaseModelView) else get_model_state_dict(ref)
