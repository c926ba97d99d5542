"""RolloutBatch: the one container that flows from the collector to the loss."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, fields, replace

import torch
from torch import Tensor


def pad_right(rows: Sequence[Tensor], width: int, value: float = 0) -> Tensor:
    """Stack 2-D tensors ``[n_i, t_i]`` into ``[sum n_i, width]``, padding on the right."""
    out = []
    for row in rows:
        if row.shape[1] < width:
            row = torch.nn.functional.pad(row, (0, width - row.shape[1]), value=value)
        out.append(row)
    return torch.cat(out, dim=0)


@dataclass
class RolloutBatch:
    """Rows of (prompt, response) with everything the update needs.

    A *row* is one training sequence: a single-turn completion, or one turn of a multi-turn
    trajectory. Per-token tensors are ``[N, T]`` over response tokens, right-padded.

    Collectors build it on the CPU (engine outputs, rewards, group ids), and method generation hooks see
    it there; the trainer moves it to the policy's device once per step (:meth:`to`), before scoring.
    Whatever adds a tensor after that creates it on the batch's device.

    Attributes:
        prompt_ids: unpadded prompt token ids of each row.
        response_ids: sampled response tokens. [N, T] long
        response_mask: 1.0 on response tokens (EOS included), 0.0 on padding. [N, T]
        sample_log_probs: log-prob of each token under the distribution it was sampled from. [N, T]
        group_ids: rows with the same id share an advantage baseline (one prompt, or one task). [N]
        rewards: scalar reward per row, shaping included. [N]
        correct: verifier's correctness (or episode success), independent of shaping. [N] bool
        source: 0 = on-policy, 1 = anchor from the reference policy (ARMOR). [N] long
        token: extra per-token tensors by name, e.g. ``old_log_probs``, ``ref_log_probs``, ``advantages``,
            ``gate_mask``, ``injected_mask``, ``teacher_log_probs``. Those a configured method declares in
            ``loss_tokens`` reach the loss in :attr:`tether.algos.LossInputs.tokens`, under the same name.
        info: per-row Python values (prompt text, response text, answer, episode id, turn index...).
    """

    prompt_ids: list[list[int]]
    response_ids: Tensor
    response_mask: Tensor
    sample_log_probs: Tensor
    group_ids: Tensor
    rewards: Tensor
    correct: Tensor
    source: Tensor
    token: dict[str, Tensor] = field(default_factory=dict)
    info: dict[str, list] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.prompt_ids)

    @property
    def width(self) -> int:
        return self.response_ids.shape[1]

    def select(self, index: Sequence[int] | Tensor) -> RolloutBatch:
        """Rows by position, in the given order."""
        idx = torch.as_tensor(index, dtype=torch.long)
        rows = idx.tolist()
        return RolloutBatch(
            prompt_ids=[self.prompt_ids[i] for i in rows],
            response_ids=self.response_ids[idx],
            response_mask=self.response_mask[idx],
            sample_log_probs=self.sample_log_probs[idx],
            group_ids=self.group_ids[idx],
            rewards=self.rewards[idx],
            correct=self.correct[idx],
            source=self.source[idx],
            token={k: v[idx] for k, v in self.token.items()},
            info={k: [v[i] for i in rows] for k, v in self.info.items()},
        )

    def row_lengths(self) -> list[tuple[int, int]]:
        """``(prompt tokens, response columns)`` of each row; a row's response columns end at its last
        masked-in token (0 for an empty response). One host sync."""
        columns = torch.arange(1, self.width + 1, device=self.response_mask.device)
        ends = ((self.response_mask != 0) * columns).amax(1) if self.width else self.response_mask.new_zeros(len(self))
        return [(len(p), int(t)) for p, t in zip(self.prompt_ids, ends.tolist(), strict=True)]

    def narrow(self, width: int) -> RolloutBatch:
        """The same rows with every per-token tensor cut to its first ``width`` columns (dropping padding that
        the batch only carries for its longer rows); the batch itself if it is no wider."""
        if width >= self.width:
            return self
        return replace(self, response_ids=self.response_ids[:, :width], response_mask=self.response_mask[:, :width],
                       sample_log_probs=self.sample_log_probs[:, :width],
                       token={k: v[:, :width] for k, v in self.token.items()})

    def to(self, device: torch.device | str) -> RolloutBatch:
        """The same rows with every tensor (``token`` entries included) on ``device``, Python fields shared; the
        batch itself when every tensor is there already, so whoever holds it sees what is added later."""
        moved = {f.name: value.to(device) for f in fields(self) if isinstance(value := getattr(self, f.name), Tensor)}
        token = {k: v.to(device) for k, v in self.token.items()}
        if all(v is getattr(self, k) for k, v in moved.items()) and all(v is self.token[k] for k, v in token.items()):
            return self
        return replace(self, **moved, token=token)

    @staticmethod
    def concat(batches: Sequence[RolloutBatch]) -> RolloutBatch:
        """Stack batches row-wise, right-padding per-token tensors to the widest.

        A ``token`` tensor that only some batches carry is zero for the others' rows: per-token
        tensors are masks or log-prob annotations whose absence means "none" (anchors generated
        without an intervention have no gated tokens). ``info`` keys must agree.
        """
        batches = [b for b in batches if len(b)]
        if not batches:
            raise ValueError("RolloutBatch.concat needs at least one non-empty batch")
        width = max(b.width for b in batches)
        token_keys = set().union(*(b.token for b in batches))
        info_keys = set(batches[0].info)
        for b in batches[1:]:
            if set(b.info) != info_keys:
                raise ValueError("RolloutBatch.concat: batches carry different info keys: "
                                 f"{sorted(info_keys)} vs {sorted(b.info)}")
        return RolloutBatch(
            prompt_ids=[p for b in batches for p in b.prompt_ids],
            response_ids=pad_right([b.response_ids for b in batches], width),
            response_mask=pad_right([b.response_mask for b in batches], width),
            sample_log_probs=pad_right([b.sample_log_probs for b in batches], width),
            group_ids=torch.cat([b.group_ids for b in batches]),
            rewards=torch.cat([b.rewards for b in batches]),
            correct=torch.cat([b.correct for b in batches]),
            source=torch.cat([b.source for b in batches]),
            token={k: pad_right([b.token.get(k, torch.zeros_like(b.sample_log_probs)) for b in batches], width)
                   for k in token_keys},
            info={k: [x for b in batches for x in b.info[k]] for k in info_keys},
        )


def zero_variance_groups(rewards: torch.Tensor, group_ids: torch.Tensor) -> set[int]:
    """Group ids whose rewards are all equal: their GRPO advantage is 0, so they teach nothing."""
    out = set()
    for gid in group_ids.unique().tolist():
        r = rewards[group_ids == gid]
        if bool((r == r[0]).all()):
            out.add(gid)
    return out
