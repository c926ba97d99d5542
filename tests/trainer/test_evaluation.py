"""``tether eval`` of a checkpoint reproduces the run's own validation at that step, exactly (one seed formula)."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest
import torch

from tests.engine.test_rollout_dtype import cast_equal
from tests.rollout.helpers import agent_config
from tests.trainer.helpers import tiny_config
from tether.checks import check_config
from tether.config import ConfigError
from tether.engine import registry
from tether.seeding import step_seed
from tether.trainer import Trainer, evaluate
from tether.trainer.evaluation import checkpoint_step

RUN = ["val.every=1", "train.steps=2", "train.save_every=1", "train.keep_last=2", "val.samples=2"]


def logged_validation(run_dir: Path) -> dict[int, dict[str, float]]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {row["step"]: {k: v for k, v in row.items() if k.startswith("val/")} for row in rows
            if any(k.startswith("val/") for k in row)}


@pytest.mark.parametrize("kind", ["task", "env"])
def test_eval_of_each_checkpoint_reproduces_the_logged_validation(tmp_path, tiny_policy, kind):
    make = tiny_config if kind == "task" else agent_config
    cfg = make(tmp_path, *RUN, "env.val_tasks=2") if kind == "env" else make(tmp_path, *RUN)
    model, tok = tiny_policy
    Trainer(cfg, policy=model, tokenizer=tok).fit()
    logged = logged_validation(Path(cfg.run_dir))
    assert sorted(logged) == [0, 1, 2]
    checkpoints = Path(cfg.run_dir) / "checkpoints"
    for path, step in ((checkpoints / "step_000001", 1), (checkpoints / "step_000002", 2),
                       (checkpoints / "best", None)):
        step = checkpoint_step(path) if step is None else step  # best: the step of the validation peak
        assert checkpoint_step(path) == step
        overrides = [*RUN, f"model.name={path}", "train.resume=false", f"run_dir={tmp_path / 'eval'}"]
        again = make(tmp_path, *overrides, "env.val_tasks=2") if kind == "env" else make(tmp_path, *overrides)
        assert evaluate(again) == logged[step]  # every value, bit for bit


def test_a_model_no_run_saved_is_evaluated_as_at_step_0(tmp_path):
    assert checkpoint_step(tmp_path) == 0
    assert step_seed(0, 0, "val") != step_seed(0, 1, "val")  # so the step decides which samples eval draws


def test_eval_samples_in_the_runs_rollout_dtype(tmp_path, tiny_policy, monkeypatch):
    """The run validates with its engine, which samples in rollout.dtype; eval built its engine without it, so it
    sampled in the checkpoint's float32: measured, a run with rollout.dtype=bfloat16 logged val/avg@k 0.5 (pass@k
    0.75) at step 1 and eval of checkpoints/step_000001 gave 0.625 (1.0)."""
    model, tok = tiny_policy
    model.save_pretrained(tmp_path / "model")
    tok.save_pretrained(tmp_path / "model")
    built = []
    real = registry.engine_builder

    def recording(name):
        builder = real(name)

        @functools.wraps(builder)  # its signature still says which settings it takes
        def build(*args, **settings):
            built.append((settings.get("dtype"), builder(*args, **settings)))
            return built[-1][1]
        return build

    monkeypatch.setattr(registry, "engine_builder", recording)
    evaluate(tiny_config(tmp_path, "rollout.dtype=bfloat16", "rollout.correction.mode=tis",
                         f"model.name={tmp_path / 'model'}", "val.samples=2"))
    [(dtype, engine)] = built
    assert dtype == "bfloat16"
    assert cast_equal(engine.model, model, torch.bfloat16)  # it samples from the checkpoint cast to bfloat16


def test_eval_warns_about_what_it_samples_and_not_about_training_settings(tmp_path, tiny_policy, capsys):
    """tether eval of a run's config repeated the run's training-only warnings (measured: "optim.micro_batch_size=32
    exceeds the 8 rows of a mini-batch ... changes nothing"), though eval makes no update; a warning about how it
    samples (rollout.dtype on the CPU) is still its own."""
    model, tok = tiny_policy
    model.save_pretrained(tmp_path / "model")
    tok.save_pretrained(tmp_path / "model")
    training = ["optim.micro_batch_size=12", "optim.mini_batches=100", "optim.lr=0.5"]  # a step has 8 rows
    cfg = tiny_config(tmp_path, *training, "rollout.dtype=float16", "rollout.correction.mode=tis",
                      "train.device=cpu", f"model.name={tmp_path / 'model'}", "val.samples=1")
    capsys.readouterr()
    evaluate(cfg)
    warned = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning: ")]
    assert [line.split("=")[0] for line in warned] == ["warning: rollout.dtype"]
    assert {line.split("=")[0] for line in check_config(cfg, policy=False)} >= {
        "rollout.dtype", "optim.micro_batch_size", "optim.mini_batches", "optim.lr"}  # what tether train warns



@pytest.mark.parametrize("moved", [["model.ref_name=./gone/reference"],
                                   ["algorithm.policy_loss=eapo", "methods.eapo.prior=./gone/prior"]])
def test_eval_loads_and_checks_the_policy_alone(tmp_path, tiny_policy, capsys, moved):
    """tether eval samples with the policy alone, yet checked every model the run loads: a run whose reference or
    EAPO prior had moved could not have its checkpoint evaluated ("methods.eapo.prior: './gone/prior' is not a
    directory here ..."), and the methods' own warnings about training were repeated. tether train still refuses."""
    model, tok = tiny_policy
    model.save_pretrained(tmp_path / "model")
    tok.save_pretrained(tmp_path / "model")
    cfg = tiny_config(tmp_path, *moved, "train.device=cpu", f"model.name={tmp_path / 'model'}", "val.samples=1")
    key = moved[-1].split("=")[0]
    with pytest.raises(ConfigError, match=f"^{key}: './gone/"):
        check_config(cfg)
    capsys.readouterr()
    result = evaluate(cfg)
    assert 0.0 <= result["val/avg@k"] <= 1.0
    assert not [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning: methods")]


def test_eval_of_a_lora_runs_checkpoint_checks_the_targets_against_its_base(tmp_path, tiny_policy):
    """The LoRA target check read the checkpoint's adapter folder as a model's config: `tether eval` (and validate)
    of any LoRA run's checkpoint stopped with a traceback ("Unrecognized model in .../checkpoints/best")."""
    lora = ["model.lora.rank=4", "model.lora.alpha=8", "model.name=tiny-64x2"]
    model, tok = tiny_policy
    Trainer(tiny_config(tmp_path, *lora, *RUN), policy=model, tokenizer=tok).fit()
    best = tmp_path / "run" / "checkpoints" / "best"
    again = tiny_config(tmp_path, *lora, *RUN, f"model.name={best}", "train.resume=false", f"run_dir={tmp_path / 'e'}")
    assert check_config(again) == []
    wrong = tiny_config(tmp_path, *lora, *RUN, f"model.name={best}", "model.lora.target_modules=[c_attn]",
                        f"run_dir={tmp_path / 'e'}")
    with pytest.raises(ConfigError, match=r"c_attn name no linear layer of .*best; its linear layers end in: "):
        check_config(wrong)
    assert 0.0 <= evaluate(again)["val/avg@k"] <= 1.0
