"""``tether sft``: the one SFT loop, its data sources and its checks (tether/recipes/sft.py)."""

from __future__ import annotations

import json

import pytest
import torch

import tether.models
from tether.config import ConfigError, load_command_config
from tether.models import load_policy
from tether.recipes.sft import nll_sum, run_sft, sft_examples
from tether.sft_data import prompt_key
from tether.splits import split_train_val
from tether.tasks import make_task


@pytest.fixture(autouse=True)
def char_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TETHER_CACHE", str(tmp_path / "cache"))


def sft_config(tmp_path, sft: dict, task: dict | None = None, **extra):
    data = {"run_dir": str(tmp_path / "sft"), "model": {"name": "char-64x1"},
            "task": task or {"name": "addition", "kwargs": {"digits": 2, "train_size": 8, "val_size": 8,
                                                           "report_size": 8, "sft_size": 64}},
            "logging": {"tensorboard": False}, "train": {"device": "cpu"},
            "sft": {"batch_size": 16, "micro_batch_size": 8, "lr": 3e-3, "epochs": 2, **sft}, **extra}
    return load_command_config("sft", data=data)


def test_task_demonstrations_train_and_save_a_loadable_checkpoint(tmp_path):
    cfg = sft_config(tmp_path, {"data": "task", "val_fraction": 0.25})
    before, _ = load_policy("char-64x1")
    summary = run_sft(cfg)
    assert summary["train_examples"] == 48 and summary["val_examples"] == 16 and summary["steps"] == 6
    rows = [json.loads(line) for line in (tmp_path / "sft" / "metrics.jsonl").read_text().splitlines()]
    losses = [r["sft/loss"] for r in rows if "sft/loss" in r]
    assert len(losses) == 6 and losses[-1] < losses[0]
    assert any("sft/val_loss" in r for r in rows)
    after, _ = load_policy(summary["checkpoint"])
    assert any(not torch.equal(a, b) for a, b in zip(before.state_dict().values(), after.state_dict().values(),
                                                     strict=True))
    written = [json.loads(line) for line in (tmp_path / "sft" / "data" / "train.jsonl").read_text().splitlines()]
    assert len(written) == 48 and set(written[0]) == {"prompt", "response"}
    assert summary["example"]["response"].endswith("#" + str(eval(summary["example"]["prompt"])))


def test_the_sft_loss_applies_the_head_in_the_configs_chunks(tmp_path, monkeypatch):
    """train.logprob_chunk_tokens bounds the [chunk, vocabulary] logits of the SFT loss and held-out loss, as of
    every RL forward; they used to take the default 1,024 tokens whatever the config said."""
    chunks, real = [], tether.models.response_log_probs
    monkeypatch.setattr(tether.models, "response_log_probs",
                        lambda *a, **k: chunks.append(k.get("chunk_size", "default")) or real(*a, **k))
    cfg = sft_config(tmp_path, {"data": "task", "max_steps": 1, "val_fraction": 0.25},
                     train={"device": "cpu", "logprob_chunk_tokens": 7})
    run_sft(cfg)
    assert len(chunks) >= 3 and set(chunks) == {7}  # two micro-batches of the step, then the held-out loss
    model, tok = load_policy("char-64x1")
    examples = [(tok.encode("12+34="), tok.encode("#46")), (tok.encode("7+8="), tok.encode("#15 and so on"))]
    torch.testing.assert_close(nll_sum(model, examples, 0, chunk_tokens=2), nll_sum(model, examples, 0, 10**6),
                               rtol=1e-6, atol=0)


def test_task_examples_come_from_the_sft_split_only(tmp_path):
    cfg = sft_config(tmp_path, {"data": "task", "examples": 10})
    task = make_task(cfg.task.name, **cfg.task.kwargs)
    examples = sft_examples(cfg)
    held = {i.prompt for i in [*task.train, *task.val, *task.splits["report"]]}
    assert len(examples) == 10 and not {e.prompt for e in examples} & held


def test_a_warm_start_is_reproducible_bit_for_bit(tmp_path, monkeypatch):
    """The same SFT config gives the same weights, from a model built afresh in another cache: the earlier
    ARMOR study's two warm starts from the same commands differed (docs/methods/armor.md)."""
    weights = []
    for run in ("a", "b"):
        monkeypatch.setenv("TETHER_CACHE", str(tmp_path / f"cache_{run}"))
        cfg = sft_config(tmp_path / run, {"data": "task", "max_steps": 3, "val_fraction": 0.0})
        weights.append(load_policy(run_sft(cfg)["checkpoint"])[0].state_dict())
    assert weights[0].keys() == weights[1].keys()
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])
    moved, _ = load_policy("char-64x1")  # the freshly built base: training changed it
    assert any(not torch.equal(moved.state_dict()[k], weights[0][k]) for k in weights[0])


def test_max_steps_stops_early_and_the_summary_counts_them_as_an_int(tmp_path):
    """The summary (what tether sft prints, and sft_summary.json) said "steps": 2.0, a float for a count."""
    summary = run_sft(sft_config(tmp_path, {"data": "task", "max_steps": 2, "val_fraction": 0.0}))
    assert summary["steps"] == 2 and type(summary["steps"]) is int and summary["val_examples"] == 0
    assert '"steps": 2,' in (tmp_path / "sft" / "sft_summary.json").read_text()


def strict_json(text: str):
    """``json.loads`` refusing ``NaN`` and ``Infinity``, which are not JSON (``jq`` and most parsers refuse them)."""
    def refuse(constant: str):
        raise ValueError(f"{constant} is not JSON")

    return json.loads(text, parse_constant=refuse)


def test_the_summaries_of_a_run_without_held_out_examples_are_strict_json(tmp_path):
    """With sft.val_fraction=0 there is no held-out loss: summary.json, sft_summary.json and what `tether sft`
    prints said "val_loss": NaN (configs/lab/eapo/base_sft.yaml, docs/metrics.md promises strict JSON)."""
    summary = run_sft(sft_config(tmp_path, {"data": "task", "max_steps": 1, "val_fraction": 0.0}))
    assert summary["val_loss"] is None and summary["train_loss"] > 0
    for name in ("summary.json", "sft_summary.json"):
        assert strict_json((tmp_path / "sft" / name).read_text()) == summary
    assert run_sft(sft_config(tmp_path, {"data": "task", "max_steps": 1, "val_fraction": 0.0})) == summary  # finished


def test_jsonl_data_and_its_errors(tmp_path):
    path = tmp_path / "pairs.jsonl"
    path.write_text('{"prompt": "1+1", "response": "#2"}\n\n{"prompt": "2+2", "response": "#4", "system": "s"}\n')
    cfg = sft_config(tmp_path, {"data": "jsonl", "path": str(path)})
    examples = sft_examples(cfg)
    assert [(e.prompt, e.response, e.system) for e in examples] == [("1+1", "#2", None), ("2+2", "#4", "s")]
    path.write_text('{"prompt": "1+1", "response": "#2"}\n{"prompt": "x"}\n')
    with pytest.raises(ConfigError, match=r"sft.path: .*pairs.jsonl line 2 has no 'response' field"):
        sft_examples(cfg)
    path.write_text('{"prompt": "1+1", "response": 2}\n')
    with pytest.raises(ConfigError, match=r"pairs.jsonl row 1: 'prompt' and 'response' must be strings"):
        sft_examples(cfg)
    path.write_text('{"prompt": \n')
    with pytest.raises(ConfigError, match=r"pairs.jsonl line 1 is not JSON"):
        sft_examples(cfg)
    with pytest.raises(ConfigError, match="no file"):
        sft_examples(sft_config(tmp_path, {"data": "jsonl", "path": str(tmp_path / "missing.jsonl")}))


def test_no_held_out_example_shares_its_prompt_with_a_training_one(tmp_path):
    """Rejection sampling gives several answers per prompt: split row by row, the held-out loss was mostly on
    prompts trained on."""
    path = tmp_path / "pairs.jsonl"
    pairs = [{"prompt": f"{a}+{a}", "response": f"#{a + a}"} for a in range(10) for _ in range(4)]
    path.write_text("".join(json.dumps(pair) + "\n" for pair in pairs))
    run_sft(sft_config(tmp_path, {"data": "jsonl", "path": str(path), "val_fraction": 0.2, "max_steps": 1}))
    written = {name: [json.loads(line)["prompt"] for line in (tmp_path / "sft" / "data" / f"{name}.jsonl")
                      .read_text().splitlines()] for name in ("train", "val")}
    assert len(written["train"]) + len(written["val"]) == 40 and written["val"]
    assert not set(written["val"]) & set(written["train"])


def test_solver_examples_of_a_visual_env_carry_the_frames_they_show(tmp_path):
    """A visual env's solver states were written as text: no images, literal placeholders, and the history's
    observations as ``Observation('<image>', 1 image(s))``."""
    from tether.envs import make_env

    cfg = load_command_config("sft", data={
        "run_dir": str(tmp_path / "sft"), "model": {"name": "tiny-qwen2.5-vl"}, "train": {"device": "cpu"},
        "env": {"name": "sokoban_visual", "max_turns": 3, "history": 1},
        "sft": {"data": "solver", "examples": 1, "explore": 0.0}})
    examples = sft_examples(cfg)
    env = make_env("sokoban_visual")  # the same seed played directly: the frames of the states shown
    frames = [env.reset(env.train_seeds(1)[0]).observation.images[0]]
    for example in examples[:-1]:
        frames.append(env.step(example.response.removeprefix("<action>").removesuffix("</action>"))
                      .observation.images[0])
    assert len(examples) >= 2
    for k, example in enumerate(examples):
        shown = frames[max(k - 1, 0):k + 1]  # history 1: the previous state's frame, then the current one
        assert [image.tobytes() for image in example.images] == [image.tobytes() for image in shown]
        assert example.prompt.count("<image>") == len(shown) and "Observation(" not in example.prompt


def test_model_chat_template_renders_the_sft_prompts_and_goes_with_the_checkpoint(tmp_path, monkeypatch):
    """``model.chat_template`` was read by ``tether train`` only: SFT trained on the tokenizer's own template and
    saved it, so RL from the warm start (with the same config) sampled prompts SFT never showed."""
    import tether.recipes.sft as sft_module

    template = "{% for m in messages %}Q:{{ m['content'] }}\n{% endfor %}{% if add_generation_prompt %}A:{% endif %}"
    (tmp_path / "t.jinja").write_text(template)
    path = tmp_path / "pairs.jsonl"
    path.write_text('{"prompt": "1+1", "response": "#2"}\n{"prompt": "2+3", "response": "#5"}\n')
    seen = []
    real = sft_module.train_sft
    monkeypatch.setattr(sft_module, "train_sft", lambda model, tok, train, *a, **k: seen.extend(train)
                        or real(model, tok, train, *a, **k))
    cfg = sft_config(tmp_path, {"data": "jsonl", "path": str(path), "val_fraction": 0.0, "max_steps": 1},
                     model={"name": "char-64x1", "chat_template": str(tmp_path / "t.jinja")})
    summary = run_sft(cfg)
    _, base = load_policy("char-64x1")
    expected = {tuple(base(f"Q:{prompt}\nA:", add_special_tokens=False).input_ids) for prompt in ("1+1", "2+3")}
    assert {tuple(prompt) for prompt, _ in seen} == expected
    assert load_policy(summary["checkpoint"])[1].chat_template == template


@pytest.mark.parametrize("conversational", [False, True])
def test_task_examples_never_come_from_any_split_of_the_task(tmp_path, conversational):
    """The report split (the endpoint's) too: a demonstration of a report question gives its answer away."""
    path = tmp_path / "data.jsonl"
    rows = [{"prompt": [{"role": "user", "content": f"{i}+1"}] if conversational else f"{i}+1", "answer": str(i + 1)}
            for i in range(400)]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    kwargs = {"path": str(path), "val_size": 20, "report_size": 50, "train_size": 50}
    cfg = sft_config(tmp_path, {"data": "task", "examples": 100, "response": "<answer>{answer}</answer>"},
                     task={"name": "dataset", "kwargs": kwargs})
    examples = sft_examples(cfg)
    task = make_task("dataset", **kwargs)
    held = [json.dumps(item.prompt) for split in ("train", "val", "report") for item in task.splits[split]]
    assert len(examples) == 100 and not {json.dumps(e.prompt) for e in examples} & set(held)
    train, val = split_train_val(examples, 0.1, 0, key=prompt_key)
    assert len(train) + len(val) == 100


@pytest.mark.parametrize("task_name", ["jsonl", "dataset"])
def test_task_examples_write_the_first_accepted_answer_of_a_list_gold(tmp_path, task_name):
    """A list gold is a set of accepted answers: a demonstration answers with the first (it wrote the list's Python
    repr, ``<answer>['2', 'n2']</answer>``); a number gold is its text, and an empty list gives no demonstration."""
    path = tmp_path / "data.jsonl"
    golds = {f"{i}+1": [str(i + 1), f"n{i + 1}"] if i % 3 == 0 else [] if i % 3 == 1 else i + 1 for i in range(300)}
    path.write_text("".join(json.dumps({"prompt": prompt, "answer": gold}) + "\n" for prompt, gold in golds.items()))
    cfg = sft_config(tmp_path, {"data": "task", "examples": 40, "response": "<answer>{answer}</answer>"},
                     task={"name": task_name, "kwargs": {"path": str(path), "val_size": 20, "train_size": 50}})
    examples = sft_examples(cfg)
    questions = [e.prompt.split("\n", 1)[0] for e in examples]  # the jsonl template puts the question first
    assert len(examples) == 40 and all(golds[q] != [] for q in questions)
    want = [f"<answer>{golds[q][0] if isinstance(golds[q], list) else golds[q]}</answer>" for q in questions]
    assert [e.response for e in examples] == want
    assert {isinstance(golds[q], list) for q in questions} == {True, False}  # both kinds of gold were written


def test_rejection_keeps_only_the_samplers_correct_answers(tmp_path):
    cfg = sft_config(tmp_path, {"data": "rejection", "sampler": "char-64x1", "samples_per_prompt": 4},
                     task={"name": "parity", "kwargs": {"train_size": 6}}, rollout={"max_new_tokens": 5})
    examples = sft_examples(cfg)
    task = make_task("parity", train_size=6)
    assert 0 < len(examples) < 24  # a random model's response lengths are even about half the time
    assert all(task.score(task.train[0], e.response).correct for e in examples)


def test_rejection_keeps_what_the_tasks_rewards_judge_correct_as_train_does(tmp_path):
    """With ``task.rewards`` and ``task.score: false`` a row without a gold answer is correct when its reward is
    positive (the task ``tether train`` builds); rejection sampling judged by the bare task's score instead, and kept
    parity's even-length samples whatever the rewards said."""
    def examples(fn: str, weight: float) -> list:
        task = {"name": "parity", "kwargs": {"train_size": 6}, "score": False,
                "rewards": [{"fn": f"tests.rewards.user_rewards:{fn}", "weight": weight}]}
        return sft_examples(sft_config(tmp_path, {"data": "rejection", "sampler": "char-64x1",
                                                  "samples_per_prompt": 4}, task=task, rollout={"max_new_tokens": 5}))

    every = examples("scaled", 1.0)  # reward 1 on every row: every sample is kept
    assert len(every) == 6 * 4 and {len(e.response) % 2 for e in every} == {0, 1}
    # the same seeded samples, rewarded by their length: the non-empty ones, odd lengths included
    assert examples("length_reward", 1.0) == [e for e in every if e.response]
    with pytest.raises(ConfigError, match="answered none of 24 samples correctly"):
        examples("length_reward", -1.0)  # no reward is positive


@pytest.mark.parametrize(("sft", "match"), [
    ({"data": "jsonl"}, "sft.path is the file of data=jsonl"),
    ({"data": "task", "sampler": "x"}, "sft.sampler is the model of data=rejection"),
    ({"data": "task", "lr": -1}, "sft.lr"),
])
def test_bad_sft_settings_stop_before_any_work(tmp_path, sft, match):
    with pytest.raises(ConfigError, match=match):
        sft_config(tmp_path, sft)
    assert not (tmp_path / "sft").exists()


def test_solver_data_needs_an_env(tmp_path):
    with pytest.raises(ConfigError, match="needs env"):
        sft_examples(sft_config(tmp_path, {"data": "solver"}))


def test_sft_lr_is_the_rate_each_step_used(tmp_path):
    # HF's cosine with warm-up over 6 steps, 2 of them warm-up: step s (from 0) trains at lr x s / 2, then
    # lr x (1 + cos(pi (s - 2) / 4)) / 2
    import math

    run_sft(sft_config(tmp_path, {"data": "task", "val_fraction": 0.25, "warmup_ratio": 2 / 6}))
    rows = [json.loads(line) for line in (tmp_path / "sft" / "metrics.jsonl").read_text().splitlines()]
    want = [3e-3 * s / 2 for s in range(2)] + [3e-3 * (1 + math.cos(math.pi * (s - 2) / 4)) / 2 for s in range(2, 6)]
    assert [r["sft/lr"] for r in rows if "sft/lr" in r] == pytest.approx(want, rel=1e-9, abs=1e-15)
