"""Supervised fine-tuning: the one SFT loop of tether (``tether sft CONFIG``, and SEED's skill SFT).

Warm starts before RL come from a task's demonstrations, a JSONL file, an agent environment's solver or another
model's correct samples, chosen by ``sft.data`` (:mod:`tether.sft_data`, which also writes and encodes the examples).

The loss is the response-only NLL, token-mean over each optimiser batch, on the trainer's device and precision
(``train.device``, ``model.bf16_autocast``), logged through the trainer's tracker (metrics.jsonl, TensorBoard,
W&B/MLflow) under ``sft/``. The pairs used are written to ``run_dir/data/{train,val}.jsonl`` (SEED's
``replay_data`` reads them) and the loop trains on what those files hold. The result, ``run_dir/checkpoint``, is a
plain Hugging Face directory: ``tether train CONFIG model.name=RUN_DIR/checkpoint`` continues from it with RL.

A run resumes (:mod:`tether.recipes.sft_state`): every ``sft.save_every`` optimiser steps, and when SIGTERM or SIGINT
stops the loop after the optimiser step under way (exit code 128 + the signal's number), ``run_dir/sft_state`` is
written; the same command then continues from it, on the examples the run wrote, to the weights and metric rows of
a run that never stopped. ``train.resume`` and ``train.overwrite`` say what a start does with an earlier run, as for
``tether train``; a finished run is left as it is.
"""

from __future__ import annotations

import math
import signal
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import torch

from tether.errors import TrainingStopped
from tether.models import autocast
from tether.recipes.sft_state import (
    STATE,
    Progress,
    SFTStart,
    SFTState,
    data_files,
    fingerprint,
    open_sft_run,
    state_files,
    write_summary,
)
from tether.sft_data import Example, encode_examples, prompt_key, row_example, sft_examples, write_examples
from tether.start import StopSignals
from tether.trainer.rundir import config_defaults

if TYPE_CHECKING:
    from collections.abc import Callable

    from tether.config import SeedSFTRunConfig, SFTRunConfig, SFTSettings


def _pad(responses: list[list[int]], pad_id: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(r) for r in responses)
    ids = torch.full((len(responses), width), pad_id, dtype=torch.long)
    mask = torch.zeros(len(responses), width)
    for i, r in enumerate(responses):
        ids[i, :len(r)], mask[i, :len(r)] = torch.tensor(r), 1.0
    return ids.to(device), mask.to(device)


def nll_sum(model: Any, examples: list[tuple[list[int], list[int]]], pad_id: int,
            chunk_tokens: int = 1024) -> torch.Tensor:
    """Sum of ``-log p(response token | prompt, earlier response tokens)`` over the examples' response tokens, the
    LM head applied to ``chunk_tokens`` response tokens at a time (``train.logprob_chunk_tokens``)."""
    from tether.models import response_log_probs

    device = next(model.parameters()).device
    ids, mask = _pad([r for _, r in examples], pad_id, device)
    log_probs, _ = response_log_probs(model, [p for p, _ in examples], ids, mask, chunk_size=chunk_tokens)
    return -(log_probs * mask.to(log_probs)).sum()


@torch.no_grad()
def evaluate_nll(model: Any, examples: list, pad_id: int, micro: int, bf16_autocast: bool = False,
                 chunk_tokens: int = 1024) -> float:
    """Token-mean NLL of the responses."""
    total = 0.0
    for i in range(0, len(examples), micro):
        with autocast(next(model.parameters()).device, bf16_autocast):
            total += nll_sum(model, examples[i:i + micro], pad_id, chunk_tokens).item()
    return total / max(sum(len(r) for _, r in examples), 1)


def sft_steps(n_train: int, s: SFTSettings) -> int:
    """Optimiser steps of :func:`train_sft` on ``n_train`` examples."""
    per_epoch = math.ceil(n_train / s.batch_size)
    return min(per_epoch * s.epochs, s.max_steps or per_epoch * s.epochs)


def progress_log(log: Any, total: int, start: int = 0) -> Any:
    """``log`` that also prints one line per optimiser step (loss, s/step, ETA) and each held-out loss; ``start``:
    the step a resumed run continues from (the rate counts this session's steps)."""
    from tether.track.progress import StepLines, status

    lines = StepLines(total, start=start, label="sft step")

    def logged(metrics: dict[str, float], step: int) -> None:
        log(metrics, step)
        if "sft/loss" in metrics:
            lines.update(step, f"loss {metrics['sft/loss']:.4f}")
        if "sft/val_loss" in metrics:
            status(f"held-out loss after step {step}: {metrics['sft/val_loss']:.4f}")

    return logged


def sft_step(model: Any, batch: list, pad_id: int, optimizer: torch.optim.Optimizer, s: SFTSettings,
             bf16_autocast: bool, chunk_tokens: int) -> tuple[float, float, int]:
    """One optimiser step on ``batch``: the token-mean NLL over the batch's response tokens, accumulated over
    micro-batches, gradient clipped at ``s.grad_clip``. Returns the loss, the gradient norm before clipping and the
    response tokens."""
    tokens = sum(len(r) for _, r in batch)
    optimizer.zero_grad(set_to_none=True)
    loss_value = 0.0
    for m in range(0, len(batch), s.micro_batch_size):
        with autocast(next(model.parameters()).device, bf16_autocast):
            loss = nll_sum(model, batch[m:m + s.micro_batch_size], pad_id, chunk_tokens) / tokens
        loss.backward()
        loss_value += loss.item()
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), s.grad_clip)
    optimizer.step()
    return loss_value, float(grad_norm), tokens


def stop_if_signalled(signals: StopSignals, step: int, total: int, state: SFTState | None) -> None:
    """Raise :class:`~tether.errors.TrainingStopped` (exit code 128 + N) once SIGTERM or SIGINT has arrived; the
    caller has saved ``state`` (None: nothing saved)."""
    if signals.signal is not None:
        name = signal.Signals(signals.signal).name
        kept = ("nothing saved" if state is None
                else f"its state is in {state.path}: run the same command again to resume")
        raise TrainingStopped(f"sft stopped by {name} after step {step} of {total}; {kept}", 128 + signals.signal)


def batch_order(n_train: int, s: SFTSettings, epoch: int) -> list[int]:
    """The order of the training examples in ``epoch``: a function of ``sft.data_seed`` and the epoch alone, so a
    resumed run draws the batches an uninterrupted one would."""
    return torch.randperm(n_train, generator=torch.Generator().manual_seed(s.data_seed + epoch)).tolist()


def train_sft(model: Any, tokenizer: Any, train: list, val: list, s: SFTSettings, *,
              log: Any = None, bf16_autocast: bool = False, logprob_chunk_tokens: int = 1024,
              state: SFTState | None = None) -> dict[str, float]:
    """Response-only SFT: AdamW, warm-up then cosine, grad clip; token-mean NLL per optimiser batch.

    Args:
        model: the policy, already on its device (kept in eval mode: no dropout, as in RL).
        tokenizer: its tokenizer or processor (the pad id).
        train, val: encoded examples, :func:`encode_examples`.
        s: hyperparameters (``sft`` of a ``tether sft`` or a ``tether seed-sft`` config).
        log: ``log(metrics, step)``, e.g. a :class:`~tether.track.Tracker`'s ``log``; None for none.
        bf16_autocast: forward passes under bfloat16 autocast.
        logprob_chunk_tokens: response tokens per LM-head call (``train.logprob_chunk_tokens`` of the config).
        state: where the run's resumable state lives: restored when it exists, saved every ``s.save_every``
            steps and on a stop; None: nothing saved or restored.

    A state is saved only where every metric row of its step is logged (after the held-out loss when a step ends
    an epoch), so a resumed run logs each row once.

    Returns:
        ``steps`` (an int: the summary's JSON says 3, not 3.0), ``train_loss`` (last step), ``val_loss`` (after the
        last epoch; NaN without val data).

    Raises:
        TrainingStopped: SIGTERM or SIGINT arrived; the loop stopped after the optimiser step (or the held-out
            loss) under way, with its metrics logged and ``state`` saved (:func:`stop_if_signalled`).
        RunDirError: ``state`` is damaged or belongs to another run.
    """
    from transformers import get_cosine_schedule_with_warmup

    from tether.engine.hf import pad_token_id
    from tether.models.vision import text_tokenizer
    from tether.optimizer import adamw

    pad = pad_token_id(text_tokenizer(tokenizer))
    total = sft_steps(len(train), s)
    optimizer = adamw(model.parameters(), lr=s.lr, betas=s.betas, weight_decay=s.weight_decay)
    schedule = get_cosine_schedule_with_warmup(optimizer, int(s.warmup_ratio * total), total)
    model.eval()
    at = state.restore(model, optimizer, schedule) if state is not None and state.exists() else Progress()

    def boundary(signals: StopSignals) -> None:
        """Every metric row of step ``at.step`` is logged: save when due or stopped, then stop if signalled."""
        due = s.save_every and at.step % s.save_every == 0
        if state is not None and (due or signals.signal is not None):
            state.save(model, optimizer, schedule, at)
        stop_if_signalled(signals, at.step, total, state)

    with StopSignals() as signals:
        for epoch in range(at.epoch, s.epochs):
            if at.step == total:
                break
            order = batch_order(len(train), s, epoch)
            for b in range(at.next, len(order), s.batch_size):  # at.next is 0 but in a resumed epoch
                batch = [train[i] for i in order[b:b + s.batch_size]]
                lr = schedule.get_last_lr()[0]  # this step's, read before the schedule moves on
                loss, grad_norm, tokens = sft_step(model, batch, pad, optimizer, s, bf16_autocast,
                                                   logprob_chunk_tokens)
                schedule.step()
                at.step, at.train_loss = at.step + 1, loss
                if log is not None:
                    log({"sft/loss": loss, "sft/grad_norm": grad_norm, "sft/lr": lr,
                         "sft/tokens": tokens, "sft/epoch": epoch}, at.step)
                ends_epoch = b + s.batch_size >= len(order) or at.step == total
                at.epoch, at.next = (epoch + 1, 0) if ends_epoch else (epoch, b + s.batch_size)
                if not (ends_epoch and val):  # else the epoch's held-out loss belongs to this step
                    boundary(signals)
                if at.step == total:
                    break
            if val:
                at.val_loss = evaluate_nll(model, val, pad, s.micro_batch_size, bf16_autocast, logprob_chunk_tokens)
                if log is not None:
                    log({"sft/val_loss": at.val_loss}, at.step)
                boundary(signals)
    return {"steps": at.step, "train_loss": at.train_loss, "val_loss": at.val_loss}


def written_examples(run_dir: Path) -> tuple[list[Example], list[Example]]:
    """The train and val examples a run wrote to ``run_dir/data``: what it trains on, fresh or resumed."""
    from tether.files import read_jsonl

    def read(name: str) -> list[Example]:
        path = run_dir / "data" / f"{name}.jsonl"
        if not path.read_text(encoding="utf-8").strip():
            return []
        return [row_example(row, path.parent) for row in read_jsonl(path, f"data/{name}.jsonl")]

    return read("train"), read("val")


class Encoded(NamedTuple):
    """A run's encoded examples (:func:`~tether.sft_data.encode_examples`) and how many were over
    ``sft.max_length``."""

    train: list[tuple[list[int], list[int]]]
    val: list[tuple[list[int], list[int]]]
    dropped: int


class SFTSession:
    """The steps every SFT command takes, in their order: ``tether sft`` (:func:`run_sft`) and ``tether seed-sft``
    (:func:`tether.recipes.seed_sft.run_skill_sft`) differ only in the examples each brings between them, so what one
    does at a step (the settings to the tracker's sinks, a line per optimiser step, the refusal of data nothing of
    fits, the summaries) the other does too.

    1. ``SFTSession(cfg, ...)``: :func:`~tether.start.start_run` (a missing GPU, then a bad config: before any model
       loads or the run directory is written);
    2. :meth:`open`: claim the run directory and write ``config.yaml`` (or say the run is finished);
    3. :meth:`load_policy`: the policy on its device, with ``model.chat_template``;
    4. :meth:`encode`: the examples the run wrote, encoded, and the resumable state over them;
    5. :meth:`train`: :func:`train_sft` under the tracker, ``run_dir/checkpoint``, the summaries.
    """

    def __init__(self, cfg: SFTRunConfig | SeedSFTRunConfig, *, policy: Any = None, tokenizer: Any = None) -> None:
        """``policy``/``tokenizer``: use these instead of loading ``cfg.model.name`` (tests)."""
        from tether.start import start_run

        self.cfg, self.policy, self.tokenizer = cfg, policy, tokenizer
        self.device = start_run(cfg, policy=policy is None)
        self.run_dir = Path(cfg.run_dir)
        self.begin = SFTStart("fresh")
        self.state: SFTState | None = None
        self.opened = 0.0  # when open() settled the run directory: the summary's wall_s counts from there

    @property
    def fresh(self) -> bool:
        """The run starts at step 0: its examples are still to be built."""
        return self.begin.action == "fresh"

    def open(self) -> dict[str, Any] | None:
        """Claim the run directory (:func:`~tether.recipes.sft_state.open_sft_run`: locked; resumes, refuses or says a
        finished run is finished) and write ``config.yaml`` and this start's ``provenance.json`` entry. Returns a
        finished run's summary, else None."""
        from tether.config import dump_config
        from tether.files import write_text_atomic
        from tether.provenance import record_provenance

        self.run_dir, self.begin = open_sft_run(self.cfg)
        if self.begin.action == "finished":
            return self.begin.summary
        (self.run_dir / "data").mkdir(exist_ok=True)
        write_text_atomic(self.run_dir / "config.yaml", dump_config(self.cfg))
        record_provenance(self.run_dir, self.begin.step)  # as train's run directories: one entry per start or resume
        self.opened = time.perf_counter()
        return None

    def load_policy(self) -> None:
        """``model.name`` (unless the policy was given), with ``model.chat_template`` applied (the prompts RL will
        give; saved with the checkpoint), on the run's device."""
        from tether.models import load_policy
        from tether.models.chat_template import apply_chat_template
        from tether.models.policy import model_load_errors
        from tether.track.progress import status

        if self.policy is None:
            status(f"loading the policy {self.cfg.model.name}")
            with model_load_errors("model.name", self.cfg.model.name):
                self.policy, self.tokenizer = load_policy(self.cfg.model.name)
        apply_chat_template(self.tokenizer, self.cfg.model.chat_template)
        self.policy.to(self.device)

    def encode(self, train: list[Example], val: list[Example], prompt_tokens: int | None = None) -> Encoded:
        """``train`` and ``val`` encoded (:func:`~tether.sft_data.encode_examples`, ``prompt_tokens`` as there), and
        :attr:`state`, the run's resumable state over the files its examples were read from.

        Raises:
            ConfigError: no training example fits ``sft.max_length`` (the loop would train 0 steps and save the
                policy it was given).
        """
        from tether.config import ConfigError

        s = self.cfg.sft
        train_ids, dropped_train = encode_examples(train, self.tokenizer, s.max_length, prompt_tokens)
        val_ids, dropped_val = encode_examples(val, self.tokenizer, s.max_length, prompt_tokens)
        if not train_ids:
            raise ConfigError(f"sft: no training example fits sft.max_length={s.max_length}")
        # A resume's fingerprint was made when the start was chosen (a resume writes no example file); a fresh run's
        # files are written since.
        run = self.begin.fingerprint or fingerprint(self.cfg, {**data_files(self.run_dir), **state_files(self.cfg)})
        self.state = SFTState(self.run_dir / STATE, run, config_defaults(self.cfg),
                              verified=self.begin.action == "resume")
        return Encoded(train_ids, val_ids, dropped_train + dropped_val)

    def train(self, data: Encoded, summarize: Callable[[dict[str, float]], dict[str, Any]]) -> dict[str, Any]:
        """:func:`train_sft` on ``data`` (resumed from :attr:`state` where saved), logged by the tracker the config's
        ``logging`` names (which is handed the settings first), with a line per step under ``logging.progress``;
        then ``run_dir/checkpoint`` and the summary: ``checkpoint``, what ``summarize(losses)`` gives (the
        command's counts) and ``wall_s`` (the seconds since :meth:`open`: the policy's load, a fresh run's examples
        or rollouts, the training, the checkpoint, the command's own summary numbers; a resume counts its own), in
        the tracker's ``summary.json`` and ``sft_summary.json``. Returns the summary."""
        from tether.start import run_tracker
        from tether.track.progress import status

        cfg, s = self.cfg, self.cfg.sft
        assert self.state is not None, "encode() builds the state the loop resumes from"
        with run_tracker(cfg.logging, self.run_dir, self.begin.step) as tracker:
            tracker.log_config(cfg.model_dump(mode="json"))
            status(f"training on {len(data.train)} examples ({len(data.val)} held out) for {s.epochs} epoch(s)")
            log = progress_log(tracker.log, sft_steps(len(data.train), s), self.begin.step) if cfg.logging.progress \
                else tracker.log
            losses = train_sft(self.policy, self.tokenizer, data.train, data.val, s, log=log,
                               bf16_autocast=cfg.model.bf16_autocast,
                               logprob_chunk_tokens=cfg.train.logprob_chunk_tokens, state=self.state)
            checkpoint = self.run_dir / "checkpoint"
            self.policy.save_pretrained(checkpoint)
            self.tokenizer.save_pretrained(checkpoint)
            summary = {"checkpoint": str(checkpoint), **summarize(losses)}
            summary["wall_s"] = round(time.perf_counter() - self.opened, 1)
            tracker.write_summary(summary)
        return write_summary(self.run_dir, summary, self.state)


def run_sft(cfg: SFTRunConfig, *, policy: Any = None, tokenizer: Any = None) -> dict[str, Any]:
    """``tether sft``: examples, split, SFT, ``run_dir/checkpoint`` (:class:`SFTSession`); the data are read, and
    where the run starts is settled, before any model loads.

    Returns:
        The summary also written to ``run_dir/sft_summary.json`` (a finished run's, when there was nothing to do).
    """
    from tether.splits import split_train_val
    from tether.track.progress import status

    s = cfg.sft
    session = SFTSession(cfg, policy=policy, tokenizer=tokenizer)
    if (finished := session.open()) is not None:
        return finished
    if session.fresh:
        status(f"building the sft examples (sft.data={s.data})")
        # split by prompt: rejection data hold several answers per prompt, and split row by row nearly every
        # held-out example had its prompt trained on
        train_ex, val_ex = split_train_val(sft_examples(cfg, session.device), s.val_fraction, s.data_seed,
                                           key=prompt_key)
        for name, part in (("train", train_ex), ("val", val_ex)):  # the exact pairs, e.g. to replay them later
            write_examples(session.run_dir / "data" / f"{name}.jsonl", part)
    train_ex, val_ex = written_examples(session.run_dir)
    session.load_policy()
    data = session.encode(train_ex, val_ex)

    def summarize(losses: dict[str, float]) -> dict[str, Any]:
        return {"data": s.data, "train_examples": len(data.train), "val_examples": len(data.val),
                "dropped_too_long": data.dropped,
                "example": {"prompt": train_ex[0].prompt, "response": train_ex[0].response}, **losses}

    return session.train(data, summarize)
