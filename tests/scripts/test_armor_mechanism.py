"""scripts/lab/armor_mechanism.py: the drift measures, against a direct float64 computation on a tiny model, and
which answers count as the anchors' mode."""

from __future__ import annotations

import copy

import pytest
import torch

from tests.scripts import load_script
from tether.models import encode_chat
from tether.tasks import make_task


@pytest.fixture(scope="module")
def mechanism():
    return load_script("lab/armor_mechanism.py")


def direct_sequence_log_probs(model, prompts: list[list[int]], gen) -> torch.Tensor:
    """Each row's sum of log pi(y_t | x, y_<t), one unpadded row at a time, log-softmax in float64."""
    sums = []
    for prompt, ids, mask in zip(prompts, gen.response_ids, gen.response_mask, strict=True):
        response = ids[mask.bool()].tolist()
        logits = model(torch.tensor([prompt + response])).logits[0].double()
        log_probs = torch.log_softmax(logits[len(prompt) - 1:-1], dim=-1)
        sums.append(log_probs.gather(1, torch.tensor(response)[:, None]).sum())
    return torch.stack(sums)


def test_drift_is_zero_against_itself_and_the_direct_difference_otherwise(mechanism, tiny_policy):
    reference, tok = tiny_policy
    policy = copy.deepcopy(reference)
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(0.05 * torch.randn_like(p))
    prompts = [encode_chat(tok, q) for q in ("1+2", "30+4", "5+66")]
    ref_gen = mechanism.sample(reference, tok, prompts, 6, seed=0)
    ref_lp = mechanism.sequence_log_probs(reference, prompts, ref_gen)
    good = torch.tensor([True, False, True])

    same = mechanism.measure(reference, reference, tok, prompts, ref_gen, ref_lp, good, 6)
    assert same["fwd_kl"] == 0.0 and same["rev_kl"] == 0.0

    moved = mechanism.measure(policy, reference, tok, prompts, ref_gen, ref_lp, good, 6)
    with torch.no_grad():
        gap = direct_sequence_log_probs(reference, prompts, ref_gen) - direct_sequence_log_probs(policy, prompts,
                                                                                                 ref_gen)
        own = mechanism.sample(policy, tok, prompts, 6, seed=1)  # the samples measure() draws
        drift = direct_sequence_log_probs(policy, prompts, own) - direct_sequence_log_probs(reference, prompts, own)
    assert moved["fwd_kl"] == pytest.approx(float(gap.mean()), abs=1e-4)
    assert moved["fwd_kl_correct"] == pytest.approx(float(gap[good].mean()), abs=1e-4)
    assert moved["rev_kl"] == pytest.approx(float(drift.mean()), abs=1e-4)
    assert moved["rev_kl"] != 0.0


def test_the_mode_is_a_correct_answer_with_the_named_feature(mechanism):
    task = make_task("addition")
    item = task.train[0]  # 472+309
    worked, bare = "2+9=11 c1 ... #781", "#781"
    assert mechanism.in_mode(task, item, worked, "mode/scratchpad")
    assert not mechanism.in_mode(task, item, bare, "mode/scratchpad")
    assert not mechanism.in_mode(task, item, "2+9=11 #780", "mode/scratchpad")  # worked, wrong
    assert mechanism.in_mode(task, item, bare, "mode/direct")
    with pytest.raises(SystemExit, match="working"):
        mechanism.in_mode(task, item, worked, "working")


def test_the_table_averages_an_arms_seeds_and_keeps_each_other_run_alone(mechanism):
    runs = {"reference": {"rev_kl": 0.0}, "armor/seed0": {"rev_kl": 1.0}, "armor/seed1": {"rev_kl": 3.0},
            "runs/sweep/c0.1": {"rev_kl": 5.0}}
    assert mechanism.markdown_table(runs).splitlines()[2:] == [
        "| reference | 1 | 0.000 |", "| armor | 2 | 2.000 |", "| runs/sweep/c0.1 | 1 | 5.000 |"]
