"""How the policy is laid out over ranks: the few places where replicated and sharded training differ.

The trainer calls one :class:`Strategy` at each of them and never asks which one it has:

=========================  ====================================  =========================================
step                       :class:`Replicate`                    :class:`~tether.distributed.fsdp.FSDP2`
=========================  ====================================  =========================================
``prepare(model)``         the module, moved to this rank's      ``fully_shard`` per decoder layer, then root
                           device                                (the mesh puts the shards on the device)
``rollout_engine``         rows split by rank                    the same, over a model gathered per call
``micro_batches``          this rank's share of the rows, in     the same, padded so every rank runs as many
                           fixed-size or token-budget groups
``clip_grad_norm``         all-reduce (sum), then clip           clip (FSDP2 already reduce-scattered)
``save/load_training``     HF weights (LoRA: PEFT adapters) +    ``torch.distributed.checkpoint`` (DCP), one
                           optimiser in ``trainer_state.pt``     file per rank (LoRA is refused under FSDP2)
                           (rank 0)
``save_pretrained``        rank 0's module (LoRA: its adapters)  the full state dict gathered to rank 0
=========================  ====================================  =========================================
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import Tensor, nn

from tether.distributed.data_parallel import DataParallel, chunk_by_length
from tether.models.lora import BaseModelView, is_lora, load_adapter, save_adapter


@dataclass(frozen=True)
class MicroBatch:
    """Rows of a mini-batch for one forward/backward; a ``padding`` one only keeps ranks in step (weight 0)."""

    rows: Sequence[int]
    padding: bool = False


def own_micro_batches(dp: DataParallel, lengths: Sequence[tuple[int, int]], size: int,
                      max_tokens: int | None) -> list[Sequence[int]]:
    """This rank's rows of a mini-batch in micro-batches: ``size`` rows each, or, with ``max_tokens``, grouped by
    length under that many padded tokens (:func:`~tether.distributed.data_parallel.pack_by_tokens`).

    Several ``size``-row micro-batches are filled longest rows first
    (:func:`~tether.distributed.data_parallel.chunk_by_length`), so that the update's shuffled short rows are not
    padded to long ones; a single one keeps its rows as they were.

    Args:
        lengths: ``(prompt tokens, response tokens)`` of every row of the mini-batch.
    """
    if max_tokens is not None:
        return dp.budget_micro_batches(lengths, max_tokens)
    fixed = dp.micro_batches(len(lengths), size)
    if len(fixed) < 2:
        return fixed
    return chunk_by_length([r for rows in fixed for r in rows], lengths, size)


def lock_step_micro_batches(dp: DataParallel, lengths: Sequence[tuple[int, int]], size: int,
                            max_tokens: int | None = None) -> list[MicroBatch]:
    """This rank's micro-batches, padded to as many as any rank runs.

    A sharded model all-gathers inside every forward and reduce-scatters inside every backward, so all
    ranks must make the same number of calls; a padding micro-batch re-runs row 0 with weight 0. Every
    rank holds the whole mini-batch, so it plans the other ranks' micro-batches too, without a collective.
    """
    own = [MicroBatch(rows) for rows in own_micro_batches(dp, lengths, size, max_tokens)]
    most = max(len(own_micro_batches(DataParallel(r, dp.world_size), lengths, size, max_tokens))
               for r in range(dp.world_size))
    return own + [MicroBatch(range(0, 1), padding=True)] * (most - len(own))


def every_rank_micro_batches(world_size: int, lengths: Sequence[tuple[int, int]], size: int,
                             max_tokens: int | None) -> list[Sequence[int]]:
    """Every rank's micro-batches of a mini-batch, rank 0's first, as :meth:`Strategy.micro_batches` gives each rank
    its own (less the lock-step padding): the plan of a pass that each rank runs over the whole mini-batch
    (the trainer's scoring), in the update's groups. Every rank makes the same calls, so none needs padding."""
    return [rows for rank in range(world_size)
            for rows in own_micro_batches(DataParallel(rank, world_size), lengths, size, max_tokens)]


class Strategy(Protocol):
    """The distributed layout of the policy (and of the frozen reference, if any)."""

    name: str
    dp: DataParallel

    def prepare(self, model: nn.Module) -> nn.Module:
        """Lay ``model`` out on this rank's device for training and scoring (in place where possible); returns
        the module to use."""

    def rollout_engine(self, engine: Any) -> Any:
        """Wrap an in-process engine so that every rank samples its share of the prompts."""

    def micro_batches(self, lengths: Sequence[tuple[int, int]], size: int,
                      max_tokens: int | None) -> list[MicroBatch]:
        """This rank's micro-batches of a mini-batch whose rows have these ``(prompt, response)`` lengths:
        ``size`` rows each, filled longest rows first, or grouped by length under ``max_tokens`` padded tokens
        (see :func:`own_micro_batches`)."""

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

    def __init__(self, dp: DataParallel, device: torch.device) -> None:
        self.dp, self.device = dp, device

    def prepare(self, model: nn.Module) -> nn.Module:
        return model.to(self.device)

    def rollout_engine(self, engine: Any) -> Any:
        return self.dp.rollout_engine(engine)

    def micro_batches(self, lengths: Sequence[tuple[int, int]], size: int,
                      max_tokens: int | None) -> list[MicroBatch]:
        return [MicroBatch(rows) for rows in own_micro_batches(self.dp, lengths, size, max_tokens)]

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
