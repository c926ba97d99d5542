"""How the policy is laid out over ranks: the few places where replicated and sharded training differ.

The trainer calls one :class:`Strategy` at each of them and never asks which one it has:

=========================  ====================================  =========================================
step                       :class:`Replicate`                    :class:`~tether.distributed.fsdp.FSDP2`
=========================  ====================================  =========================================
``prepare(model)``         the module, moved to this rank's      ``fully_shard`` per decoder layer, then root
                           device                                (the mesh puts the shards on the device)
``rollout_engine``         rows split by rank                    the same, over a model gathered per call
``lock_step``              False: a rank runs the micro-batches  True: padded so every rank runs as many
                           of its share of the rows              (tether/trainer/micro_batches.py plans both)
``clip_grad_norm``         all-reduce (sum), then clip           clip (FSDP2 already reduce-scattered)
``save/load_training``     HF weights (LoRA: PEFT adapters) +    ``torch.distributed.checkpoint`` (DCP), one
                           optimiser in ``trainer_state.pt``     file per rank (LoRA is refused under FSDP2)
                           (rank 0)
``save_pretrained``        rank 0's module (LoRA: its adapters)  the full state dict gathered to rank 0
=========================  ====================================  =========================================
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

import torch
from torch import Tensor, nn

from tether.distributed.data_parallel import DataParallel
from tether.models.lora import BaseModelView, is_lora, load_adapter, save_adapter


class Strategy(Protocol):
    """The distributed layout of the policy (and of the frozen reference, if any)."""

    name: str
    dp: DataParallel
    # whether every rank must run as many micro-batches (tether.trainer.micro_batches.micro_batches pads): a sharded
    # model gathers and reduces inside each forward and backward
    lock_step: bool

    def prepare(self, model: nn.Module) -> nn.Module:
        """Lay ``model`` out on this rank's device for training and scoring (in place where possible); returns
        the module to use."""

    def rollout_engine(self, engine: Any) -> Any:
        """Wrap an in-process engine so that every rank samples its share of the prompts."""

    def clip_grad_norm(self, model: nn.Module, max_norm: float) -> Tensor:
        """Finish the gradient sum over ranks, clip it; returns the global norm before clipping (a plain tensor)."""

    def save_training_state(self, directory: Path, policy: nn.Module, optimizer: torch.optim.Optimizer,
                            ref: nn.Module | None) -> dict[str, Any]:
        """Write weights and optimiser state (and ``ref`` unless None) into ``directory`` on every rank.

        Returns:
            entries for rank 0's ``trainer_state.pt`` (what :meth:`load_training_state` needs).
        """

    def load_training_state(self, directory: Path, state: dict[str, Any], policy: nn.Module,
                            optimizer: torch.optim.Optimizer, ref: nn.Module | None) -> bool:
        """Restore what :meth:`save_training_state` wrote; returns whether the checkpoint held ``ref``."""

    def save_pretrained(self, directory: Path, model: nn.Module) -> None:
        """A plain Hugging Face directory of ``model`` (loadable with ``from_pretrained``), written by rank 0."""


class Replicate:
    """Every rank holds the whole model (DDP semantics without the wrapper); one flat all-reduce per step."""

    name = "replicate"
    lock_step = False  # a rank's forward and backward are its own until the one all-reduce

    def __init__(self, dp: DataParallel, device: torch.device) -> None:
        self.dp, self.device = dp, device

    def prepare(self, model: nn.Module) -> nn.Module:
        return model.to(self.device)

    def rollout_engine(self, engine: Any) -> Any:
        return self.dp.rollout_engine(engine)

    def clip_grad_norm(self, model: nn.Module, max_norm: float) -> Tensor:
        self.dp.all_reduce_grads(model.parameters())
        return torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)

    def save_training_state(self, directory: Path, policy: nn.Module, optimizer: torch.optim.Optimizer,
                            ref: nn.Module | None) -> dict[str, Any]:
        self.save_pretrained(directory, policy)
        if isinstance(ref, BaseModelView):  # a LoRA run's moved reference: its adapter, not the merged weights
            return {"optimizer": optimizer.state_dict(), "ref_adapter": ref.adapter_state()}
        return {"optimizer": optimizer.state_dict(), "ref_policy": None if ref is None else ref.state_dict()}

    def load_training_state(self, directory: Path, state: dict[str, Any], policy: nn.Module,
                            optimizer: torch.optim.Optimizer, ref: nn.Module | None) -> bool:
        from transformers import AutoModelForCausalLM

        if is_lora(policy):  # the checkpoint holds the adapters; the base is the model the run starts from
            load_adapter(policy, directory)
        else:
            saved = AutoModelForCausalLM.from_pretrained(directory, dtype=next(policy.parameters()).dtype)
            policy.load_state_dict(saved.state_dict())
        optimizer.load_state_dict(state["optimizer"])
        if "ref_adapter" in state:
            ref.load_adapter_state(state["ref_adapter"])
            return True
        if state["ref_policy"] is None:
            return False
        ref.load_state_dict(state["ref_policy"])
        return True

    def save_pretrained(self, directory: Path, model: nn.Module) -> None:
        if not self.dp.is_main:
            return
        if is_lora(model):  # the adapters alone, in PEFT's format (tether.models.lora)
            save_adapter(model, directory)
        else:
            model.save_pretrained(directory, safe_serialization=True)
