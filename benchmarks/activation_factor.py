"""Measure the activation factor behind ``train.gradient_checkpointing: auto``: bytes autograd keeps for backward.

    .venv/bin/python benchmarks/activation_factor.py            # SmolLM2-135M-Instruct, float32

Runs the training forward (:func:`tether.models.forward.response_log_probs`, padded rows, autograd on) of the
model on two micro-batches of the same width and different row counts, and sums the bytes of every distinct
storage autograd saves for backward (``torch.autograd.graph.saved_tensors_hooks``), parameters excluded. The
difference between the two, divided by the extra tokens, the decoder layers, the hidden size and the element
size, is :data:`tether.models.layers.ACTIVATION_FACTOR`: what one token keeps per layer, in hidden-size vectors.
Differencing removes what does not grow with the rows (the LM head's checkpointed chunks keep only their inputs).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

import torch

from tether.models.forward import response_log_probs


def saved_activation_bytes(run: Callable[[], torch.Tensor], params: Any) -> int:
    """Bytes of the distinct storages autograd saves while ``run()`` builds its graph, parameters excluded.

    Saved tensors are often views of one storage (a transposed weight, a slice of the fused QKV), so each storage
    counts once, whole.
    """
    param_ptrs = {p.untyped_storage().data_ptr() for p in params}
    storages: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in param_ptrs:
            storages[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = run()
    del out
    return sum(storages.values())


def micro_batch_bytes(model: Any, rows: int, prompt_len: int, response_len: int) -> int:
    """Saved bytes of one training forward over ``rows`` rows of ``prompt_len + response_len`` tokens."""
    prompts = [[(7 * r + i) % 1000 + 10 for i in range(prompt_len)] for r in range(rows)]  # all distinct
    response = torch.randint(10, 1000, (rows, response_len), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(rows, response_len)

    def run() -> torch.Tensor:
        return response_log_probs(model, prompts, response, mask, pack=False)[0].sum()

    return saved_activation_bytes(run, model.parameters())


def measure(model: Any, rows: tuple[int, int] = (2, 4), prompt_len: int = 32, response_len: int = 96) -> float:
    """The activation factor of ``model``: saved bytes per token, decoder layer, hidden unit and parameter byte."""
    small, large = (micro_batch_bytes(model, n, prompt_len, response_len) for n in rows)
    tokens = (rows[1] - rows[0]) * (prompt_len + response_len)
    c = model.config
    element = next(model.parameters()).element_size()
    return (large - small) / (tokens * c.num_hidden_layers * c.hidden_size * element)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="a model directory (default: tether's SmolLM2-135M-Instruct)")
    args = p.parse_args(argv)
    from tether.models import load_policy, smollm2_dir

    model, _ = load_policy(args.model or str(smollm2_dir()), dtype=torch.float32)
    model.eval()
    c = model.config
    factor = measure(model)
    print(f"{c.model_type}: {c.num_hidden_layers} layers, hidden {c.hidden_size}, intermediate "
          f"{c.intermediate_size}, {c.num_attention_heads} heads ({c.num_key_value_heads} KV), "
          f"attention {c._attn_implementation}\nactivation factor {factor:.2f} hidden-size vectors per token and layer "
          f"= {factor * c.hidden_size * c.num_hidden_layers * 4 / 2**20:.3f} MiB per token in float32")


if __name__ == "__main__":
    main()
